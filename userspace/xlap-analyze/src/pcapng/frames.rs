//! The frames the export writes: Ethernet, IPv4 or IPv6 and UDP headers
//! synthesized from a packet's flow. No payload was recorded (the tracer
//! keeps seq and kind, never the datagram), so a frame is its headers
//! alone, cut at them as a capture with a snap length is: the IP and UDP
//! lengths are the datagram's (its payload bytes as the stamps say), and
//! the packet block's original length says what the file left out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Made-up, locally administered MAC addresses: the tracer never sees the
/// link layer's. 02:00:00:00:00:01 sends, ...:02 receives.
const SENDER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const RECEIVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const UDP: u8 = 17;
const UDP_HEADER: u16 = 8;
/// TTL / hop limit: any value; 64 is Linux's default.
const TTL: u8 = 64;

/// A packet's addresses as the packets table gives them (text, null
/// where the capture could not note them: a collided flow key).
pub struct Flow<'a> {
    pub src_addr: Option<&'a str>,
    pub dst_addr: Option<&'a str>,
    pub src_port: u16,
    pub dst_port: u16,
}

/// The two addresses of a frame in one family: IPv4 when both are IPv4
/// (or unknown: 0.0.0.0), else IPv6 (an IPv4 one mapped, ::ffff:a.b.c.d).
fn addresses(flow: &Flow) -> (IpAddr, IpAddr) {
    let parse = |a: Option<&str>| a.and_then(|a| a.trim().parse::<IpAddr>().ok());
    match (parse(flow.src_addr), parse(flow.dst_addr)) {
        (Some(IpAddr::V6(s)), d) => (IpAddr::V6(s), IpAddr::V6(v6(d))),
        (s, Some(IpAddr::V6(d))) => (IpAddr::V6(v6(s)), IpAddr::V6(d)),
        (s, d) => (IpAddr::V4(v4(s)), IpAddr::V4(v4(d))),
    }
}

fn v4(a: Option<IpAddr>) -> Ipv4Addr {
    match a {
        Some(IpAddr::V4(a)) => a,
        _ => Ipv4Addr::UNSPECIFIED,
    }
}

fn v6(a: Option<IpAddr>) -> Ipv6Addr {
    match a {
        Some(IpAddr::V4(a)) => a.to_ipv6_mapped(),
        Some(IpAddr::V6(a)) => a,
        None => Ipv6Addr::UNSPECIFIED,
    }
}

/// The Ethernet, IP and UDP headers of a datagram of `flow` carrying
/// `payload` bytes (not included).
pub fn frame(flow: &Flow, payload: u32) -> Vec<u8> {
    // Lengths a header can hold: a larger claim is the stamp's, not a
    // datagram's (UDP's own field is 16 bits).
    let udp_len = u16::try_from(payload.saturating_add(u32::from(UDP_HEADER))).unwrap_or(u16::MAX);
    let (src, dst) = addresses(flow);
    let mut f = Vec::with_capacity(14 + 40 + 8);
    f.extend_from_slice(&RECEIVER_MAC);
    f.extend_from_slice(&SENDER_MAC);
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
            f.extend_from_slice(&ipv4_header(s, d, udp_len));
        }
        (s, d) => {
            f.extend_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
            f.extend_from_slice(&ipv6_header(v6(Some(s)), v6(Some(d)), udp_len));
        }
    }
    f.extend_from_slice(&flow.src_port.to_be_bytes());
    f.extend_from_slice(&flow.dst_port.to_be_bytes());
    f.extend_from_slice(&udp_len.to_be_bytes());
    // None computed: the payload it covers is not here. Over IPv4 that is
    // 0; over IPv6, where 0 is illegal (Wireshark flags it), 0xffff, a
    // checksum's value that Wireshark leaves unverified unless asked.
    let checksum: u16 = if src.is_ipv4() { 0 } else { 0xffff };
    f.extend_from_slice(&checksum.to_be_bytes());
    f
}

/// 20 bytes, no options, don't-fragment, the header checksum computed
/// (Wireshark flags a wrong one).
fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, udp_len: u16) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0] = 0x45;
    h[2..4].copy_from_slice(&udp_len.saturating_add(20).to_be_bytes());
    h[6] = 0x40;
    h[8] = TTL;
    h[9] = UDP;
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let sum = checksum(&h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h
}

fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, udp_len: u16) -> [u8; 40] {
    let mut h = [0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&udp_len.to_be_bytes());
    h[6] = UDP;
    h[7] = TTL;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    h
}

/// The Internet checksum (RFC 1071) of an even number of bytes.
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow<'a>(src: Option<&'a str>, dst: Option<&'a str>) -> Flow<'a> {
        Flow {
            src_addr: src,
            dst_addr: dst,
            src_port: 9000,
            dst_port: 9001,
        }
    }

    #[test]
    fn an_ipv4_frame_has_a_valid_header_checksum() {
        let f = frame(&flow(Some("10.77.0.1"), Some("10.77.0.2")), 100);
        assert_eq!(f.len(), 14 + 20 + 8);
        // The datagram's lengths, its payload not held.
        assert_eq!(&f[16..18], &(20u16 + 8 + 100).to_be_bytes());
        assert_eq!(&f[38..40], &(8u16 + 100).to_be_bytes());
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        // A header with its checksum in place sums to 0xffff.
        assert_eq!(checksum(&f[14..34]), 0);
        assert_eq!(&f[26..30], &[10, 77, 0, 1]);
        assert_eq!(&f[34..38], &[0x23, 0x28, 0x23, 0x29]);
    }

    #[test]
    fn ipv6_or_one_ipv6_address_makes_an_ipv6_frame() {
        let f = frame(&flow(Some("fd00::1"), Some("10.0.0.2")), 0);
        assert_eq!(f.len(), 14 + 40 + 8);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!(&f[14 + 40 + 6..], &[0xff, 0xff]);
        assert_eq!(
            &f[38..54],
            &"::ffff:10.0.0.2".parse::<Ipv6Addr>().unwrap().octets()
        );
    }

    #[test]
    fn unknown_addresses_are_unspecified() {
        let f = frame(&flow(None, Some("not an address")), u32::MAX);
        assert_eq!(&f[16..18], &u16::MAX.to_be_bytes());
        assert_eq!(&f[26..34], &[0; 8]);
    }
}

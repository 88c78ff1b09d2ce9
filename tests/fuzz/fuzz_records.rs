//! Fuzz target: the ring-buffer record decoder (`xlap_stamp::from_bytes`,
//! `xlap_stamp::all_from_bytes` of xlap-abi) and `Stamp::decode`.
//!
//! Properties: records of any length (empty, not a multiple of the stamp
//! size, large, at any alignment) never panic and give exactly
//! `len / STAMP_SIZE` stamps, each the bytes at its place read field by
//! field (here, from the field offsets, not through the decoder); stamps
//! written back to back (plus a partial tail) read back unchanged; and
//! `Stamp::decode` keeps or drops each field as the flags and the point say.
//! `PROPTEST_CASES` sets the number of cases (`just fuzz` runs many).

use core::mem::offset_of;
use proptest::prelude::*;
use proptest::test_runner::Config;
use xlap_abi::{
    xlap_point, xlap_stamp, STAMP_SIZE, XLAP_FLAG_FRAGMENT, XLAP_FLAG_FROM_USER, XLAP_FLAG_HW_TS,
    XLAP_FLAG_KIND, XLAP_FLAG_SEQ_VALID,
};
use xlap_records::Stamp;

/// `cases` unless `PROPTEST_CASES` says otherwise, a fixed seed unless
/// `PROPTEST_RNG_SEED` gives one, a time limit per case (a hang fails with
/// its input), failures kept as plain tests rather than in a
/// proptest-regressions file.
fn config(cases: u32) -> Config {
    crate::config(cases, 0x5EED_1A90, 10_000)
}

/// (offset, width) of every field of `struct xlap_stamp`, padding included.
const FIELDS: [(usize, usize); 16] = [
    (offset_of!(xlap_stamp, ts_ns), 8),
    (offset_of!(xlap_stamp, flow), 8),
    (offset_of!(xlap_stamp, seq), 8),
    (offset_of!(xlap_stamp, hw_ts_ns), 8),
    (offset_of!(xlap_stamp, pid), 4),
    (offset_of!(xlap_stamp, tid), 4),
    (offset_of!(xlap_stamp, len), 4),
    (offset_of!(xlap_stamp, ifindex), 4),
    (offset_of!(xlap_stamp, point), 2),
    (offset_of!(xlap_stamp, cpu), 2),
    (offset_of!(xlap_stamp, queue), 2),
    (offset_of!(xlap_stamp, flags), 1),
    (offset_of!(xlap_stamp, _pad), 1),
    (offset_of!(xlap_stamp, kind), 4),
    (offset_of!(xlap_stamp, priority), 4),
    (offset_of!(xlap_stamp, scope), 8),
];

/// The fields of a stamp as u64s, in FIELDS order.
fn values(s: &xlap_stamp) -> [u64; 16] {
    [
        s.ts_ns,
        s.flow,
        s.seq,
        s.hw_ts_ns,
        s.pid as u64,
        s.tid as u64,
        s.len as u64,
        s.ifindex as u64,
        s.point as u64,
        s.cpu as u64,
        s.queue as u64,
        s.flags as u64,
        s._pad as u64,
        s.kind as u64,
        s.priority as u64,
        s.scope,
    ]
}

/// The stamp whose bytes are `b`, read field by field (native byte order,
/// as the kernel writes them on this machine).
fn read_fields(b: &[u8]) -> [u64; 16] {
    FIELDS.map(|(off, width)| {
        let mut v = [0u8; 8];
        if cfg!(target_endian = "little") {
            v[..width].copy_from_slice(&b[off..off + width]);
            u64::from_le_bytes(v)
        } else {
            v[8 - width..].copy_from_slice(&b[off..off + width]);
            u64::from_be_bytes(v)
        }
    })
}

/// The bytes of `s`, written field by field.
fn write_fields(s: &xlap_stamp) -> Vec<u8> {
    let mut b = vec![0u8; STAMP_SIZE];
    for ((off, width), v) in FIELDS.into_iter().zip(values(s)) {
        if cfg!(target_endian = "little") {
            b[off..off + width].copy_from_slice(&v.to_le_bytes()[..width]);
        } else {
            b[off..off + width].copy_from_slice(&v.to_be_bytes()[8 - width..]);
        }
    }
    b
}

/// A point id: real kernel and app points mostly, any u16 sometimes.
fn point() -> impl Strategy<Value = u16> {
    let app = xlap_point::XLAP_POINT_APP_BASE as u16;
    prop_oneof![
        3 => 0u16..xlap_point::XLAP_POINT_KERNEL_COUNT as u16 + 1,
        1 => app..app + 16,
        1 => any::<u16>(),
    ]
}

fn raw_stamp() -> impl Strategy<Value = xlap_stamp> {
    (
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            prop_oneof![Just(0u32), any::<u32>()],
        ),
        (
            point(),
            any::<u16>(),
            any::<u16>(),
            any::<u8>(),
            any::<u8>(),
        ),
        (any::<u32>(), any::<u32>(), any::<u64>()),
    )
        .prop_map(
            |(
                (ts_ns, flow, seq, hw_ts_ns),
                (pid, tid, len, ifindex),
                (point, cpu, queue, flags, pad),
                (kind, priority, scope),
            )| {
                xlap_stamp {
                    ts_ns,
                    flow,
                    seq,
                    hw_ts_ns,
                    pid,
                    tid,
                    len,
                    ifindex,
                    point,
                    cpu,
                    queue,
                    flags,
                    _pad: pad,
                    kind,
                    priority,
                    scope,
                }
            },
        )
}

/// Record bytes: random ones of any length, or long ones (up to 256 KiB) of a
/// cheap pattern.
fn record() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..8 * STAMP_SIZE + 1),
        1 => (0usize..(1 << 18), any::<u8>())
            .prop_map(|(len, k)| (0..len).map(|i| (i as u8).wrapping_mul(k) ^ (i >> 8) as u8).collect()),
    ]
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn any_record_gives_one_stamp_per_whole_stamp_of_bytes(bytes in record(), start in 0usize..8) {
        // At any alignment: the ring buffer's records are 8-byte aligned,
        // a copied buffer need not be.
        let start = start.min(bytes.len());
        let bytes = &bytes[start..];
        let stamps: Vec<xlap_stamp> = xlap_stamp::all_from_bytes(bytes).collect();
        prop_assert_eq!(stamps.len(), bytes.len() / STAMP_SIZE);
        for (i, s) in stamps.iter().enumerate() {
            prop_assert_eq!(values(s), read_fields(&bytes[i * STAMP_SIZE..]), "stamp {}", i);
        }
        match xlap_stamp::from_bytes(bytes) {
            None => prop_assert!(bytes.len() < STAMP_SIZE),
            Some(first) => prop_assert_eq!(Some(&first), stamps.first()),
        }
    }

    #[test]
    fn stamps_written_back_to_back_read_back_unchanged(
        stamps in prop::collection::vec(raw_stamp(), 0..12),
        tail in prop::collection::vec(any::<u8>(), 0..STAMP_SIZE),
        start in 0usize..8,
    ) {
        let mut bytes = vec![0xa5u8; start];
        for s in &stamps {
            bytes.extend(write_fields(s));
        }
        // A trailing partial stamp is ignored.
        bytes.extend(&tail);
        let got: Vec<xlap_stamp> = xlap_stamp::all_from_bytes(&bytes[start..]).collect();
        prop_assert_eq!(got, stamps);
    }

    #[test]
    fn decode_keeps_what_the_flags_and_the_point_say(raw in raw_stamp()) {
        let s = Stamp::decode(&raw);
        let flag = |f: u32| raw.flags as u32 & f != 0;
        let seq_valid = flag(XLAP_FLAG_SEQ_VALID);
        let device_tx = [
            xlap_point::XLAP_POINT_DEV_QUEUE,
            xlap_point::XLAP_POINT_QDISC_ENQUEUE,
            xlap_point::XLAP_POINT_QDISC_DEQUEUE,
            xlap_point::XLAP_POINT_DEV_START_XMIT,
        ]
        .contains(&(raw.point as u32));
        let has_dev = raw.ifindex != 0;
        prop_assert_eq!(
            (s.ts_ns, s.point, s.flow, s.pid, s.tid, s.cpu, s.len),
            (raw.ts_ns, raw.point, raw.flow, raw.pid, raw.tid, raw.cpu, raw.len)
        );
        prop_assert_eq!(s.seq, seq_valid.then_some(raw.seq));
        // A kind only with a valid seq and a layout that has one.
        prop_assert_eq!(s.kind, (seq_valid && flag(XLAP_FLAG_KIND)).then_some(raw.kind));
        prop_assert_eq!(s.ifindex, has_dev.then_some(raw.ifindex));
        prop_assert_eq!(s.queue, has_dev.then_some(raw.queue));
        prop_assert_eq!(s.hw_ts_ns, flag(XLAP_FLAG_HW_TS).then_some(raw.hw_ts_ns));
        prop_assert_eq!(s.priority, device_tx.then_some(raw.priority));
        // The scope as the point's kind: a cgroup id at app, send, receive
        // and sched points, a 32-bit namespace inode at device points, 0 =
        // none.
        let device = (xlap_point::XLAP_POINT_DEV_QUEUE..=xlap_point::XLAP_POINT_DEV_RECEIVE_SKB)
            .contains(&(raw.point as u32));
        let cgroup_point = (raw.point as u32) >= xlap_point::XLAP_POINT_APP_BASE
            || [
                xlap_point::XLAP_POINT_SOCK_SEND_ENTER,
                xlap_point::XLAP_POINT_SOCK_SEND_EXIT,
                xlap_point::XLAP_POINT_SCHED_WAKEUP,
                xlap_point::XLAP_POINT_SCHED_SWITCH_IN,
                xlap_point::XLAP_POINT_SOCK_RECV_EXIT,
            ]
            .contains(&(raw.point as u32));
        prop_assert_eq!(s.cgroup_id, (cgroup_point && raw.scope != 0).then_some(raw.scope));
        prop_assert_eq!(
            s.netns,
            (device && raw.scope != 0 && raw.scope <= u32::MAX as u64).then_some(raw.scope as u32)
        );
        prop_assert_eq!((s.from_user, s.fragment), (flag(XLAP_FLAG_FROM_USER), flag(XLAP_FLAG_FRAGMENT)));
    }
}

/// A record far larger than any the ring buffer holds, not a multiple of
/// the stamp size: every whole stamp, nothing past them.
#[test]
fn a_huge_record_decodes_every_whole_stamp() {
    let n = 1 << 20;
    let mut bytes = Vec::with_capacity(n * STAMP_SIZE + 5);
    for i in 0..n as u64 {
        bytes.extend(write_fields(&xlap_stamp {
            ts_ns: i,
            seq: !i,
            ..Default::default()
        }));
    }
    bytes.extend([1, 2, 3, 4, 5]);
    let mut count = 0u64;
    for (i, s) in xlap_stamp::all_from_bytes(&bytes).enumerate() {
        assert_eq!((s.ts_ns, s.seq), (i as u64, !(i as u64)));
        count += 1;
    }
    assert_eq!(count, n as u64);
}

//! A decoded stamp: one point passed by one packet.

use crate::points::Scope;
use xlap_abi::{
    xlap_stamp, XLAP_FLAG_FRAGMENT, XLAP_FLAG_FROM_USER, XLAP_FLAG_HW_TS, XLAP_FLAG_KIND,
    XLAP_FLAG_SEQ_VALID,
};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// `CLOCK_MONOTONIC` ns of the host that recorded it.
    pub ts_ns: u64,
    pub point: u16,
    /// The protocol's sequence number; `None` when it could not be read
    /// (counted as a parse loss).
    pub seq: Option<u64>,
    /// The packet kind, in its full width; `None` when the datagram's
    /// layout has no kind field (or the seq could not be read).
    pub kind: Option<u32>,
    pub flow: u64,
    pub pid: u32,
    pub tid: u32,
    pub cpu: u16,
    pub len: u32,
    pub ifindex: Option<u32>,
    pub queue: Option<u16>,
    pub hw_ts_ns: Option<u64>,
    /// `skb->priority` at the transmit device points that see the skb
    /// whole (dev.queue, qdisc.enqueue/dequeue, dev.start_xmit): the class
    /// an htb or prio qdisc picks from SO_PRIORITY (major:minor as
    /// 0xMMMMmmmm). `None` at other points.
    pub priority: Option<u32>,
    /// The cgroup v2 id of the process at the points taken in its name
    /// (`points::Scope::Cgroup`); `None` elsewhere and where the kernel
    /// gave none.
    pub cgroup_id: Option<u64>,
    /// The inode number of the device's network namespace at the device
    /// and qdisc points; `None` elsewhere.
    pub netns: Option<u32>,
    /// Seq and kind came from the syscall's user buffer, not from an skb.
    pub from_user: bool,
    /// A later IP fragment of the datagram (an extra stamp at a device
    /// point; the datagram's own stamp is its first fragment's).
    pub fragment: bool,
}

impl Stamp {
    pub fn decode(raw: &xlap_stamp) -> Stamp {
        let flags = raw.flags as u32;
        let seq_valid = flags & XLAP_FLAG_SEQ_VALID != 0;
        let scope = crate::points::scope_of(raw.point);
        Stamp {
            ts_ns: raw.ts_ns,
            point: raw.point,
            seq: seq_valid.then_some(raw.seq),
            kind: (seq_valid && flags & XLAP_FLAG_KIND != 0).then_some(raw.kind),
            flow: raw.flow,
            pid: raw.pid,
            tid: raw.tid,
            cpu: raw.cpu,
            len: raw.len,
            ifindex: (raw.ifindex != 0).then_some(raw.ifindex),
            queue: (raw.ifindex != 0).then_some(raw.queue),
            hw_ts_ns: (flags & XLAP_FLAG_HW_TS != 0).then_some(raw.hw_ts_ns),
            priority: crate::points::kernel_point(raw.point as u32)
                .is_some_and(|p| p.carries_priority)
                .then_some(raw.priority),
            cgroup_id: (scope == Scope::Cgroup && raw.scope != 0).then_some(raw.scope),
            netns: (scope == Scope::Netns)
                .then(|| u32::try_from(raw.scope).ok())
                .flatten()
                .filter(|&n| n != 0),
            from_user: flags & XLAP_FLAG_FROM_USER != 0,
            fragment: flags & XLAP_FLAG_FRAGMENT != 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_decide_which_fields_are_present() {
        let raw = xlap_stamp {
            ts_ns: 10,
            flow: 3,
            seq: 42,
            hw_ts_ns: 77,
            pid: 5,
            tid: 6,
            len: 224,
            ifindex: 0,
            point: 7,
            cpu: 1,
            queue: 0,
            kind: 70_000,
            flags: (XLAP_FLAG_SEQ_VALID | XLAP_FLAG_FROM_USER | XLAP_FLAG_KIND) as u8,
            ..Default::default()
        };
        let s = Stamp::decode(&raw);
        assert_eq!((s.seq, s.kind, s.from_user), (Some(42), Some(70_000), true));
        // A layout without a kind field: no kind, not kind 0.
        let s = Stamp::decode(&xlap_stamp {
            flags: XLAP_FLAG_SEQ_VALID as u8,
            ..raw
        });
        assert_eq!((s.seq, s.kind), (Some(42), None));
        assert_eq!((s.ifindex, s.queue, s.hw_ts_ns), (None, None, None));
        let s = Stamp::decode(&xlap_stamp {
            flags: XLAP_FLAG_HW_TS as u8,
            ifindex: 4,
            ..raw
        });
        assert_eq!(
            (s.seq, s.kind, s.ifindex, s.hw_ts_ns),
            (None, None, Some(4), Some(77))
        );
    }

    /// `scope` is a cgroup id at the points taken in a process's name, a
    /// network namespace at device points, and nothing at the socket queue.
    #[test]
    fn scope_is_read_as_the_point_says() {
        use xlap_abi::xlap_point::*;
        let at = |point: u32, scope: u64| {
            let s = Stamp::decode(&xlap_stamp {
                point: point as u16,
                scope,
                ..Default::default()
            });
            (s.cgroup_id, s.netns)
        };
        assert_eq!(at(XLAP_POINT_SOCK_SEND_ENTER, 9), (Some(9), None));
        assert_eq!(at(XLAP_POINT_APP_BASE + 3, 9), (Some(9), None));
        assert_eq!(
            at(XLAP_POINT_DEV_XMIT, 4026531840),
            (None, Some(4026531840))
        );
        assert_eq!(at(XLAP_POINT_SOCK_QUEUE, 9), (None, None));
        assert_eq!(at(XLAP_POINT_SOCK_RECV_EXIT, 0), (None, None));
        // A namespace inode beyond 32 bits is no inode the kernel gives.
        assert_eq!(at(XLAP_POINT_DEV_QUEUE, 1 << 40), (None, None));
    }
}

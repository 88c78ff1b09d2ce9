//! `--points`: which kernel points a run stamps, to trade detail for cost.
//!
//! Every stamp costs the traced path its program run and a ring-buffer
//! record (`xlap-bench-perturb` measures them). A point left out is not
//! written (a mask the programs read from their read-only config), and a
//! program whose points are all left out and that keeps no state another
//! point needs is not attached at all: then it costs nothing.

use crate::exit::{failure, Code};
use anyhow::Result;
use xlap_abi::xlap_point as p;
use xlap_records::points::kernel_points;

/// The wire crossings on both sides and the socket boundary: the four
/// points a latency split into host, wire and host needs.
const MINIMAL: &[u32] = &[
    p::XLAP_POINT_SOCK_SEND_ENTER,
    p::XLAP_POINT_DEV_XMIT,
    p::XLAP_POINT_DEV_RECEIVE_SKB,
    p::XLAP_POINT_SOCK_RECV_EXIT,
];

/// Every layer once: minimal, plus the queueing (device queue, qdisc), the
/// socket queue and the reader's wake-up; without the driver-entry points
/// that repeat a neighbour (start_xmit, netif_rx, GRO entry).
const STANDARD: &[u32] = &[
    p::XLAP_POINT_SOCK_SEND_ENTER,
    p::XLAP_POINT_DEV_QUEUE,
    p::XLAP_POINT_QDISC_ENQUEUE,
    p::XLAP_POINT_QDISC_DEQUEUE,
    p::XLAP_POINT_DEV_XMIT,
    p::XLAP_POINT_SOCK_SEND_EXIT,
    p::XLAP_POINT_DEV_RECEIVE_SKB,
    p::XLAP_POINT_SOCK_QUEUE,
    p::XLAP_POINT_SCHED_WAKEUP,
    p::XLAP_POINT_SCHED_SWITCH_IN,
    p::XLAP_POINT_SOCK_RECV_EXIT,
];

/// Programs that only stamp their own points (nothing else reads what they
/// do): left unattached when none of those points is wanted.
const STAMP_ONLY: &[(&str, &[u32])] = &[
    ("on_qdisc_enqueue", &[p::XLAP_POINT_QDISC_ENQUEUE]),
    ("on_qdisc_dequeue", &[p::XLAP_POINT_QDISC_DEQUEUE]),
    ("on_net_dev_start_xmit", &[p::XLAP_POINT_DEV_START_XMIT]),
    ("on_netif_rx", &[p::XLAP_POINT_DEV_NETIF_RX]),
    (
        "on_napi_gro_receive_entry",
        &[p::XLAP_POINT_DEV_GRO_RECEIVE],
    ),
    ("on_napi_gro_frags_entry", &[p::XLAP_POINT_DEV_GRO_RECEIVE]),
    ("on_netif_receive_skb", &[p::XLAP_POINT_DEV_RECEIVE_SKB]),
    // The switch-in stamp needs the wake-up's record.
    (
        "on_sched_waking",
        &[p::XLAP_POINT_SCHED_WAKEUP, p::XLAP_POINT_SCHED_SWITCH_IN],
    ),
    ("on_sched_switch", &[p::XLAP_POINT_SCHED_SWITCH_IN]),
];

/// The kernel points of a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PointSet {
    ids: Vec<u32>,
}

impl PointSet {
    pub fn all() -> PointSet {
        PointSet {
            ids: kernel_points().map(|i| i.id as u32).collect(),
        }
    }

    /// `all`, `standard`, `minimal`, or point names separated by commas.
    pub fn parse(spec: &str) -> Result<PointSet> {
        let ids: Vec<u32> = match spec {
            "all" => return Ok(PointSet::all()),
            "standard" => STANDARD.to_vec(),
            "minimal" => MINIMAL.to_vec(),
            list => {
                let mut ids = Vec::new();
                for name in list.split(',').map(str::trim) {
                    let id = kernel_points()
                        .find(|i| i.name == name)
                        .map(|i| i.id as u32)
                        .ok_or_else(|| {
                            let names: Vec<_> = kernel_points().map(|i| i.name).collect();
                            failure(
                                Code::Usage,
                                format!(
                                    "--points: {name:?} is not a kernel point; use all, standard, minimal or names from: {}",
                                    names.join(", ")
                                ),
                            )
                        })?;
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ids
            }
        };
        Ok(PointSet { ids })
    }

    pub fn contains(&self, id: u32) -> bool {
        self.ids.contains(&id)
    }

    /// Bits of the points left out (the programs' config: 0 writes all).
    pub fn off_mask(&self) -> u32 {
        kernel_points()
            .map(|i| i.id as u32)
            .filter(|id| !self.contains(*id))
            .fold(0, |m, id| m | 1 << id)
    }

    /// Whether program `prog` has to be attached.
    pub fn needs_program(&self, prog: &str) -> bool {
        match STAMP_ONLY.iter().find(|(name, _)| *name == prog) {
            Some((_, points)) => points.iter().any(|id| self.contains(*id)),
            None => true,
        }
    }

    /// The names, in id order.
    pub fn names(&self) -> Vec<&'static str> {
        kernel_points()
            .filter(|i| self.contains(i.id as u32))
            .map(|i| i.name)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_names_and_the_programs_they_need() {
        let all = PointSet::all();
        assert_eq!(all.off_mask(), 0);
        assert!(STAMP_ONLY.iter().all(|(p, _)| all.needs_program(p)));

        let minimal = PointSet::parse("minimal").unwrap();
        assert_eq!(
            minimal.names(),
            [
                "sock.send_enter",
                "dev.xmit",
                "dev.receive_skb",
                "sock.recv_exit"
            ]
        );
        assert!(minimal.needs_program("on_netif_receive_skb"));
        assert!(minimal.needs_program("on_net_dev_queue"), "TX identity");
        assert!(!minimal.needs_program("on_netif_rx"));
        assert!(!minimal.needs_program("on_sched_waking"));
        assert_eq!(
            minimal.off_mask() & (1 << p::XLAP_POINT_DEV_QUEUE),
            1 << p::XLAP_POINT_DEV_QUEUE
        );

        let list = PointSet::parse("dev.xmit, sched.switch_in").unwrap();
        assert_eq!(list.names(), ["dev.xmit", "sched.switch_in"]);
        assert!(list.needs_program("on_sched_waking"), "switch-in needs it");

        for p in MINIMAL.iter().chain(STANDARD) {
            assert!(kernel_points().any(|i| i.id as u32 == *p));
        }
        let e = PointSet::parse("dev.xmit,nope").unwrap_err();
        assert_eq!(crate::exit::code_of(&e), Code::Usage as u8);
        assert!(e.to_string().contains("sock.recv_exit"), "{e}");
    }
}

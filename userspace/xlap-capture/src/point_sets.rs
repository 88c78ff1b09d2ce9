//! `--points`: which kernel points a run stamps, to trade detail for cost.
//!
//! Every stamp costs the traced path its program run and a ring-buffer
//! record (`xlap-bench-perturb` measures them). A point left out is not
//! written (a mask the programs read from their read-only config), and a
//! program whose points are all left out and that keeps no state another
//! point needs is not attached at all: then it costs nothing.

use crate::hooks::{program_points, ProgramPoints, Without};
use anyhow::Result;
use xlap_abi::xlap_point as p;
use xlap_exit::{failure, Code};
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

/// What a run lacks, by point name, given the programs that could not be
/// attached (`(program, reason)`): points stamped by none of their programs
/// (`missing`), and points missing some stamps or a filter (`degraded`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Lacking {
    pub missing: std::collections::BTreeMap<String, String>,
    pub degraded: std::collections::BTreeMap<String, String>,
}

impl PointSet {
    pub fn lacking(&self, unattached: &[(&str, &str)]) -> Lacking {
        let mut lacking = Lacking::default();
        let why = |program: &str| {
            unattached
                .iter()
                .find(|(p, _)| *p == program)
                .map(|(_, w)| *w)
        };
        for point in kernel_points().filter(|i| self.contains(i.id as u32)) {
            let programs: Vec<ProgramPoints> = program_points()
                .filter(|pp| pp.points.contains(&(point.id as u32)))
                .collect();
            let absent: Vec<(&ProgramPoints, &str)> = programs
                .iter()
                .filter_map(|pp| Some((pp, why(pp.program)?)))
                .collect();
            if absent.is_empty() {
                continue;
            }
            // Missing: a sole stamper is absent, or every one of several.
            let one_of = |pp: &ProgramPoints| matches!(pp.without, Without::OneOf(_));
            let alternatives = programs.iter().filter(|pp| one_of(pp)).count();
            let absent_alternatives: Vec<&(&ProgramPoints, &str)> =
                absent.iter().filter(|(pp, _)| one_of(pp)).collect();
            let all_absent = alternatives > 0 && alternatives == absent_alternatives.len();
            let sole = absent.iter().find(|(pp, _)| pp.without == Without::Missing);
            if let Some((pp, reason)) =
                sole.or(absent_alternatives.first().copied().filter(|_| all_absent))
            {
                lacking
                    .missing
                    .insert(point.name.to_string(), format!("{}: {reason}", pp.program));
            } else {
                let what: Vec<String> = absent
                    .iter()
                    .map(|(pp, reason)| match pp.without {
                        Without::Degraded(what)
                        | Without::OneOf(what)
                        | Without::Weakened(what) => {
                            format!("{what} ({}: {reason})", pp.program)
                        }
                        Without::Missing => unreachable!("a sole program makes the point missing"),
                    })
                    .collect();
                lacking
                    .degraded
                    .insert(point.name.to_string(), what.join("; "));
            }
        }
        lacking
    }
}

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

    /// Whether program `prog` has to be attached: a program that only
    /// stamps (required or not) is left out with its points.
    pub fn needs_program(&self, prog: &str) -> bool {
        let stamp_only = crate::hooks::HOOKS
            .iter()
            .filter(|h| h.program == prog)
            .flat_map(|h| h.effects)
            .find(|e| e.stamp_only);
        match stamp_only {
            Some(e) => e.points.iter().any(|id| self.contains(*id)),
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
        assert!(program_points().all(|pp| all.needs_program(pp.program)));

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
        // Without sock.send_exit the first device point stamps send_enter.
        assert!(!minimal.needs_program("on_sock_send_length"));
        assert!(PointSet::all().needs_program("on_sock_send_length"));
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
        assert_eq!(xlap_exit::code_of(&e), Code::Usage as u8);
        assert!(e.to_string().contains("sock.recv_exit"), "{e}");
    }

    #[test]
    fn refused_programs_name_the_points_missing_or_degraded() {
        let all = PointSet::all();
        assert_eq!(all.lacking(&[]), Lacking::default());
        // Without the socket hook: its queue point and the wake-ups it
        // keys are missing, the device points unfiltered.
        let l = all.lacking(&[("on_sock_ingress", "no dynptr")]);
        assert_eq!(
            l.missing.keys().collect::<Vec<_>>(),
            ["sched.switch_in", "sched.wakeup", "sock.queue"]
        );
        assert_eq!(l.missing["sock.queue"], "on_sock_ingress: no dynptr");
        assert_eq!(
            l.degraded.keys().collect::<Vec<_>>(),
            [
                "dev.gro_receive",
                "dev.netif_rx",
                "dev.receive_skb",
                "sock.recv_exit"
            ]
        );
        assert!(l.degraded["sock.recv_exit"].contains("no flow"), "{l:?}");
        assert!(
            l.degraded["dev.netif_rx"].contains("untraced sockets"),
            "{l:?}"
        );
        // GRO's own programs gone, the filter there: missing.
        let l = all.lacking(&[
            ("on_napi_gro_frags_entry", "gone"),
            ("on_napi_gro_receive_entry", "gone"),
        ]);
        assert!(l.missing.contains_key("dev.gro_receive"), "{l:?}");
        // One of GRO's two entries: degraded.
        let l = all.lacking(&[("on_napi_gro_frags_entry", "gone")]);
        assert!(l.missing.is_empty());
        assert!(
            l.degraded["dev.gro_receive"].contains("napi_gro_frags"),
            "{l:?}"
        );
        // The switch-in stamp needs the wake-up program.
        let l = all.lacking(&[("on_sched_waking", "gone")]);
        assert_eq!(
            l.missing.keys().collect::<Vec<_>>(),
            ["sched.switch_in", "sched.wakeup"]
        );
        // io_uring's programs leave the syscall points degraded (the
        // syscall exit stamps the rest of them).
        let l = all.lacking(&[
            ("on_io_uring_complete", "changed"),
            ("on_io_uring_submit_req", "changed"),
            ("on_sock_recv_length", "changed"),
        ]);
        assert!(l.missing.is_empty(), "{l:?}");
        let l = all.lacking(&[("on_io_uring_complete", "changed")]);
        assert!(l.missing.is_empty());
        assert_eq!(l.degraded.len(), 3, "{l:?}");
        // A point the run does not write lacks nothing.
        let minimal = PointSet::parse("minimal").unwrap();
        let l = minimal.lacking(&[("on_sock_ingress", "no dynptr")]);
        assert!(l.missing.is_empty());
        assert_eq!(
            l.degraded.keys().collect::<Vec<_>>(),
            ["dev.receive_skb", "sock.recv_exit"]
        );
    }
}

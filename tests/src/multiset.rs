//! Stamps against a program's log as multisets of (seq, kind): what the
//! capture tests compare, naming only the differences when they differ.

use crate::example::{events, kind_code};
use crate::trace::Row;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// (seq, kind) -> how many times.
pub type Multiset = BTreeMap<(u64, u32), usize>;

/// Asserts two multisets are equal, naming only the differences.
pub fn assert_same(stamped: &Multiset, logged: &Multiset, what: &str) {
    let diff: Vec<_> = stamped
        .keys()
        .chain(logged.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|k| stamped.get(k) != logged.get(k))
        .map(|k| {
            (
                k,
                stamped.get(k).copied().unwrap_or(0),
                logged.get(k).copied().unwrap_or(0),
            )
        })
        .collect();
    assert!(
        diff.is_empty(),
        "{what}: (seq, kind), stamps, log lines: {:?}",
        &diff[..diff.len().min(20)]
    );
}

/// (seq, kind) of the example's log lines of `event`, dropped packets
/// (never sent) left out.
pub fn logged(log: &[Value], event: &str) -> Multiset {
    let mut m = Multiset::new();
    for e in events(log, event) {
        if e["event"] == "sent" && e["dropped"] == true {
            continue;
        }
        let key = (
            e["seq"].as_u64().unwrap(),
            kind_code(e["kind"].as_str().unwrap()),
        );
        *m.entry(key).or_default() += 1;
    }
    m
}

/// [`logged`], of the log lines `keep` accepts (e.g. those before a time).
pub fn logged_where(log: &[Value], event: &str, keep: impl Fn(&Value) -> bool) -> Multiset {
    let kept: Vec<Value> = log.iter().filter(|e| keep(e)).cloned().collect();
    logged(&kept, event)
}

/// (seq, kind) of the example's data and parity stamps of `point` by
/// process `pid`.
pub fn stamped(rows: &[Row], point: &str, pid: u32) -> Multiset {
    let mut m = Multiset::new();
    for r in rows.iter().filter(|r| r.point == point && r.pid == pid) {
        if let (Some(seq), Some(kind @ (1 | 2))) = (r.seq, r.kind) {
            *m.entry((seq, kind)).or_default() += 1;
        }
    }
    m
}

//! Stamps of one or more runs → the `packets` table.
//!
//! 1. Each stamp gets its clock domain (the run's boot id) and a flow: app
//!    and receive-exit stamps carry none and take the flow of the kernel
//!    stamps of the same run, pid, kind and seq (nearest in time).
//! 2. Clocks of other domains are mapped onto the first run's ([`clock`]).
//! 3. Sequence numbers are unwrapped per stream (8/16/32-bit fields wrap):
//!    a step back by more than half the range starts a new epoch, a step
//!    forward by more than half is a late packet of the previous one. A
//!    stream starts in its flow's first epoch, or in the next when its first
//!    seq lies more than half the range below the flow's first (it began
//!    after a wrap: within half the range of the flow's start, it is right).
//! 4. App stamps get their side: the sending or the receiving process of the
//!    packet's flow. An app point seen on both sides gets a `_tx`/`_rx`
//!    suffix.
//! 5. One row per (flow, kind, seq): a column per point (`<point>_ns`, dots
//!    as underscores, on the reference clock; a device point of a stacked
//!    or tunnel device above the one on the wire: `<point>_upper_ns`), X-LAP's durations, a column
//!    (`sender_total_ns`, `channel_ns`, `receiver_total_ns`, `e2e_ns`, and
//!    X-LAP's own end-to-end `xlap_e2e_ns` = sender + receiver total), a column
//!    per stage between points of one side consecutive in the packet along
//!    its kind's path order, an absent point spanned over
//!    (`<a>__<b>_ns`, [`xlap_records::stages`]; the crossing is
//!    `channel_ns`), flags:
//!    `lost` (sent, nothing received on a flow a traced socket received),
//!    `untraced` (sent on a flow no traced socket received: the receiver
//!    was not recorded, an SO_REUSEPORT sibling took it), `partial` (in
//!    flight when a point's recording began or ended: the run's start or
//!    end, a rotation's cut, a receiver that stopped reading; stamped by
//!    some of its points and not others, with no end-to-end latency),
//!    `recovered` (delivered by the receiver
//!    without crossing the wire), `duplicate` (received more than once, with
//!    the skew of the copies), `reordered` (a later seq arrived before it),
//!    `retransmitted` (sent more than once), `deadline_missed`, and
//!    `sample_weight`, the packets a row stands for in a run recorded with
//!    `--sample 1/N` (every run of a correlation must have the same sample).
//!    `priority` is the skb's priority on the sender's wire device (the
//!    class an htb or prio qdisc takes from SO_PRIORITY).
//!    The flow's 5-tuple rides along: `src_addr`/`dst_addr` (null where the
//!    capture could not note them), `src_port`/`dst_port`, and the cookies
//!    of the traced sockets that sent and received it; `kind` is null for
//!    a layout without a kind field.

use crate::clock::{self, Mapping};
use crate::packets_table::{self, PointColumns, StageColumn};
use crate::runs::Run;
use crate::sql;
use crate::{AnalyzeError, Result};
use duckdb::Connection;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

#[derive(Clone, Debug, Default)]
pub struct CorrelateOptions {
    /// End-to-end deadline: packets above it are flagged `deadline_missed`.
    pub deadline_ns: Option<i64>,
}

/// What a correlation produced.
#[derive(Clone, Debug, Serialize)]
pub struct Correlation {
    pub packets: u64,
    pub lost: u64,
    /// Sent on flows no traced socket received (the receiver not recorded).
    pub untraced: u64,
    /// In flight when a point's recording began or ended (the run's start
    /// or end, a rotation's cut, a receiver that stopped reading): stamped
    /// by some of their points, not all.
    #[serde(default)]
    pub partial: u64,
    /// Per point column, the partial packets lacking it.
    #[serde(default)]
    pub partial_lacking: BTreeMap<String, u64>,
    pub recovered: u64,
    pub duplicates: u64,
    pub reordered: u64,
    /// Stamps whose packet could not be placed (no flow, no side).
    pub unplaced_stamps: u64,
    /// Point columns in their typical order along the path.
    pub points: Vec<String>,
    /// The side ("tx" or "rx") of each point column.
    pub point_sides: Vec<String>,
    /// Where the path order of a kind's side does not fit every packet
    /// (those packets have a negative stage): empty when it fits all.
    pub order_conflicts: Vec<String>,
    pub clocks: Vec<Mapping>,
}

/// Where a packet leaves the sender and reaches the receiver: the first of
/// these point columns (without `_ns`) a run has.
///
/// Points that fire per device: on a stacked or tunnel device once per
/// device. The device that puts the packet on the wire (the last one queued
/// on when sending, the first one received on) keeps the plain column, the
/// others fill `<point>_upper_ns`.
pub use xlap_records::points::{RX_DEVICE_POINTS, RX_WIRE, TX_DEVICE_POINTS, TX_WIRE};

/// The wrap-around span of a `seq_size`-byte sequence number (0: none
/// within 64 bits).
fn span_of(seq_size: u8) -> i64 {
    if seq_size >= 8 {
        0
    } else {
        1i64 << (8 * seq_size as u32)
    }
}

/// `run_domain` (run, clock domain, seq span) and `port_span` (run, port,
/// seq span of a port with a layout of its own), the run's names bound as
/// values: a run id or boot id from run.json is data, not SQL.
fn load_run_tables(conn: &Connection, runs: &[Run]) -> Result<()> {
    conn.execute_batch(
        "CREATE OR REPLACE TEMP TABLE run_domain (run_id VARCHAR, domain VARCHAR, span HUGEINT);
         CREATE OR REPLACE TEMP TABLE port_span (run_id VARCHAR, port BIGINT, span HUGEINT);",
    )?;
    let mut domain = conn.prepare("INSERT INTO run_domain VALUES (?, ?, ?)")?;
    let mut port = conn.prepare("INSERT INTO port_span VALUES (?, ?, ?)")?;
    for r in runs {
        domain.execute(duckdb::params![
            r.run_id(),
            r.boot_id(),
            span_of(r.seq_size())
        ])?;
        // Datagrams of a port with a layout of its own wrap at its seq size
        // (a flow's destination port first, as in the capture).
        for (p, size) in r.port_seq_sizes() {
            port.execute(duckdb::params![r.run_id(), p, span_of(size)])?;
        }
    }
    Ok(())
}

/// `clocks`: each domain's mapping onto the reference clock.
fn load_clocks(conn: &Connection, clocks: &[Mapping]) -> Result<()> {
    conn.execute_batch(
        "CREATE OR REPLACE TEMP TABLE clocks (domain VARCHAR, offset_ns DOUBLE, drift_ppm DOUBLE, t0_ns BIGINT);",
    )?;
    let mut stmt = conn.prepare("INSERT INTO clocks VALUES (?, ?, ?, ?)")?;
    for m in clocks {
        stmt.execute(duckdb::params![m.domain, m.offset_ns, m.drift_ppm, m.t0_ns])?;
    }
    Ok(())
}

/// Refuses a point column the packets table cannot have, naming its point
/// and the stamps file it came from; every other name is carried quoted.
fn check_point_columns(
    conn: &Connection,
    runs: &[Run],
    cols: &[(String, String)],
    stage_cols: &[StageColumn],
) -> Result<()> {
    let Err((col, why)) = packets_table::check_columns(cols, stage_cols) else {
        return Ok(());
    };
    let (point, run_id): (String, String) = conn.query_row(
        "SELECT point, run_id FROM s5 WHERE col = ? LIMIT 1",
        [&col],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let file = runs
        .iter()
        .find(|r| r.run_id() == run_id)
        .unwrap_or(&runs[0])
        .stamps();
    Err(AnalyzeError::Input {
        path: file.display().to_string(),
        what: format!("the point {point:?} cannot be correlated: {why}"),
    })
}

/// Correlates `runs` (the first one's clock is the reference) into a
/// `packets` table in `conn`, and writes it to `out` as Parquet when given:
/// the five steps of the module's description, a function each.
pub fn correlate(
    conn: &Connection,
    runs: &[Run],
    opts: &CorrelateOptions,
    out: Option<&Path>,
) -> Result<Correlation> {
    if runs.is_empty() {
        return Err(AnalyzeError::Other("no runs to correlate".into()));
    }
    let files: Vec<_> = runs.iter().map(|r| r.stamps()).collect();
    correlate_stamps(conn, runs, &files, opts, out).map_err(crate::unreadable_in(&files))
}

fn correlate_stamps(
    conn: &Connection,
    runs: &[Run],
    files: &[std::path::PathBuf],
    opts: &CorrelateOptions,
    out: Option<&Path>,
) -> Result<Correlation> {
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP VIEW stamps AS SELECT * FROM read_parquet([{}]);",
        sql::paths(files)
    ))?;
    check_cardinality(conn, files)?;
    load_run_tables(conn, runs)?;
    let columns = StampColumns::of(conn)?;
    domains_and_flows(conn, &columns)?;
    let clocks = map_clocks(conn, runs)?;
    let unplaced = place_stamps(conn)?;
    let cols = point_columns(conn)?;
    check_point_columns(conn, runs, &cols, &[])?;
    let (cols, conflicts, partial_lacking) = build_packets(conn, runs, opts, &columns, cols)?;
    if let Some(out) = out {
        packets_table::write(conn, "packets", out, &cols)?;
    }
    let (packets, lost, untraced, recovered, duplicates, reordered, partial) = count_packets(conn)?;
    Ok(Correlation {
        packets: packets as u64,
        lost: lost as u64,
        untraced: untraced as u64,
        partial: partial as u64,
        partial_lacking,
        recovered: recovered as u64,
        duplicates: duplicates as u64,
        reordered: reordered as u64,
        unplaced_stamps: unplaced.max(0) as u64,
        point_sides: cols.iter().map(|(_, s)| s.clone()).collect(),
        order_conflicts: conflicts,
        points: cols.into_iter().map(|(c, _)| c).collect(),
        clocks,
    })
}

/// The most distinct point names the stamps of one correlation may carry:
/// the kernel's twenty and a hundred markers. A column each (a kernel
/// point up to four: upper device, either end), and the path order weighs
/// every pair.
pub const MAX_POINTS: i64 = 128;
/// The most distinct packet kinds: a one-byte type field's range. Each
/// kind has its own path, stages and summary grids.
pub const MAX_KINDS: i64 = 256;

/// The most distinct stages (pairs of points consecutive in a packet along
/// its kind's path): a column each in the packets table, where a few
/// dozen is a rich path. Points present at random in each packet make
/// thousands (120 points: 2 786; the table took minutes to write).
pub const MAX_STAGES: usize = 512;
/// The most (kind, stage) pairs: a distribution each in summary.json,
/// which must stay within what a summary's reader takes (16 MiB).
pub const MAX_KIND_STAGES: usize = 16_384;

/// Refuses stamps whose names or kinds are more than the correlator is
/// built for ([`MAX_POINTS`], [`MAX_KINDS`]), naming the file that carries
/// the most, before any step whose cost grows with them: a run directory
/// from elsewhere may carry 57 000 point names (the engine once died of
/// SIGFPE in its hash aggregate) or a kind per packet.
fn check_cardinality(conn: &Connection, files: &[std::path::PathBuf]) -> Result<()> {
    let (points, kinds): (i64, i64) = conn.query_row(
        "SELECT count(DISTINCT point), count(DISTINCT kind) FROM stamps",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    for (what, n, cap, column) in [
        ("point names", points, MAX_POINTS, "point"),
        ("packet kinds", kinds, MAX_KINDS, "kind"),
    ] {
        if n <= cap {
            continue;
        }
        let (file, in_file): (String, i64) = conn.query_row(
            &format!(
                "SELECT filename, count(DISTINCT {column}) AS n
                 FROM read_parquet([{}], filename = true) GROUP BY filename ORDER BY n DESC LIMIT 1",
                sql::paths(files)
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let hint = if column == "kind" {
            "the layout's kind field is not a packet type (record with another --kind-offset, or none)"
        } else {
            "the stamps were not written by xlap-trace's recorder, or its markers name each packet"
        };
        return Err(AnalyzeError::Input {
            path: file,
            what: format!(
                "its stamps carry {in_file} distinct {what} ({n} in all the runs); xlap-trace correlates at most {cap}: {hint}"
            ),
        });
    }
    Ok(())
}

/// Point columns (`<point>_ns`) with their side ("tx" or "rx").
type SidedColumns = Vec<(String, String)>;

/// The optional columns of the stamps (runs from before a column was
/// recorded have none of it).
struct StampColumns {
    has_fragment: bool,
    has_addresses: bool,
    has_priority: bool,
    has_cgroup: bool,
}

impl StampColumns {
    fn of(conn: &Connection) -> Result<StampColumns> {
        // Later IP fragments are extra stamps of their datagram (runs from
        // before the column existed have none).
        let has_fragment: bool = conn.query_row(
            "SELECT count(*) > 0 FROM (DESCRIBE stamps) WHERE column_name = 'fragment'",
            [],
            |r| r.get(0),
        )?;
        // Addresses and sockets per flow (runs from before they were recorded
        // have none).
        let has_addresses: bool = conn.query_row(
            "SELECT count(*) > 0 FROM (DESCRIBE stamps) WHERE column_name = 'src_addr'",
            [],
            |r| r.get(0),
        )?;
        // skb->priority at the sender's device points (runs from before it was
        // recorded have none).
        let has_priority: bool = conn.query_row(
            "SELECT count(*) > 0 FROM (DESCRIBE stamps) WHERE column_name = 'priority'",
            [],
            |r| r.get(0),
        )?;
        // The processes' cgroups (runs from before they were recorded have
        // none).
        let has_cgroup: bool = conn.query_row(
            "SELECT count(*) > 0 FROM (DESCRIBE stamps) WHERE column_name = 'cgroup_id'",
            [],
            |r| r.get(0),
        )?;
        Ok(StampColumns {
            has_fragment,
            has_addresses,
            has_priority,
            has_cgroup,
        })
    }
}

/// 1. Each stamp's clock domain and flow (`s1`).
fn domains_and_flows(conn: &Connection, columns: &StampColumns) -> Result<()> {
    let priority_col = if columns.has_priority {
        "s.priority"
    } else {
        "NULL::UINTEGER"
    };
    let cgroup_col = if columns.has_cgroup {
        "s.cgroup_id"
    } else {
        "NULL::UBIGINT"
    };
    let whole = if columns.has_fragment {
        "AND NOT s.fragment"
    } else {
        ""
    };
    conn.execute_batch(&format!(
        "-- 1. domains and flows. A marker's kind counts only where the
         -- process's datagrams have one: with a layout without a kind
         -- (a program we did not write, keyed by its seq alone) the
         -- packet is kind-less and so are its app stamps.
         CREATE OR REPLACE TEMP TABLE kinded AS
           SELECT run_id, pid, bool_or(kind IS NOT NULL) AS has_kind
           FROM stamps WHERE point NOT LIKE 'app.%' AND seq IS NOT NULL GROUP BY ALL;
         CREATE OR REPLACE TEMP TABLE s0 AS
           SELECT s.run_id, s.host, s.point, s.side, s.ts_ns, s.seq::HUGEINT AS seq,
                  CASE WHEN s.point LIKE 'app.%' AND NOT coalesce(k.has_kind, true) THEN -1
                       ELSE coalesce(s.kind::BIGINT, -1) END AS kind,
                  s.flow, s.pid, s.ifindex, {priority_col} AS priority,
                  {cgroup_col} AS cgroup_id, d.domain, d.span
           FROM stamps s JOIN run_domain d USING (run_id) LEFT JOIN kinded k USING (run_id, pid)
           WHERE s.seq IS NOT NULL {whole};
         CREATE OR REPLACE TEMP TABLE kflow AS
           SELECT run_id, pid, kind, seq, flow, min(ts_ns) AS t FROM s0 WHERE flow <> 0 GROUP BY ALL;
         -- a packet that never crossed the wire here (rebuilt from parity,
         -- say) takes the flow this process uses most for its kind
         CREATE OR REPLACE TEMP TABLE pidflow AS
           SELECT run_id, pid, kind, arg_max(flow, n) AS flow
           FROM (SELECT run_id, pid, kind, flow, count(*) n FROM kflow GROUP BY ALL) GROUP BY ALL;
         CREATE OR REPLACE TEMP TABLE s1 AS
           SELECT s0.* EXCLUDE (flow),
                  CASE WHEN s0.flow <> 0 THEN s0.flow ELSE coalesce(m.flow, pf.flow) END AS flow
           FROM s0 LEFT JOIN (
             SELECT f.run_id, f.pid, f.kind, f.seq, f.ts_ns, arg_min(k.flow, abs(k.t - f.ts_ns)) AS flow
             FROM (SELECT DISTINCT run_id, pid, kind, seq, ts_ns FROM s0 WHERE flow = 0) f
             JOIN kflow k USING (run_id, pid, kind, seq)
             GROUP BY ALL) m
           USING (run_id, pid, kind, seq, ts_ns)
           LEFT JOIN pidflow pf USING (run_id, pid, kind);"
    ))?;
    Ok(())
}

/// 2. The other runs' clocks mapped onto the first run's (`clocks`).
fn map_clocks(conn: &Connection, runs: &[Run]) -> Result<Vec<Mapping>> {
    // 2. clocks: the wire crossing of every packet, raw, per domain.
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE wire AS
         SELECT t.flow, t.kind, t.seq, t.domain AS tx_domain, t.ts AS tx_ns, r.domain AS rx_domain, r.ts AS rx_ns
         FROM (SELECT flow, kind, seq, domain, min(ts_ns) ts FROM s1 WHERE replace(point, '.', '_') IN ({tx}) GROUP BY ALL) t
         JOIN (SELECT flow, kind, seq, domain, min(ts_ns) ts FROM s1 WHERE replace(point, '.', '_') IN ({rx}) GROUP BY ALL) r
         USING (flow, kind, seq);",
        tx = sql::literals(TX_WIRE),
        rx = sql::literals(RX_WIRE)
    ))?;
    let reference = runs[0].boot_id().to_string();
    let mut clocks = vec![Mapping::identity(&reference, "reference clock (first run)")];
    for run in &runs[1..] {
        if clocks.iter().any(|m| m.domain == run.boot_id()) {
            continue;
        }
        let mapping = match clock::estimate(conn, &reference, run.boot_id())? {
            Some(m) => m,
            None => realtime_mapping(&runs[0], run),
        };
        clocks.push(mapping);
    }
    load_clocks(conn, &clocks)?;
    Ok(clocks)
}

/// 3.–4. Every stamp on the reference clock, its seq unwrapped, its side
/// and its column (`s5`); returns the stamps with a seq left unplaced.
fn place_stamps(conn: &Connection) -> Result<i64> {
    // 3.–4. reference time, unwrapped seq, side and column of every stamp.
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE s2 AS
           SELECT s1.* EXCLUDE (span), coalesce(pd.span, ps.span, s1.span) AS span,
                  (ts_ns - c.offset_ns - c.drift_ppm * 1e-6 * (ts_ns - c.offset_ns - c.t0_ns))::BIGINT AS t
           FROM s1 JOIN clocks c USING (domain)
           LEFT JOIN port_span pd ON pd.run_id = s1.run_id AND pd.port = (s1.flow & 65535)
           LEFT JOIN port_span ps ON ps.run_id = s1.run_id AND ps.port = ((s1.flow >> 16) & 65535)
           WHERE flow IS NOT NULL;
         -- A stream starts in the epoch of its flow's first stamp (on any
         -- run), or in the next one when its first seq lies more than half
         -- the range below that one's: the field wrapped before the stream's
         -- first stamp (its point missed the first packets, or they were
         -- lost). Starting every stream in epoch 0 split such packets in
         -- two rows (found by fuzzing: tests/fuzz/fuzz_correlate.rs).
         CREATE OR REPLACE TEMP TABLE s3 AS
           SELECT * EXCLUDE (d, step, stream_first, flow_first),
                  seq + span * (sum(step) OVER (PARTITION BY run_id, flow, kind, point ORDER BY ts_ns ROWS UNBOUNDED PRECEDING)
                                + CASE WHEN stream_first - flow_first < -span // 2 THEN 1 ELSE 0 END) AS useq
           FROM (SELECT *, seq - lag(seq) OVER (PARTITION BY run_id, flow, kind, point ORDER BY ts_ns) AS d,
                        CASE WHEN span = 0 THEN 0 WHEN d < -span // 2 THEN 1 WHEN d > span // 2 THEN -1 ELSE 0 END AS step,
                        first_value(seq) OVER (PARTITION BY run_id, flow, kind, point ORDER BY ts_ns) AS stream_first,
                        first_value(seq) OVER (PARTITION BY flow, kind ORDER BY t) AS flow_first
                 FROM s2);
         CREATE OR REPLACE TEMP TABLE ends AS
           SELECT flow,
                  arg_max(run_id, n) FILTER (WHERE side = 'tx') AS tx_run, arg_max(pid, n) FILTER (WHERE side = 'tx') AS tx_pid,
                  arg_max(host, n) FILTER (WHERE side = 'tx') AS tx_host,
                  arg_max(run_id, n) FILTER (WHERE side = 'rx') AS rx_run, arg_max(pid, n) FILTER (WHERE side = 'rx') AS rx_pid,
                  arg_max(host, n) FILTER (WHERE side = 'rx') AS rx_host
           FROM (SELECT flow, side, run_id, pid, host, count(*) n FROM s3 WHERE side IS NOT NULL GROUP BY ALL)
           GROUP BY flow;
         CREATE OR REPLACE TEMP TABLE s4 AS
           SELECT s3.*, coalesce(s3.side, CASE WHEN s3.run_id = e.tx_run AND s3.pid = e.tx_pid THEN 'tx'
                                                WHEN s3.run_id = e.rx_run AND s3.pid = e.rx_pid THEN 'rx' END) AS end_side
           FROM s3 JOIN ends e USING (flow);
         CREATE OR REPLACE TEMP TABLE both_sides AS
           SELECT point FROM s4 WHERE side IS NULL AND end_side IS NOT NULL GROUP BY point HAVING count(DISTINCT end_side) > 1;
         CREATE OR REPLACE TEMP TABLE wire_dev AS
           SELECT flow, kind, useq,
                  arg_max(ifindex, t) FILTER (WHERE point = 'dev.queue') AS tx_if,
                  arg_min(ifindex, t) FILTER (WHERE point IN ({rx_dev})) AS rx_if
           FROM s4 WHERE end_side IS NOT NULL GROUP BY ALL;
         CREATE OR REPLACE TEMP TABLE s5 AS
           SELECT s4.*, replace(point, '.', '_')
                  || CASE WHEN (point IN ({tx_dev}) AND ifindex <> w.tx_if) OR (point IN ({rx_dev}) AND ifindex <> w.rx_if)
                          THEN '_upper' ELSE '' END
                  || CASE WHEN point IN (SELECT point FROM both_sides) THEN '_' || end_side ELSE '' END || '_ns' AS col
           FROM s4 JOIN wire_dev w USING (flow, kind, useq) WHERE end_side IS NOT NULL;",
        tx_dev = sql::literals(TX_DEVICE_POINTS),
        rx_dev = sql::literals(RX_DEVICE_POINTS),
    ))?;
    let unplaced: i64 = conn.query_row(
        "SELECT (SELECT count(*) FROM stamps WHERE seq IS NOT NULL) - (SELECT count(*) FROM s5)",
        [],
        |r| r.get(0),
    )?;
    Ok(unplaced)
}

/// 5a. The point columns with their sides, in a first order along the path.
fn point_columns(conn: &Connection) -> Result<SidedColumns> {
    // 5. the table. Point columns by their median offset from an anchor,
    // the most common point, within each packet that has both: only a hint
    // for points that never meet in a packet; the path order comes from
    // pairwise precedence (`path_orders`).
    let cols: Vec<(String, String)> = {
        let mut stmt = conn.prepare(
            "WITH a AS (SELECT col FROM s5 GROUP BY col ORDER BY count(*) DESC, col LIMIT 1),
                  f AS (SELECT flow, kind, useq, min(t) AS t0 FROM s5 WHERE col = (SELECT col FROM a) GROUP BY ALL),
                  g AS (SELECT flow, kind, useq, min(t) AS first FROM s5 GROUP BY ALL)
             SELECT col, any_value(end_side) FROM s5 JOIN g USING (flow, kind, useq) LEFT JOIN f USING (flow, kind, useq)
             GROUP BY col ORDER BY coalesce(median(t - t0), median(t - first)), median(t - first), col",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    if cols.is_empty() {
        return Err(AnalyzeError::NoPackets(
            "no stamp carries a sequence number: nothing to correlate".into(),
        ));
    }
    Ok(cols)
}

/// 5b. The `packets` table: one row per packet, its point columns in path
/// order, stages and flags; returns the columns, the order conflicts and
/// the points the partial packets lack.
fn build_packets(
    conn: &Connection,
    runs: &[Run],
    opts: &CorrelateOptions,
    columns: &StampColumns,
    cols: SidedColumns,
) -> Result<(SidedColumns, Vec<String>, BTreeMap<String, u64>)> {
    pivot(conn, &cols)?;
    let paths = path_orders(conn, &cols)?;
    let cols = paths.layout;
    let stage_cols = paths.stages;
    let kind_stages: usize = stage_cols.iter().map(|s| s.cases.len()).sum();
    if stage_cols.len() > MAX_STAGES || kind_stages > MAX_KIND_STAGES {
        return Err(AnalyzeError::Input {
            path: runs
                .iter()
                .map(|r| r.stamps().display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            what: format!(
                "its packets pass their points in {} distinct stages (pairs of points consecutive in a packet), {kind_stages} over their kinds; xlap-trace correlates at most {MAX_STAGES}, and {MAX_KIND_STAGES} over the kinds: the markers fire in no steady order, or each packet at others",
                stage_cols.len()
            ),
        });
    }
    check_point_columns(conn, runs, &cols, &stage_cols)?;
    let weight = sample_weight(runs)?;
    write_packets(conn, opts, columns, &cols, &stage_cols, &weight)?;
    mark_untraced(conn, &cols)?;
    let lacking = mark_partial(conn, runs, &cols)?;
    Ok((cols, paths.conflicts, lacking))
}

/// `sample_weight`'s expression: the runs must share their sample, or the
/// datagrams one end kept and the other did not would look lost.
fn sample_weight(runs: &[Run]) -> Result<String> {
    let sample = &runs[0].meta.options.sample;
    if let Some(other) = runs.iter().find(|r| &r.meta.options.sample != sample) {
        let say = |s: &Option<xlap_records::sample::Sample>| {
            s.as_ref()
                .map_or("every datagram".to_string(), |s| s.describe())
        };
        return Err(AnalyzeError::Input {
            path: other.dir.display().to_string(),
            what: format!(
                "this run stamped {}, the run {} {}: record every end with the same --sample (and --sample-kinds) to correlate them",
                say(&other.meta.options.sample),
                runs[0].dir.display(),
                say(sample)
            ),
        });
    }
    Ok(match sample {
        None => "1::UINTEGER".into(),
        Some(s) if s.kinds.is_empty() => format!("{}::UINTEGER", s.one_in),
        // A kind-less datagram counts as kind 0, as in the capture.
        Some(s) => format!(
            "(CASE WHEN greatest(p.kind, 0) IN ({}) THEN {} ELSE 1 END)::UINTEGER",
            s.kinds
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            s.one_in
        ),
    })
}

/// The pivot: `pk`, a row per packet with a column per point (its first
/// stamp there) and the skb priority on the wire device.
fn pivot(conn: &Connection, cols: &[(String, String)]) -> Result<()> {
    let pivot_cols = cols
        .iter()
        .map(|(c, _)| {
            format!(
                "min(t) FILTER (WHERE col = {}) AS {}",
                sql::literal(c),
                sql::ident(c)
            )
        })
        .collect::<Vec<_>>()
        .join(",\n  ");
    // The priority of the skb on the wire device (the qdisc's class input):
    // the earliest stamp of the points that carry it.
    let wire_device_cols: Vec<String> = xlap_records::points::kernel_points()
        .filter(|p| p.carries_priority)
        .map(|p| format!("{}_ns", xlap_records::points::column_stem(p.name)))
        .filter(|n| cols.iter().any(|(c, _)| c == n))
        .map(|n| sql::literal(&n))
        .collect();
    let priority = if !wire_device_cols.is_empty() {
        format!(
            "arg_min(priority, t) FILTER (WHERE priority IS NOT NULL AND col IN ({}))",
            wire_device_cols.join(", ")
        )
    } else {
        "NULL".to_string()
    };
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE pk AS
         SELECT flow, kind, useq, {priority}::UINTEGER AS __priority,
                -- the sender's and the receiver's cgroup: each end's first
                -- stamp that carries one
                arg_min(cgroup_id, t) FILTER (WHERE cgroup_id IS NOT NULL AND end_side = 'tx')::UBIGINT AS __tx_cgroup,
                arg_min(cgroup_id, t) FILTER (WHERE cgroup_id IS NOT NULL AND end_side = 'rx')::UBIGINT AS __rx_cgroup,
                {pivot_cols}
         FROM s5 GROUP BY flow, kind, useq;"
    ))?;
    Ok(())
}

/// The `packets` table from the pivot: the columns of the schema in
/// order, the point columns in path order, stages and flags.
fn write_packets(
    conn: &Connection,
    opts: &CorrelateOptions,
    columns: &StampColumns,
    cols: &[(String, String)],
    stage_cols: &[StageColumn],
    weight: &str,
) -> Result<()> {
    let deadline = opts
        .deadline_ns
        .map_or("NULL::BOOLEAN".to_string(), |d| format!("e2e_ns > {d}"));
    // Copies of a packet: how often its first receive-side device point fired.
    let rx_count_point = RX_WIRE
        .iter()
        .find(|p| cols.iter().any(|(c, _)| c == &format!("{p}_ns")));
    let dup_source = rx_count_point.map_or(
        "SELECT NULL::UBIGINT flow, NULL::BIGINT kind, NULL::HUGEINT useq, 0 AS copies, NULL::BIGINT AS skew WHERE false".to_string(),
        |p| format!("SELECT flow, kind, useq, count(*) AS copies, max(t) - min(t) AS skew FROM s5 WHERE col = {} GROUP BY ALL", sql::literal(&format!("{p}_ns"))),
    );
    let sends_source = "SELECT flow, kind, useq, count(*) AS sends FROM s5 WHERE point = 'sock.send_enter' GROUP BY ALL";
    let addr_source = if columns.has_addresses {
        "SELECT flow, any_value(src_addr) AS src_addr, any_value(dst_addr) AS dst_addr,
                max(socket_cookie) FILTER (WHERE side = 'tx') AS tx_socket_cookie,
                max(socket_cookie) FILTER (WHERE side = 'rx') AS rx_socket_cookie
         FROM stamps WHERE flow <> 0 GROUP BY flow"
    } else {
        "SELECT NULL::UBIGINT flow, NULL::VARCHAR src_addr, NULL::VARCHAR dst_addr,
                NULL::UBIGINT tx_socket_cookie, NULL::UBIGINT rx_socket_cookie WHERE false"
    };
    // The flows some traced socket received: a packet of another flow that
    // nothing received is `untraced` (its receiver was not recorded), not
    // lost.
    let rx_seen = any_of(
        cols.iter()
            .filter(|(_, side)| side == "rx")
            .map(|(c, _)| format!("p.{} IS NOT NULL", sql::ident(c))),
    );
    let columns = PointColumns {
        cols,
        alias: "p",
    }
    .select_list_stages(stage_cols, |column, d| match column {
        "run_id" => "e.tx_run".into(),
        "flow" => "p.flow".into(),
        "kind" => "nullif(p.kind, -1)".into(),
        "seq" => "p.useq".into(),
        "src_addr" | "dst_addr" | "tx_socket_cookie" | "rx_socket_cookie" => format!("fa.{column}"),
        "src_port" => "nullif((p.flow >> 16) & 65535, 0)".into(),
        "dst_port" => "nullif(p.flow & 65535, 0)".into(),
        "tx_host" | "rx_host" | "tx_pid" | "rx_pid" => format!("e.{column}"),
        "priority" => "p.__priority".into(),
        "tx_cgroup" => "p.__tx_cgroup".into(),
        "rx_cgroup" => "p.__rx_cgroup".into(),
        "lost" => format!("NOT ({}) AND rs.flow IS NOT NULL", d.rx_any),
        "untraced" => format!("NOT ({}) AND rs.flow IS NULL", d.rx_any),
        "partial" => "false".into(),
        "recovered" => format!("({}) AND NOT ({})", d.rx_any, d.rx_any_kernel),
        "duplicate" => "coalesce(d.copies, 0) > 1".into(),
        "duplicate_skew_ns" => "CASE WHEN d.copies > 1 THEN d.skew END".into(),
        "reordered" => format!(
            "coalesce({w} > min({w}) OVER (PARTITION BY p.flow, p.kind ORDER BY p.useq ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), false)",
            w = d.rx_wire
        ),
        "retransmitted" => "coalesce(sn.sends, 0) > 1".into(),
        "deadline_missed" => deadline.clone(),
        "sample_weight" => weight.into(),
        other => unreachable!("packets column {other} has no expression"),
    });
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TABLE packets AS
         SELECT {columns}
         FROM pk p JOIN ends e USING (flow)
         LEFT JOIN ({dup_source}) d USING (flow, kind, useq)
         LEFT JOIN ({sends_source}) sn USING (flow, kind, useq)
         LEFT JOIN ({addr_source}) fa USING (flow)
         LEFT JOIN (SELECT DISTINCT flow FROM pk p WHERE {rx_seen}) rs ON rs.flow = p.flow
         ORDER BY p.flow, p.kind, p.useq;"
    ))?;
    Ok(())
}

/// Packets, lost, untraced, recovered, duplicates, reordered, partial.
type Counts = (i64, i64, i64, i64, i64, i64, i64);

fn count_packets(conn: &Connection) -> Result<Counts> {
    Ok(conn.query_row(
        "SELECT count(*), count(*) FILTER (WHERE lost), count(*) FILTER (WHERE untraced),
                count(*) FILTER (WHERE recovered),
                count(*) FILTER (WHERE duplicate), count(*) FILTER (WHERE reordered),
                count(*) FILTER (WHERE partial) FROM packets",
        [],
        |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
                r.get(6)?,
            ))
        },
    )?)
}

/// Flows no traced socket received, though the receiving host's device
/// points stamped them: where the socket hook that tells a traced socket's
/// datagrams from an untraced one's is missing (a kernel before 6.12
/// keeps them, said in run.json), the datagrams an untraced SO_REUSEPORT
/// sibling read have device stamps only. They are `untraced` like those
/// with no receiving stamp at all, with no end-to-end latency: counted
/// delivered, their e2e ended at a device point.
fn mark_untraced(conn: &Connection, cols: &[(String, String)]) -> Result<()> {
    let at_socket: Vec<String> = cols
        .iter()
        .filter(|(c, side)| side == "rx" && !c.starts_with("dev_"))
        .map(|(c, _)| format!("{} IS NOT NULL", sql::ident(c)))
        .collect();
    let at_device = cols
        .iter()
        .any(|(c, side)| side == "rx" && c.starts_with("dev_"));
    if at_socket.is_empty() || !at_device {
        return Ok(());
    }
    conn.execute_batch(&format!(
        "UPDATE packets SET untraced = true, lost = false, recovered = false,
                e2e_ns = NULL, receiver_total_ns = NULL, xlap_e2e_ns = NULL
         WHERE NOT untraced AND flow NOT IN (SELECT DISTINCT flow FROM packets WHERE {});",
        at_socket.join(" OR ")
    ))?;
    Ok(())
}

/// `a OR b OR ...`, or `false` for no term.
fn any_of(terms: impl Iterator<Item = String>) -> String {
    let terms: Vec<String> = terms.collect();
    if terms.is_empty() {
        "false".to_string()
    } else {
        terms.join(" OR ")
    }
}

/// Packets in flight when a point's recording began or ended: a point
/// the packets of its kind pass (nine in ten of those stamped on that
/// side) is missing, no later packet of the flow has it (the point had
/// stopped), or at a start no earlier one (it had not begun), and the
/// packet was under way then: a cut (a run's or a segment's start or end,
/// run.json `window`) lies within the longest a whole packet of its kind
/// took from its first stamp to its last, or, at an end, the point is its
/// side's last and the packet was stamped on that side (the receiver
/// stopped reading). They are `partial`, not `lost` (a packet sent an
/// instant before the end was not lost; a flow's last ones that never
/// arrived long before it were), with no end-to-end latency, nor the total
/// of a side they lack a point of. Returns, per point, the partial packets
/// lacking it. A point missing between packets that have it is a loss of
/// that point, not a cut.
fn mark_partial(
    conn: &Connection,
    runs: &[Run],
    cols: &[(String, String)],
) -> Result<BTreeMap<String, u64>> {
    if cols.is_empty() {
        return Ok(BTreeMap::new());
    }
    load_cuts(conn, runs)?;
    let expected = expected_kinds(conn, cols)?;
    let finals = final_kinds(cols, &expected);
    let lacks = lack_terms(cols, &expected, &finals);
    if lacks.is_empty() {
        return Ok(BTreeMap::new());
    }
    mark_cut_packets(conn, cols, &lacks)?;
    let counts: Vec<String> = lacks
        .iter()
        .map(|(i, _)| format!("count(*) FILTER (WHERE lacks_{i})"))
        .collect();
    let lacking = conn.query_row(
        &format!("SELECT {} FROM cut_packets", counts.join(", ")),
        [],
        |r| {
            let mut by_point = BTreeMap::new();
            for (j, (i, _)) in lacks.iter().enumerate() {
                let n: i64 = r.get(j)?;
                if n > 0 {
                    by_point.insert(cols[*i].0.clone(), n as u64);
                }
            }
            Ok(by_point)
        },
    )?;
    conn.execute_batch("DROP TABLE cut_packets;")?;
    Ok(lacking)
}

/// Per point column: the kinds whose packets pass it (nine in ten of the
/// packets of the kind stamped on the point's side have it).
fn expected_kinds(conn: &Connection, cols: &[(String, String)]) -> Result<Vec<Vec<i64>>> {
    // Per kind and side: the packets stamped on that side, and how many
    // of them each point of the side has.
    let side_any = |side: &str| {
        any_of(
            cols.iter()
                .filter(|(_, s)| s == side)
                .map(|(c, _)| format!("{} IS NOT NULL", sql::ident(c))),
        )
    };
    let reach: Vec<String> = cols
        .iter()
        .map(|(c, _)| format!("count({})", sql::ident(c)))
        .collect();
    let mut stmt = conn.prepare(&format!(
        "SELECT coalesce(kind::BIGINT, -1), count(*) FILTER (WHERE {}), count(*) FILTER (WHERE {}), {}
         FROM packets WHERE NOT untraced GROUP BY ALL",
        side_any("tx"),
        side_any("rx"),
        reach.join(", ")
    ))?;
    let mut expected: Vec<Vec<i64>> = vec![Vec::new(); cols.len()];
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let kind: i64 = r.get(0)?;
        let on_side = [r.get::<_, i64>(1)?, r.get::<_, i64>(2)?];
        for (i, (_, side)) in cols.iter().enumerate() {
            let n = on_side[usize::from(side == "rx")];
            let reached: i64 = r.get(3 + i)?;
            if n > 0 && reached * 10 >= n * 9 {
                expected[i].push(kind);
            }
        }
    }
    Ok(expected)
}

/// Per point column: the kinds for which it is the last point of its side
/// that their packets pass (the columns are in path order).
fn final_kinds(cols: &[(String, String)], expected: &[Vec<i64>]) -> Vec<Vec<i64>> {
    let mut finals: Vec<Vec<i64>> = vec![Vec::new(); cols.len()];
    let kinds: BTreeSet<i64> = expected.iter().flatten().copied().collect();
    for kind in kinds {
        for side in ["tx", "rx"] {
            let last = (0..cols.len())
                .rev()
                .find(|&i| cols[i].1 == side && expected[i].contains(&kind));
            if let Some(i) = last {
                finals[i].push(kind);
            }
        }
    }
    finals
}

/// Per point column its packets pass: the SQL term `lacks_I`, true for a
/// packet whose lack of the point a cut explains. The end of a point's
/// recording cut a packet that lacks it when the packet was under way at a
/// run's or segment's end, or when it is its side's last point and the
/// packet was under way on that side (the receiver stopped reading); its
/// start, when the packet was under way at a run's start (a flow's first
/// packets lacking a point, long after the start, lost it).
fn lack_terms(
    cols: &[(String, String)],
    expected: &[Vec<i64>],
    finals: &[Vec<i64>],
) -> Vec<(usize, String)> {
    // Under way on a side: stamped there by some point.
    let on_side = |side: &str| {
        any_of(
            cols.iter()
                .filter(|(_, s)| s == side)
                .map(|(c, _)| format!("p.{} IS NOT NULL", sql::ident(c))),
        )
    };
    let list = |kinds: &[i64]| {
        if kinds.is_empty() {
            "NULL".to_string()
        } else {
            kinds
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    };
    expected
        .iter()
        .enumerate()
        .filter(|(_, kinds)| !kinds.is_empty())
        .map(|(i, kinds)| {
            let c = sql::ident(&cols[i].0);
            let kind = "coalesce(p.kind::BIGINT, -1)";
            (
                i,
                format!(
                    "(p.{c} IS NULL AND {kind} IN ({kinds})
                      AND (p.seq > r.last_{i} AND (p.at_cut OR {kind} IN ({finals}) AND ({under_way}))
                           OR p.seq < r.first_{i} AND p.at_cut)) AS lacks_{i}",
                    kinds = list(kinds),
                    finals = list(&finals[i]),
                    under_way = on_side(&cols[i].1),
                ),
            )
        })
        .collect()
}

/// `cut_packets`: the packets a cut explains (terms `lacks`), marked
/// partial in `packets`. Under way at a cut: a cut lies within the kind's
/// longest whole packet of its stamps.
fn mark_cut_packets(
    conn: &Connection,
    cols: &[(String, String)],
    lacks: &[(usize, String)],
) -> Result<()> {
    let spans: Vec<String> = lacks
        .iter()
        .map(|(i, _)| {
            let c = sql::ident(&cols[*i].0);
            format!("min(seq) FILTER (WHERE {c} IS NOT NULL) AS first_{i}, max(seq) FILTER (WHERE {c} IS NOT NULL) AS last_{i}")
        })
        .collect();
    let stamped: Vec<String> = cols
        .iter()
        .map(|(c, _)| format!("p.{}", sql::ident(c)))
        .collect();
    let (first, last) = (
        format!("list_min([{}])", stamped.join(", ")),
        format!("list_max([{}])", stamped.join(", ")),
    );
    let lack_of = |side: &str| {
        any_of(
            lacks
                .iter()
                .filter(|(i, _)| cols[*i].1 == side)
                .map(|(i, _)| format!("lacks_{i}")),
        )
    };
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE cut_packets AS
         SELECT * FROM (
             SELECT p.flow, p.kind, p.seq, {lacks}
             FROM (SELECT p.*, EXISTS (SELECT 1 FROM cuts c
                                       WHERE c.t BETWEEN {first} - h.ns AND {last} + h.ns) AS at_cut
                   FROM packets p
                   LEFT JOIN (SELECT coalesce(kind::BIGINT, -1) AS k,
                                     coalesce(max({last} - {first}), 0) AS ns
                              FROM packets p WHERE e2e_ns IS NOT NULL GROUP BY ALL) h
                     ON h.k = coalesce(p.kind::BIGINT, -1)) p
             JOIN (SELECT flow, kind, {spans} FROM packets GROUP BY flow, kind) r
               ON r.flow = p.flow AND r.kind IS NOT DISTINCT FROM p.kind
             WHERE NOT p.untraced)
         WHERE {any};
         UPDATE packets p SET partial = true, lost = false, e2e_ns = NULL, xlap_e2e_ns = NULL,
                sender_total_ns = CASE WHEN {tx} THEN NULL ELSE p.sender_total_ns END,
                receiver_total_ns = CASE WHEN {rx} THEN NULL ELSE p.receiver_total_ns END
         FROM cut_packets c
         WHERE c.flow = p.flow AND c.kind IS NOT DISTINCT FROM p.kind AND c.seq = p.seq;",
        lacks = lacks
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join(",\n                    "),
        spans = spans.join(", "),
        any = any_of(lacks.iter().map(|(i, _)| format!("lacks_{i}"))),
        tx = lack_of("tx"),
        rx = lack_of("rx"),
    ))?;
    Ok(())
}

/// `cuts`: the instants the runs' recordings began and ended (run.json
/// `window`; runs recorded before it was kept have none), on the
/// reference clock.
fn load_cuts(conn: &Connection, runs: &[Run]) -> Result<()> {
    conn.execute_batch("CREATE OR REPLACE TEMP TABLE cuts (domain VARCHAR, ts_ns BIGINT);")?;
    let mut stmt = conn.prepare("INSERT INTO cuts VALUES (?, ?)")?;
    for r in runs {
        let Some(w) = r.meta.window else { continue };
        for ts in std::iter::once(w.from_ns).chain(w.until_ns) {
            // Within the engine's BIGINT (run.json holds any u64).
            if let Ok(ts) = i64::try_from(ts) {
                stmt.execute(duckdb::params![r.boot_id(), ts])?;
            }
        }
    }
    conn.execute_batch(
        "CREATE OR REPLACE TEMP TABLE cuts AS
         SELECT (ts_ns - c.offset_ns - c.drift_ppm * 1e-6 * (ts_ns - c.offset_ns - c.t0_ns))::BIGINT AS t
         FROM cuts JOIN clocks c USING (domain);",
    )?;
    Ok(())
}

/// The path as the packets show it ([`xlap_records::stages`]).
struct Paths {
    /// The point columns in the order of the table: the order over every
    /// kind and both sides (each side's points keep their path order).
    layout: Vec<(String, String)>,
    /// Every stage some packet has, per kind along that kind's order.
    stages: Vec<StageColumn>,
    conflicts: Vec<String>,
}

/// Per kind: (kind, precedence counts over both sides, the point sets its
/// packets present).
type KindCounts = (
    Option<i64>,
    xlap_records::stages::Precedence<String>,
    Vec<Vec<bool>>,
);

/// Positions by name: looked up per pair and per packet's stage, where a
/// scan of the list grew with a power of the points.
fn index_of(names: impl Iterator<Item = impl AsRef<str>>) -> HashMap<String, usize> {
    names
        .enumerate()
        .map(|(i, c)| (c.as_ref().to_string(), i))
        .collect()
}

/// Path orders from pairwise precedence counts over the packets having
/// both points (`pk`, one row per packet), and the stages the packets'
/// sets of points present make along them. `hint` (the point columns with
/// their sides, by median offset) orders only points that never met.
fn path_orders(conn: &Connection, hint: &[(String, String)]) -> Result<Paths> {
    use xlap_records::stages::Precedence;
    let kinds = kind_counts(conn, hint)?;
    let hint_index = index_of(hint.iter().map(|(c, _)| c));
    let hint_pos = |c: &String| hint_index.get(c.as_str()).copied();
    // The table's layout: one order over every kind and both sides.
    let mut all = Precedence::default();
    for (c, _) in hint {
        all.point(c);
    }
    for (_, prec, _) in &kinds {
        for a in prec.points() {
            for b in prec.points() {
                all.count(a, b, prec.before(a, b));
            }
        }
    }
    let layout_order = all.order(|a, b| hint_pos(a).cmp(&hint_pos(b))).order;
    let side_of = |c: &String| hint_pos(c).map(|i| hint[i].1.clone());
    let layout: Vec<(String, String)> = layout_order
        .iter()
        .map(|c| (c.clone(), side_of(c).unwrap_or_default()))
        .collect();
    let layout_index = index_of(layout_order.iter());
    let layout_pos = |c: &String| layout_index.get(c.as_str()).copied();
    let (mut stages, conflicts) = stage_columns(hint, &kinds, &layout_index);
    // Sender stages first, then the receiver's, each along the layout.
    stages.sort_by_key(|s| {
        (
            side_of(&s.a).as_deref() != Some("tx"),
            layout_pos(&s.a),
            layout_pos(&s.b),
        )
    });
    Ok(Paths {
        layout,
        stages,
        conflicts,
    })
}

/// Per kind, the pairwise precedence of its points (from each packet's
/// first stamp at each column, `s5`) and the point sets of its packets
/// (`pk`).
fn kind_counts(conn: &Connection, hint: &[(String, String)]) -> Result<Vec<KindCounts>> {
    use xlap_records::stages::Precedence;
    let col = |i: usize| format!("p.{}", sql::ident(&hint[i].0));
    let mask = (0..hint.len())
        .map(|i| format!("CASE WHEN {} IS NULL THEN '0' ELSE '1' END", col(i)))
        .collect::<Vec<_>>()
        .join(" || ");
    let mut kinds: Vec<KindCounts> = Vec::new();
    let mut stmt = conn.prepare(&format!(
        "SELECT p.kind::BIGINT, {mask} FROM pk p GROUP BY ALL ORDER BY 1, 2"
    ))?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let kind: Option<i64> = r.get(0)?;
        let m: String = r.get(1)?;
        if kinds.last().is_none_or(|k| k.0 != kind) {
            let mut prec = Precedence::default();
            for (c, _) in hint {
                prec.point(c);
            }
            kinds.push((kind, prec, Vec::new()));
        }
        let k = kinds.last_mut().expect("pushed");
        k.2.push(m.bytes().map(|b| b == b'1').collect());
    }
    // Pairs within each packet, from its first stamp at each column: rows
    // as many as the packets' pairs of points, where a column per pair
    // (count FILTER) made the engine's plan grow with the fourth power of
    // the points (40 points: out of memory).
    let mut stmt = conn.prepare(
        "WITH l AS (SELECT flow, kind, useq, col, min(t) AS t FROM s5 GROUP BY ALL)
         SELECT a.kind::BIGINT, a.col, b.col, count(*)
         FROM l a JOIN l b ON a.flow = b.flow AND a.kind IS NOT DISTINCT FROM b.kind AND a.useq = b.useq AND a.t < b.t
         GROUP BY ALL",
    )?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let kind: Option<i64> = r.get(0)?;
        let (a, b): (String, String) = (r.get(1)?, r.get(2)?);
        let n: i64 = r.get(3)?;
        if let Some(k) = kinds.iter_mut().find(|k| k.0 == kind) {
            k.1.count(&a, &b, n as u64);
        }
    }
    Ok(kinds)
}

/// The stages each kind's packets make along its order on each side (ties
/// broken by the layout), and the conflicts of those orders.
fn stage_columns(
    hint: &[(String, String)],
    kinds: &[KindCounts],
    layout_index: &HashMap<String, usize>,
) -> (Vec<StageColumn>, Vec<String>) {
    use xlap_records::stages::{self, Precedence};
    let hint_index = index_of(hint.iter().map(|(c, _)| c));
    let hint_pos = |c: &String| hint_index.get(c.as_str()).copied();
    let layout_pos = |c: &String| layout_index.get(c.as_str()).copied();
    let mut stage_cols: Vec<StageColumn> = Vec::new();
    let mut stage_index: HashMap<(String, String), usize> = HashMap::new();
    let mut conflicts = Vec::new();
    for (kind, prec, masks) in kinds {
        let literal = kind.map_or("NULL".to_string(), |k| k.to_string());
        for side in ["tx", "rx"] {
            // This kind's points of this side: those some packet has.
            let mut own = Precedence::default();
            for (i, (c, s)) in hint.iter().enumerate() {
                if s == side && masks.iter().any(|m| m[i]) {
                    own.point(c);
                }
            }
            let points = own.points().to_vec();
            for a in &points {
                for b in &points {
                    own.count(a, b, prec.before(a, b));
                }
            }
            let order = own.order(|a, b| layout_pos(a).cmp(&layout_pos(b)));
            for c in &order.conflicts {
                conflicts.push(format!(
                    "kind {literal} {side}: {} before {} in {} packets, after it in {}",
                    c.first, c.then, c.agreeing, c.against
                ));
            }
            let order_pos = index_of(order.order.iter());
            for m in masks {
                let present = |c: &String| hint_pos(c).is_some_and(|i| m[i]);
                for (a, b) in stages::stages(&order.order, present) {
                    let (ia, ib) = (order_pos[a.as_str()], order_pos[b.as_str()]);
                    let at = *stage_index
                        .entry((a.clone(), b.clone()))
                        .or_insert_with(|| {
                            stage_cols.push(StageColumn {
                                a: a.clone(),
                                b: b.clone(),
                                cases: Vec::new(),
                            });
                            stage_cols.len() - 1
                        });
                    let s = &mut stage_cols[at];
                    if !s.cases.iter().any(|(k, _)| k.as_deref() == Some(&literal)) {
                        s.cases
                            .push((Some(literal.clone()), order.order[ia + 1..ib].to_vec()));
                    }
                }
            }
        }
    }
    (stage_cols, conflicts)
}

/// The fallback mapping: both hosts' (monotonic, realtime) pairs, exact only
/// as far as their realtime clocks agree.
fn realtime_mapping(reference: &Run, other: &Run) -> Mapping {
    let (ma, ra) = reference.clock_pair();
    let (mb, rb) = other.clock_pair();
    // mono_B − mono_A at one instant = (ra − ma) − (rb − mb).
    let sync = |r: &Run| {
        let s = r.meta.clock_sync;
        s.synchronized.then_some(s.maxerror_us as f64)
    };
    let uncertainty = match (sync(reference), sync(other)) {
        (Some(a), Some(b)) => Some((a + b) * 1e3),
        _ => None,
    };
    let mut method: String = if uncertainty.is_some() {
        "realtime clock pairs (both hosts report synchronised clocks; bound = sum of their max errors)".into()
    } else {
        "realtime clock pairs (no two-way traffic; clocks not known to be synchronised: uncertainty unknown)".into()
    };
    // A realtime step during either run: the pairs of the run's start hold
    // only until the step.
    let steps: Vec<String> = [reference, other]
        .iter()
        .flat_map(|r| {
            r.meta.clock_steps.iter().map(move |s| {
                format!(
                    "{}'s realtime clock stepped {:+.6} s during its run",
                    r.host(),
                    s.step_ns as f64 / 1e9
                )
            })
        })
        .collect();
    if !steps.is_empty() {
        method += &format!(
            "; WARNING: {}: the mapping is off by as much after the step",
            steps.join(", ")
        );
    }
    Mapping {
        domain: other.boot_id().to_string(),
        offset_ns: ((ra - ma) - (rb - mb)) as f64,
        drift_ppm: 0.0,
        t0_ns: 0,
        uncertainty_ns: uncertainty,
        drift_uncertainty_ppm: None,
        method,
        windows: 0,
    }
}

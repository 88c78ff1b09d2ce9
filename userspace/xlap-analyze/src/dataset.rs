//! What the analyses read: a run (or several) opened in DuckDB as the views
//! `packets`, `stamps`, `runs` and `tracer_points`, plus the helper views of
//! `queries/views.sql`, each checked so a bad input is named, not a panic.
//!
//! A RUN argument is one of
//! - a run directory written by `record` (`packets.parquet`, `run.json`,
//!   `stamps.parquet`); without `packets.parquet` its stamps are correlated
//!   on the fly;
//! - a directory of run directories (the hosts of one connection), with or
//!   without a `packets.parquet` of its own (`correlate -o DIR/packets.parquet`);
//!   without, the runs are correlated on the fly, the first one's clock as
//!   the reference;
//! - a packets Parquet file (the output of `correlate`); `run.json` files
//!   beside it and in its sibling directories are its runs;
//! - a partitioned dataset (`xlap-trace dataset add`, crate::partitioned):
//!   the packets and stamps of every run, one population, with `run_id`
//!   from the partition; each `DIR/run_id=…` is a run as above.

use crate::sql;
use crate::{correlate, AnalyzeError, CorrelateOptions, Result, Run};
use duckdb::Connection;
use std::path::{Path, PathBuf};
use xlap_records::RunDir;

use xlap_records::schema::{
    PACKETS_SCHEMA_VERSION, PACKETS_SIDES_KEY as SIDES_KEY, PACKETS_VERSION_KEY as VERSION_KEY,
};

/// The `packets` view over `source` (the file, or the table correlated
/// here), the same for every reader:
/// - the packets of a layout without a kind field (`kind` null in the
///   file) are one kind, [`crate::KIND_ALL`]: joins and groups on a null
///   kind match nothing, which left such runs with empty tables;
/// - files written before the `untraced` and `partial` flags get them, false.
fn packets_view(conn: &Connection, source: &str) -> Result<()> {
    let mut added = String::new();
    for flag in ["untraced", "partial"] {
        let has: bool = conn.query_row(
            &format!(
                "SELECT count(*) > 0 FROM (DESCRIBE SELECT * FROM {source}) WHERE column_name = ?"
            ),
            [flag],
            |r| r.get(0),
        )?;
        if !has {
            added += &format!(", false AS {flag}");
        }
    }
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP VIEW packets AS SELECT * REPLACE (coalesce(kind::UBIGINT, {}) AS kind){added} FROM {source};",
        crate::KIND_ALL,
    ))?;
    Ok(())
}

const TOTALS: &[&str] = &["sender_total_ns", "receiver_total_ns", "e2e_ns"];

/// Columns of the packets schema (`xlap_records::schema::packets`) the
/// queries rely on: every packets table has them, those of the earliest
/// version 1 files included (a test holds them to the schema).
const REQUIRED: &[&str] = &[
    "flow",
    "kind",
    "seq",
    "sent_ns",
    "tx_host",
    "rx_host",
    "sender_total_ns",
    "channel_ns",
    "receiver_total_ns",
    "e2e_ns",
    "lost",
    "recovered",
];

/// The helper views over `packets` (long format of stages, path order).
pub use crate::views::VIEWS_SQL;

/// An opened dataset: what was found, for messages and reports.
#[derive(Clone, Debug)]
pub struct Dataset {
    /// The argument, for messages.
    pub source: String,
    pub run_files: Vec<PathBuf>,
    pub packets: u64,
    pub delivered: u64,
}

fn input(path: &Path, what: impl Into<String>) -> AnalyzeError {
    AnalyzeError::Input {
        path: path.display().to_string(),
        what: what.into(),
    }
}

/// Why a dataset is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// For the analyses: the stored tables of its packets file are read
    /// where they match it.
    Analyse,
    /// To compute the stored tables (crate::stored): the statements up to
    /// the last of them, from the packets.
    Store,
}

/// How `queries/views.sql`'s shared tables are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shared {
    /// Computed once on open: the bundled queries all read them.
    Materialized,
    /// As views, computed only by a query that reads them (`xlap-trace sql`,
    /// where most statements need none of them).
    Lazy,
}

/// Which end-to-end latency the analyses call `e2e_ns`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum E2e {
    /// First sender point to last receiver point (ours): the channel
    /// included, the two hosts' clocks mapped onto one.
    #[default]
    Wire,
    /// X-LAP's: sender total + receiver total, the channel left out, so no
    /// clock mapping enters it (each host's part on its own clock).
    Xlap,
}

/// What the analyses see of the packets table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub e2e: E2e,
    /// Only the packets at or below their kind's end-to-end fence (Q3 +
    /// 1.5·IQR of the chosen e2e), and the lost ones: X-LAP's box plots of
    /// the regular packets, which the outliers do not stretch.
    pub inliers: bool,
}

/// Opens `arg` in `conn` (an in-memory DuckDB), creating the views;
/// `progress` reports the time of each shared step on stderr.
pub fn open(conn: &Connection, arg: &Path, shared: Shared, progress: bool) -> Result<Dataset> {
    open_view(conn, arg, shared, progress, View::default())
}

/// [`open`], the packets seen through `view`.
pub fn open_view(
    conn: &Connection,
    arg: &Path,
    shared: Shared,
    progress: bool,
    view: View,
) -> Result<Dataset> {
    let how = Opening {
        shared,
        progress,
        view,
        both_ends: true,
        purpose: Purpose::Analyse,
    };
    open_checked(conn, arg, how)
}

/// [`open_view`] for the user's own SQL (`xlap-trace sql`): a run with one
/// end only (the sender's, every packet untraced) opens too, for the
/// questions it can answer; the bundled analyses refuse it.
pub fn open_one_end_ok(
    conn: &Connection,
    arg: &Path,
    shared: Shared,
    progress: bool,
    view: View,
) -> Result<Dataset> {
    let how = Opening {
        shared,
        progress,
        view,
        both_ends: false,
        purpose: Purpose::Analyse,
    };
    open_checked(conn, arg, how)
}

/// Opens the packets file `packets` to compute its stored tables
/// (crate::store::store): the statements of `views.sql` up to them, a run
/// with one end only included (its tables are empty).
pub(crate) fn open_for_store(conn: &Connection, packets: &Path) -> Result<Dataset> {
    let how = Opening {
        shared: Shared::Materialized,
        progress: false,
        view: View::default(),
        both_ends: false,
        purpose: Purpose::Store,
    };
    open_checked(conn, packets, how)
}

/// How a dataset is opened: its shared tables, whether each step's time is
/// said, the view of its packets, whether packets must have both ends, and
/// what for.
#[derive(Clone, Copy, Debug)]
struct Opening {
    shared: Shared,
    progress: bool,
    view: View,
    both_ends: bool,
    purpose: Purpose,
}

/// [`open_files`], a file the engine cannot read named as bad input.
fn open_checked(conn: &Connection, arg: &Path, how: Opening) -> Result<Dataset> {
    open_files(conn, arg, how).map_err(crate::unreadable_in(&[arg.to_path_buf()]))
}

fn open_files(conn: &Connection, arg: &Path, how: Opening) -> Result<Dataset> {
    let Opening {
        shared,
        progress,
        view,
        both_ends,
        purpose,
    } = how;
    let found = Found::at(arg)?;
    let run_files: Vec<PathBuf> = found.run_dirs.iter().map(RunDir::meta).collect();
    load_runs(conn, &run_files)?;
    let sides = found.packets_view(conn, arg, progress)?;
    // A packet is its (run_id, flow, kind, seq): the queries that follow a
    // flow's packets in order partition by run_key(run_id) too. It is the
    // run id in a dataset of runs only: one run has one, and carrying that
    // string through their sorts cost 10 M packets 0.4 s per query.
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP MACRO run_key(r) AS {};",
        if found.partitions.is_empty() {
            "NULL::VARCHAR"
        } else {
            "r"
        }
    ))?;
    check_kinds(conn, arg)?;
    name_kinds(conn)?;
    apply_view(conn, view)?;
    describe_columns(conn, &sides)?;
    found.stamps_view(conn)?;
    // The stored tables of a packets file read as it is (crate::stored).
    // A dataset's: the runs' stored value counts, summed.
    let stored = match (&found.packets_file, purpose) {
        (Some(file), Purpose::Analyse) if view == View::default() => {
            crate::stored::usable(conn, file)
        }
        (None, Purpose::Analyse) if view == View::default() && !found.partitions.is_empty() => {
            crate::stored::merged(conn, &found.partition_packets())
        }
        _ => Vec::new(),
    };
    if progress {
        say_unstored(&stored, found.packets_file.as_deref());
    }
    prepare_shared(conn, arg, &stored, shared, progress, purpose)?;
    // A dataset of runs takes each packet's predecessor partition by
    // partition (views.sql: one sort of all its packets runs out of the
    // engine's memory at 100 M); one run sorts its packets once.
    if !found.partitions.is_empty() {
        conn.execute_batch(
            "CREATE OR REPLACE TEMP MACRO send_gaps() AS TABLE FROM send_gaps_partitioned();
             CREATE OR REPLACE TEMP MACRO wire_gaps() AS TABLE FROM wire_gaps_partitioned();",
        )?;
    }
    let (packets, delivered) = counts_checked(conn, arg, purpose, both_ends)?;
    Ok(Dataset {
        source: arg.display().to_string(),
        run_files,
        packets,
        delivered,
    })
}

/// What a path given to an analysis holds: a partitioned dataset's runs,
/// a packets file, and the run directories whose metadata and stamps go
/// with them.
struct Found {
    /// The runs of a partitioned dataset (crate::partitioned), else none.
    partitions: Vec<PathBuf>,
    /// The packets file, when there is one to read as it is.
    packets_file: Option<PathBuf>,
    run_dirs: Vec<RunDir>,
}

impl Found {
    fn at(arg: &Path) -> Result<Found> {
        if !arg.exists() {
            return Err(input(
                arg,
                "no such file or directory (give a run directory written by `xlap-trace record`, a directory of runs, or a packets.parquet)",
            ));
        }
        // A partitioned dataset: every run's packets and recordings,
        // run_id taken from the partition as Spark takes it.
        let partitions = crate::layout::runs_of(arg);
        if !partitions.is_empty() {
            let run_dirs = partitions
                .iter()
                .flat_map(|r| crate::layout::recorders_of(r))
                .collect();
            return Ok(Found {
                partitions,
                packets_file: None,
                run_dirs,
            });
        }
        if arg.is_file() {
            let parent = arg
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            let mut run_dirs = crate::layout::run_dirs_in(parent);
            let own_run = RunDir::new(parent);
            if own_run.is_run() {
                run_dirs.insert(0, own_run);
            }
            return Ok(Found {
                partitions,
                packets_file: Some(arg.to_path_buf()),
                run_dirs,
            });
        }
        let files = RunDir::new(arg);
        let own = files.packets();
        let mut run_dirs = Vec::new();
        if files.is_run() {
            run_dirs.push(files);
        }
        run_dirs.extend(crate::layout::run_dirs_in(arg));
        if !own.is_file() && run_dirs.is_empty() {
            return Err(input(
                arg,
                "not an xlap-trace run: no packets.parquet, no run.json here or in its subdirectories (record one with `xlap-trace record --pid PID -o DIR`)",
            ));
        }
        Ok(Found {
            partitions,
            packets_file: own.is_file().then_some(own),
            run_dirs,
        })
    }

    /// A dataset's packets: each run's file.
    fn partition_packets(&self) -> Vec<PathBuf> {
        self.partitions
            .iter()
            .map(|r| RunDir::new(r).packets())
            .collect()
    }

    /// The `packets` view over what was found (its files checked, or the
    /// runs correlated here); returns each point column's side.
    fn packets_view(
        &self,
        conn: &Connection,
        arg: &Path,
        progress: bool,
    ) -> Result<Vec<(String, String)>> {
        if let Some(file) = &self.packets_file {
            let sides = check_packets_file(conn, file)?;
            packets_view(conn, &format!("read_parquet({})", sql::path(file)))?;
            return Ok(sides);
        }
        if !self.partitions.is_empty() {
            let (sides, groups) = check_packets_files(conn, &self.partition_packets())?;
            packets_view(conn, &dataset_packets(&groups))?;
            if progress {
                eprintln!(
                    "xlap-trace: a dataset of {} runs, analysed as one population (name one, {}/{}=…, to analyse it alone)",
                    self.partitions.len(),
                    arg.display(),
                    crate::layout::RUN_KEY
                );
            }
            return Ok(sides);
        }
        let runs = self
            .run_dirs
            .iter()
            .map(Run::open)
            .collect::<Result<Vec<_>>>()?;
        let c = correlate(conn, &runs, &CorrelateOptions::default(), None)?;
        conn.execute_batch("ALTER TABLE packets RENAME TO packets_correlated;")?;
        packets_view(conn, "packets_correlated")?;
        Ok(c.points.into_iter().zip(c.point_sides).collect())
    }

    /// The `stamps` view over the runs' stamps files (each checked whole).
    fn stamps_view(&self, conn: &Connection) -> Result<()> {
        let files: Vec<PathBuf> = self
            .run_dirs
            .iter()
            .map(RunDir::stamps)
            .filter(|p| p.is_file())
            .collect();
        for d in self.run_dirs.iter().filter(|d| d.stamps().is_file()) {
            crate::runs::stamps_whole(d).map_err(|why| input(d.path(), why))?;
        }
        if files.is_empty() {
            return Ok(());
        }
        let hive = if self.partitions.is_empty() {
            ""
        } else {
            ", hive_partitioning = true, union_by_name = true"
        };
        let list: Vec<String> = files.iter().map(|p| sql::path(p)).collect();
        conn.execute_batch(&format!(
            "CREATE OR REPLACE TEMP VIEW stamps AS SELECT * FROM read_parquet([{}]{hive});",
            list.join(", ")
        ))?;
        Ok(())
    }
}

/// Says which stored tables were not usable, and why (they are computed
/// from the packets instead).
fn say_unstored(
    stored: &[(&str, std::result::Result<String, String>)],
    packets_file: Option<&Path>,
) {
    for (name, how) in stored {
        if let Err(why) = how {
            match packets_file {
                Some(file) => eprintln!(
                    "xlap-trace: {name} computed from the packets, not read from {}: {why}",
                    crate::stored::path(file, name).display()
                ),
                None => eprintln!(
                    "xlap-trace: {name} computed from the packets, not from the runs' stored tables: {why}"
                ),
            }
        }
    }
}

/// The shared statements of `views.sql` (tables every analysis reads),
/// each from its stored table where one is usable; for `Purpose::Store`,
/// only those up to the last stored table.
fn prepare_shared(
    conn: &Connection,
    arg: &Path,
    stored: &[(&str, std::result::Result<String, String>)],
    shared: Shared,
    progress: bool,
    purpose: Purpose,
) -> Result<()> {
    let mut to_store: Vec<&str> = crate::stored::TABLES.to_vec();
    for stmt in crate::views::shared_statements() {
        let t0 = std::time::Instant::now();
        let name = crate::views::statement_name(stmt);
        let from = stored
            .iter()
            .find(|(n, _)| Some(*n) == name)
            .and_then(|(_, how)| how.as_ref().ok());
        let stmt = match from {
            Some(from) => crate::stored::load_statement(name.unwrap_or("?"), from),
            None => stmt.to_string(),
        };
        let stmt = match shared {
            Shared::Materialized => stmt,
            Shared::Lazy => stmt.replace(
                "CREATE OR REPLACE TEMP TABLE",
                "CREATE OR REPLACE TEMP VIEW",
            ),
        };
        conn.execute_batch(&stmt).map_err(|e| {
            input(
                arg,
                format!("queries/views.sql failed on this packets table: {e}"),
            )
        })?;
        // A step read from a stored table is said (the run's aggregates
        // were used); one prepared is said only when it was long.
        if progress && (from.is_some() || t0.elapsed() >= crate::LONG_STEP) {
            eprintln!(
                "xlap-trace: {} {} in {:.2} s",
                if from.is_some() { "read" } else { "prepared" },
                name.unwrap_or("?"),
                t0.elapsed().as_secs_f64()
            );
        }
        // Computing the stored tables needs the statements up to the
        // last of them, not the outliers after.
        to_store.retain(|t| Some(*t) != name);
        if purpose == Purpose::Store && to_store.is_empty() {
            break;
        }
    }
    Ok(())
}

/// The packets and the delivered among them; an analysis of no packet, or
/// (where both ends are needed) of none delivered, is bad input.
fn counts_checked(
    conn: &Connection,
    arg: &Path,
    purpose: Purpose,
    both_ends: bool,
) -> Result<(u64, u64)> {
    let (packets, delivered): (i64, i64) = conn.query_row(
        "SELECT count(*), count(*) FILTER (WHERE e2e_ns IS NOT NULL) FROM packets",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    if packets == 0 && purpose == Purpose::Analyse {
        return Err(input(
            arg,
            "the run has no packets (no stamp carried a sequence number: check --proto or --seq-offset, and that the pids sent traffic while recording)",
        ));
    }
    if delivered == 0 && both_ends {
        return Err(input(
            arg,
            format!(
                "none of its {packets} packets has stamps from both ends, so there is no end-to-end latency: record the sender's and the receiver's pids (in one run, or two runs correlated with `xlap-trace correlate A B`)"
            ),
        ));
    }
    Ok((packets as u64, delivered as u64))
}

/// Puts `view` between the packets (a view of the file or of the table
/// correlated here) and everything that reads `packets`.
fn apply_view(conn: &Connection, view: View) -> Result<()> {
    if view == View::default() {
        return Ok(());
    }
    conn.execute_batch("ALTER VIEW packets RENAME TO packets_all;")?;
    let e2e = match view.e2e {
        E2e::Wire => "",
        E2e::Xlap => "REPLACE (sender_total_ns + receiver_total_ns AS e2e_ns)",
    };
    let filter = if view.inliers {
        "SELECT p.* FROM p LEFT JOIN (
             SELECT kind, quantile_cont(e2e_ns, 0.75) + 1.5 * (quantile_cont(e2e_ns, 0.75) - quantile_cont(e2e_ns, 0.25)) AS fence
             FROM p WHERE e2e_ns IS NOT NULL GROUP BY kind
         ) f USING (kind)
         WHERE p.e2e_ns IS NULL OR p.e2e_ns <= f.fence"
    } else {
        "SELECT * FROM p"
    };
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP VIEW packets AS WITH p AS (SELECT * {e2e} FROM packets_all) {filter};"
    ))?;
    Ok(())
}

/// `point_columns` (col, point, side, position) and `stage_columns` (col,
/// stage, side, position): sender stages in path order, the channel,
/// receiver stages, then the totals. (The stored tables hold these:
/// raise `stored::FORMAT` when what they hold changes.)
fn describe_columns(conn: &Connection, sides: &[(String, String)]) -> Result<()> {
    let mut stmt = conn.prepare("SELECT column_name FROM (DESCRIBE SELECT * FROM packets)")?;
    let cols: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<std::result::Result<_, _>>()?;
    let side_of = |col: &str| sides.iter().find(|(c, _)| c == col).map(|(_, s)| s.clone());
    conn.execute_batch(
        "CREATE OR REPLACE TEMP TABLE point_columns (col VARCHAR, point VARCHAR, side VARCHAR, position INTEGER);
         CREATE OR REPLACE TEMP TABLE stage_columns (col VARCHAR, stage VARCHAR, side VARCHAR, position INTEGER);",
    )?;
    for (i, (col, side)) in sides.iter().enumerate() {
        if cols.contains(col) {
            let point = xlap_records::points::point_of_column(col);
            conn.execute(
                "INSERT INTO point_columns VALUES (?, ?, ?, ?)",
                duckdb::params![col, point, side, i as i32],
            )?;
        }
    }
    let mut stages: Vec<(String, String)> = Vec::new();
    for side in ["tx", "rx"] {
        if side == "rx" && cols.iter().any(|c| c == "channel_ns") {
            stages.push(("channel_ns".into(), "channel".into()));
        }
        // A point whose own name holds `__` is a point, not a stage.
        for col in cols
            .iter()
            .filter(|c| c.contains("__") && c.ends_with("_ns") && side_of(c).is_none())
        {
            let first = format!("{}_ns", col.split("__").next().unwrap_or_default());
            if side_of(&first).as_deref().unwrap_or("tx") == side {
                // Off the path (a sender's stage after its wire point): its
                // own side, so that the path's stages sum to the totals.
                let second = col
                    .split_once("__")
                    .map_or(String::new(), |(_, b)| b.to_string());
                let s = if side == "tx" {
                    xlap_records::Side::Tx
                } else {
                    xlap_records::Side::Rx
                };
                // The table's column order is the path order (the sides
                // map of a packets file is not: a JSON object, sorted).
                let order: Vec<&String> = cols
                    .iter()
                    .filter(|c| side_of(c).as_deref() == Some(side))
                    .collect();
                let part = xlap_records::stages::part(
                    s,
                    &order,
                    |c| xlap_records::stages::wire_rank(s, c),
                    &&first,
                    &&second,
                );
                stages.push((col.clone(), part.label(s).into()));
            }
        }
    }
    stages.extend(
        TOTALS
            .iter()
            .filter(|t| cols.iter().any(|c| c == *t))
            .map(|t| (t.to_string(), "total".to_string())),
    );
    for (i, (col, side)) in stages.iter().enumerate() {
        let stage = col.trim_end_matches("_ns");
        conn.execute(
            "INSERT INTO stage_columns VALUES (?, ?, ?, ?)",
            duckdb::params![col, stage, side, i as i32],
        )?;
    }
    Ok(())
}

/// A Parquet file of ours, of a version we read, with the columns we need;
/// returns the sides of its point columns.
fn check_packets_file(conn: &Connection, file: &Path) -> Result<Vec<(String, String)>> {
    let kv: std::result::Result<Vec<(String, String)>, duckdb::Error> = (|| {
        let mut stmt = conn.prepare(&format!(
            "SELECT decode(key), decode(value) FROM parquet_kv_metadata({})",
            sql::path(file)
        ))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    })();
    let kv = kv.map_err(|e| {
        input(
            file,
            format!("not a readable Parquet file ({}); give the packets.parquet written by `xlap-trace record` or `correlate`", first_line(&e.to_string())),
        )
    })?;
    let mut stmt = conn.prepare(&format!(
        "SELECT column_name FROM (DESCRIBE SELECT * FROM read_parquet({}))",
        sql::path(file)
    ))?;
    let cols: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<std::result::Result<_, _>>()?;
    validate_packets(file, &kv, &cols)
}

/// The side (tx, rx) of each point column of a packets table.
type Sides = Vec<(String, String)>;

/// [`check_packets_file`] for many files (a dataset's runs): their footers
/// read by two queries, not two per file; the sides of every file's point
/// columns, each once. A file the joint reading cannot take is checked
/// alone, which names it. Also returns the files in groups of one schema
/// (column names and types in order), for [`dataset_packets`].
fn check_packets_files(conn: &Connection, files: &[PathBuf]) -> Result<(Sides, Vec<Vec<PathBuf>>)> {
    let list = sql::paths(files);
    let joint = (|| -> std::result::Result<_, duckdb::Error> {
        let mut kv: std::collections::HashMap<String, Vec<(String, String)>> = Default::default();
        let mut stmt = conn.prepare(&format!(
            "SELECT file_name, decode(key), decode(value) FROM parquet_kv_metadata([{list}])"
        ))?;
        for row in stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?)))? {
            let (f, k, v) = row?;
            kv.entry(f).or_default().push((k, v));
        }
        let mut cols: std::collections::HashMap<String, (Vec<String>, String)> = Default::default();
        let mut stmt = conn.prepare(&format!(
            "SELECT file_name, name, concat_ws(' ', type, converted_type, logical_type)
             FROM parquet_schema([{list}]) WHERE num_children IS NULL"
        ))?;
        for row in stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get(1)?, r.get::<_, String>(2)?))
        })? {
            let (f, c, t) = row?;
            let e = cols.entry(f).or_default();
            e.1 += &format!("{c} {t},");
            e.0.push(c);
        }
        Ok((kv, cols))
    })();
    let mut sides: Vec<(String, String)> = Vec::new();
    let mut groups: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for file in files {
        let name = crate::absolute(file).display().to_string();
        let (these, schema) = match &joint {
            Ok((kv, cols)) => match (kv.get(&name), cols.get(&name)) {
                (Some(kv), Some((cols, schema))) => {
                    (validate_packets(file, kv, cols)?, schema.clone())
                }
                _ => (check_packets_file(conn, file)?, name.clone()),
            },
            Err(_) => (check_packets_file(conn, file)?, name.clone()),
        };
        for side in these {
            if !sides.contains(&side) {
                sides.push(side);
            }
        }
        match groups.iter_mut().find(|(s, _)| *s == schema) {
            Some((_, g)) => g.push(file.clone()),
            None => groups.push((schema, vec![file.clone()])),
        }
    }
    Ok((sides, groups.into_iter().map(|(_, g)| g).collect()))
}

/// The packets of a dataset's runs as one relation, `run_id` from the
/// partition: one `read_parquet` per schema, joined by name. One reading
/// of every file with `union_by_name` opened each file again at every
/// statement that binds the view (58 times each: 8.5 s for 500 runs); a
/// reading of files of one schema opens only the first to bind.
fn dataset_packets(groups: &[Vec<PathBuf>]) -> String {
    let reads: Vec<String> = groups
        .iter()
        .map(|g| {
            format!(
                "SELECT * FROM read_parquet([{}], hive_partitioning = true)",
                sql::paths(g)
            )
        })
        .collect();
    format!("({})", reads.join(" UNION ALL BY NAME "))
}

/// The checks of a packets file's metadata (`kv`) and columns (`cols`).
fn validate_packets(
    file: &Path,
    kv: &[(String, String)],
    cols: &[String],
) -> Result<Vec<(String, String)>> {
    let version = kv.iter().find(|(k, _)| k == VERSION_KEY).map(|(_, v)| v);
    let Some(version) = version else {
        return Err(input(
            file,
            format!("a Parquet file, but not an xlap-trace packets table (no {VERSION_KEY} metadata): written by another tool or an older xlap-trace; rebuild it from the runs with `xlap-trace correlate RUN_DIR... -o FILE`"),
        ));
    };
    match version.parse::<u32>() {
        Ok(v) if v <= PACKETS_SCHEMA_VERSION => {}
        Ok(_) => {
            return Err(input(
                file,
                format!(
                    "packets table schema version {version} is newer than this xlap-trace reads ({PACKETS_SCHEMA_VERSION}); use a newer xlap-trace"
                ),
            ))
        }
        Err(_) => {
            return Err(input(
                file,
                format!(
                    "packets table schema version {:?} is not a version number: the file was edited or written by a foreign tool",
                    version.chars().take(40).collect::<String>()
                ),
            ))
        }
    }
    // A column per point and per stage: bounded as the correlator bounds
    // them, before any query whose plan grows with the columns.
    let most =
        REQUIRED.len() + 4 * crate::correlate::MAX_POINTS as usize + crate::correlate::MAX_STAGES;
    if cols.len() > most {
        return Err(input(
            file,
            format!(
                "the packets table has {} columns; xlap-trace reads at most {most} (its fixed columns, {} points and {} stages): written by a foreign tool",
                cols.len(),
                crate::correlate::MAX_POINTS,
                crate::correlate::MAX_STAGES
            ),
        ));
    }
    check_names(file, cols.iter())?;
    let missing: Vec<&str> = REQUIRED
        .iter()
        .copied()
        .filter(|c| !cols.iter().any(|x| x == c))
        .collect();
    if !missing.is_empty() {
        return Err(input(
            file,
            format!(
                "the packets table lacks the columns {}: written by a broken or foreign tool",
                missing.join(", ")
            ),
        ));
    }
    let sides = kv
        .iter()
        .find(|(k, _)| k == SIDES_KEY)
        .and_then(|(_, v)| {
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(v).ok()
        })
        .ok_or_else(|| {
            input(
                file,
                format!("the {SIDES_KEY} metadata is missing or not a JSON object"),
            )
        })?;
    check_names(file, sides.keys())?;
    Ok(sides
        .into_iter()
        .map(|(c, s)| (c, s.as_str().unwrap_or("tx").to_string()))
        .collect())
}

/// Refuses a packets file whose column names cannot be used (named with
/// the file); any other name is carried quoted.
fn check_names<'a>(file: &Path, names: impl Iterator<Item = &'a String>) -> Result<()> {
    for name in names {
        sql::check_name(name)
            .map_err(|why| input(file, format!("a column of the packets table: {why}")))?;
    }
    Ok(())
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

/// `runs` (one row per run.json) and `tracer_points` (the tracer's own
/// per-point counters), from the run metadata.
pub(crate) fn load_runs(conn: &Connection, files: &[PathBuf]) -> Result<()> {
    conn.execute_batch(
        "CREATE OR REPLACE TEMP TABLE runs (run_id VARCHAR, host VARCHAR, kernel VARCHAR, boot_id VARCHAR,
           start_realtime_ns BIGINT, duration_s DOUBLE, packets UBIGINT, stamps UBIGINT,
           bpf_ns_per_stamp DOUBLE, stop_reason VARCHAR, file VARCHAR);
         CREATE OR REPLACE TEMP TABLE kinds (kind UBIGINT, name VARCHAR);
         CREATE OR REPLACE TEMP TABLE run_kinds (run_id VARCHAR, kind UBIGINT, name VARCHAR);
         CREATE OR REPLACE TEMP TABLE cgroups (run_id VARCHAR, host VARCHAR, id UBIGINT, path VARCHAR,
           container_runtime VARCHAR, container_id VARCHAR, pod_uid VARCHAR);",
    )?;
    // One loss column per reason the capture counts (xlap_abi::LOSS_REASONS).
    let loss_columns: Vec<String> = xlap_abi::LOSS_REASONS
        .iter()
        .map(|r| format!("lost_{r}"))
        .collect();
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE tracer_points (run_id VARCHAR, host VARCHAR, point VARCHAR, stamps UBIGINT, {});",
        loss_columns
            .iter()
            .map(|c| format!("{c} UBIGINT"))
            .collect::<Vec<_>>()
            .join(", ")
    ))?;
    // One transaction and statements prepared once: a dataset of 500 runs
    // inserted row by row, each its own commit, took 5 s.
    conn.execute_batch("BEGIN TRANSACTION;")?;
    let inserted = insert_runs(conn, files, loss_columns.len());
    conn.execute_batch(if inserted.is_ok() {
        "COMMIT;"
    } else {
        "ROLLBACK;"
    })?;
    inserted
}

fn insert_runs(conn: &Connection, files: &[PathBuf], losses: usize) -> Result<()> {
    let mut insert_run =
        conn.prepare("INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")?;
    let mut insert_kind = conn.prepare("INSERT INTO run_kinds VALUES (?, ?, ?)")?;
    let mut insert_cgroup = conn.prepare("INSERT INTO cgroups VALUES (?, ?, ?, ?, ?, ?, ?)")?;
    let mut insert_point = conn.prepare(&format!(
        "INSERT INTO tracer_points VALUES (?, ?, ?, ?{})",
        ", ?".repeat(losses)
    ))?;
    for file in files {
        let m = crate::runs::read_meta(file)?;
        insert_run.execute(duckdb::params![
            m.run_id,
            m.host,
            m.kernel,
            m.boot_id,
            m.clock_start.realtime_ns as i64,
            m.duration_s(),
            m.packets,
            m.stamps,
            m.bpf_ns_per_stamp,
            m.stop_reason.as_str(),
            file.display().to_string(),
        ])?;
        // The protocol's names of its kinds (from the --proto preset);
        // which runs name the packets' kinds is settled by `name_kinds`.
        for (_, layout) in m.layouts() {
            for (kind, name) in &layout.kind_names {
                insert_kind.execute(duckdb::params![m.run_id, kind, name])?;
            }
        }
        // Where the stamps ran (`cgroup_id`): by id on that run's host.
        for c in &m.cgroups {
            insert_cgroup.execute(duckdb::params![
                m.run_id,
                m.host,
                c.id,
                c.path,
                c.container.as_ref().map(|k| k.runtime.clone()),
                c.container.as_ref().map(|k| k.id.clone()),
                c.pod_uid,
            ])?;
        }
        for (name, c) in &m.points {
            let mut values: Vec<Box<dyn duckdb::ToSql>> = vec![
                Box::new(m.run_id.clone()),
                Box::new(m.host.clone()),
                Box::new(name.clone()),
                Box::new(c.stamps),
            ];
            for reason in xlap_abi::LOSS_REASONS {
                values.push(Box::new(c.lost(reason)));
            }
            insert_point.execute(duckdb::params_from_iter(values.iter().map(|v| v.as_ref())))?;
        }
    }
    Ok(())
}

/// `kinds`: the names the packets' own runs give their kinds. A packets
/// file is read with the run.json files beside it, which may be other
/// runs' (a packets file written into a directory of runs): their names
/// would label another protocol's kinds. Then [`crate::KIND_ALL`], if any
/// packet is of a layout without a kind.
/// Packets of more kinds than the correlator makes ([`MAX_KINDS`]) come
/// from a file edited or written elsewhere: each kind is a distribution per
/// stage in every analysis (10 000 kinds: 3 GB, a 160 MB summary.json).
///
/// [`MAX_KINDS`]: crate::correlate::MAX_KINDS
fn check_kinds(conn: &Connection, arg: &Path) -> Result<()> {
    let kinds: i64 =
        conn.query_row("SELECT count(DISTINCT kind) FROM packets", [], |r| r.get(0))?;
    if kinds > crate::correlate::MAX_KINDS {
        return Err(input(
            arg,
            format!(
                "its packets are of {kinds} distinct kinds; xlap-trace analyses at most {}: the packets table was edited or written by a foreign tool",
                crate::correlate::MAX_KINDS
            ),
        ));
    }
    Ok(())
}

fn name_kinds(conn: &Connection) -> Result<()> {
    let has_run_id: bool = conn.query_row(
        "SELECT count(*) > 0 FROM (DESCRIBE SELECT * FROM packets) WHERE column_name = 'run_id'",
        [],
        |r| r.get(0),
    )?;
    // The earliest packets files have no run_id: every run beside them.
    conn.execute_batch(if has_run_id {
        "INSERT INTO kinds
         SELECT kind, any_value(name) FROM run_kinds
         WHERE run_id IN (SELECT DISTINCT run_id FROM packets) GROUP BY kind;"
    } else {
        "INSERT INTO kinds SELECT kind, any_value(name) FROM run_kinds GROUP BY kind;"
    })?;
    conn.execute(
        "INSERT INTO kinds SELECT ?, ? WHERE EXISTS (SELECT 1 FROM packets WHERE kind = ?)",
        duckdb::params![crate::KIND_ALL, crate::KIND_ALL_NAME, crate::KIND_ALL],
    )?;
    Ok(())
}

/// The main kind of each direction the delivered packets go (sender and
/// receiver process), most packets first: a two-way protocol (sockperf's
/// ping and pong) has two, each worth its own summary. A direction with
/// under a tenth of the packets (the example's feedback) is left out.
pub fn direction_kinds(conn: &Connection) -> Result<Vec<u64>> {
    let mut stmt = conn.prepare(
        "WITH d AS (SELECT tx_host, tx_pid, rx_host, rx_pid, kind, count(*) AS n
                    FROM packets WHERE e2e_ns IS NOT NULL GROUP BY ALL),
              dir AS (SELECT arg_max(kind, n) AS kind, sum(n) AS n FROM d
                      GROUP BY tx_host, tx_pid, rx_host, rx_pid)
         SELECT kind::UBIGINT, max(n) AS n FROM dir
         WHERE n >= 0.1 * (SELECT sum(n) FROM dir)
         GROUP BY kind ORDER BY n DESC, kind",
    )?;
    let kinds = stmt
        .query_map([], |r| r.get::<_, u64>(0))?
        .collect::<duckdb::Result<Vec<_>>>()?;
    Ok(kinds)
}

/// The most common kind among delivered packets: what a one-kind view
/// (the demo, the report) shows by default, like the `summary` query.
pub fn main_kind(conn: &Connection) -> Result<u64> {
    Ok(conn.query_row(
        "SELECT mode(kind)::UBIGINT FROM packets WHERE e2e_ns IS NOT NULL",
        [],
        |r| r.get(0),
    )?)
}

#[cfg(test)]
mod tests {
    /// What a packets file is checked for is what the schema declares.
    /// The label macro of queries/views.sql knows the kind-less kind.
    #[test]
    fn views_name_the_kind_of_kindless_layouts() {
        let line = super::VIEWS_SQL
            .lines()
            .find(|l| l.contains("MACRO kind_label"))
            .expect("kind_label in views.sql");
        assert!(line.contains(&crate::KIND_ALL.to_string()), "{line}");
        assert!(
            line.contains(&format!("'kind {}'", crate::KIND_ALL_NAME)),
            "{line}"
        );
    }

    #[test]
    fn required_columns_are_the_schemas() {
        let schema = xlap_records::schema::packets(&[], &[]);
        for c in super::REQUIRED.iter().chain(super::TOTALS) {
            assert!(
                schema.field_with_name(c).is_ok(),
                "{c} is not in the schema"
            );
        }
    }
}

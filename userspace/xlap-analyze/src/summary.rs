//! A run's compact summary (`summary.json`, kilobytes): per kind and stage,
//! the packet count and the distribution as quantiles on a fixed grid (fine
//! in the tail), plus what the run says about itself (stamps, losses, the
//! tracer's cost, the machine). What `compare` needs, small enough to commit
//! as a CI baseline; several summaries pool into one baseline.

use crate::dataset::Shared;
use crate::session;
use crate::sql::ident;
use crate::{AnalyzeError, Result};
use duckdb::Connection;
use serde::{Deserialize, Serialize};
use std::path::Path;
use xlap_records::sample::Sample;
use xlap_records::tracer_cost::TracerCost;

/// Version of the summary format (bumped on incompatible change).
pub const SUMMARY_VERSION: u32 = 1;

/// The quantile levels stored: every percent, then every 0.1 % above 98 %,
/// and 99.95 / 99.99 %: p99 and p99.9 keep their resolution.
pub fn grid() -> Vec<f64> {
    let mut g: Vec<f64> = (0..98).map(|i| i as f64 / 100.0).collect();
    g.extend((980..=999).map(|i| i as f64 / 1000.0));
    g.extend([0.9995, 0.9999, 1.0]);
    g
}

/// Blocks a run is cut into, in send order, for the spread of its
/// quantiles over time (batch means): a machine's noise that lasts longer
/// than a packet but shorter than the run shows there, and packets alone
/// cannot tell it.
pub const BLOCKS: u64 = 10;

/// Fewest packets per block for a stage to keep its blocks: below it a
/// block's p99 is one packet.
const MIN_BLOCK_PACKETS: u64 = 50;

/// The longest run id, host, kernel or stage name a summary read from a
/// file may hold (what xlap-trace writes is well under 100 bytes).
pub const MAX_NAME_BYTES: usize = 1024;

/// The largest packet, stamp or loss count a summary read from a file may
/// hold: 2⁵³, exact as a float, and thousands of runs of it pool without
/// overflow.
pub const MAX_COUNT: u64 = 1 << 53;

/// The quantile levels stored per block: coarser than [`grid`], the blocks
/// only have to tell the spread.
pub fn block_grid() -> Vec<f64> {
    vec![
        0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0,
    ]
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct StageSummary {
    pub stage: String,
    /// tx, channel, rx or total.
    pub side: String,
    pub position: i64,
    pub kind: u64,
    pub packets: u64,
    /// Nanoseconds at the levels of `Summary::levels`.
    pub quantiles_ns: Vec<f64>,
    /// A pooled baseline: each of its runs' own grid, so that `compare`
    /// can tell the spread between runs (the machine's noise) from a
    /// change. Empty for one run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs_ns: Vec<Vec<f64>>,
    /// One run: the grid (at `Summary::block_levels`) of each of its
    /// [`BLOCKS`] blocks in send order. Empty for a pooled baseline (its
    /// runs tell the noise) and for a stage with too few packets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks_ns: Vec<Vec<f64>>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Summary {
    pub summary_version: u32,
    /// The runs it describes (several once pooled).
    pub runs: Vec<String>,
    pub hosts: Vec<String>,
    pub kernels: Vec<String>,
    pub stamps: u64,
    pub lost: u64,
    /// The tracer's own BPF cost per stamp, where measured.
    pub bpf_ns_per_stamp: Option<f64>,
    pub levels: Vec<f64>,
    /// Send time from the first to the last delivered packet, seconds
    /// (the longest of a pooled baseline's runs).
    #[serde(default)]
    pub duration_s: Option<f64>,
    /// The levels of every stage's `blocks_ns`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub block_levels: Vec<f64>,
    /// `--sample 1/N`: the stages' `packets` are the sampled packets, each
    /// standing for N (`Sample::weight`). Absent: every datagram was
    /// stamped, or a pooled baseline's runs were sampled differently (then
    /// mixed by the packets each stands for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<Sample>,
    /// What tracing cost (`xlap_records::tracer_cost`): BPF ns per
    /// datagram, per program, the recorder's CPU; a pooled baseline's
    /// mean. Absent where the run says nothing of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracer: Option<TracerCost>,
    pub stages: Vec<StageSummary>,
}

impl Summary {
    /// The summary of a run directory (correlated, or correlated now).
    pub fn of_run(dir: &Path) -> Result<Summary> {
        let (conn, _) = session::open(dir, Shared::Materialized, false)?;
        Summary::of_conn(&conn, dir)
    }

    /// The summary of the run `dir` opened in `conn` (its views created).
    pub fn of_conn(conn: &Connection, dir: &Path) -> Result<Summary> {
        let levels = grid();
        let list = sql_list(&levels);
        let mut stmt = conn.prepare(&format!(
            "SELECT stage, side, position::BIGINT, kind::UBIGINT, packets::UBIGINT, p, ns::DOUBLE \
             FROM stage_quantiles([{list}]) ORDER BY kind, position, stage, p"
        ))?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, u64>(3)?,
                r.get::<_, u64>(4)?,
                r.get::<_, f64>(6)?,
            ))
        })?;
        let mut stages: Vec<StageSummary> = Vec::new();
        for row in rows {
            let (stage, side, position, kind, packets, ns) = row?;
            // Whole nanoseconds: the clock's own resolution, and a third of
            // the file.
            let ns = ns.round();
            match stages.last_mut() {
                Some(s) if s.stage == stage && s.kind == kind => s.quantiles_ns.push(ns),
                _ => stages.push(StageSummary {
                    stage,
                    side,
                    position,
                    kind,
                    packets,
                    quantiles_ns: vec![ns],
                    runs_ns: Vec::new(),
                    blocks_ns: Vec::new(),
                }),
            }
        }
        let block_levels = block_grid();
        add_blocks(conn, &block_levels, &mut stages)?;
        let duration_s: Option<f64> = conn.query_row(
            "SELECT ((max(sent_ns) - min(sent_ns)) / 1e9)::DOUBLE FROM packets WHERE e2e_ns IS NOT NULL",
            [],
            |r| r.get(0),
        )?;
        // A packets table without its run (correlate's output alone) has
        // no tracer counts: none are reported.
        let meta = match xlap_records::RunDir::new(dir).meta() {
            path if path.is_file() => Some(crate::runs::read_meta(&path)?),
            _ => None,
        };
        // A directory of runs (a recorder per host): their sample, which
        // correlating them required to be one, and their tracers' costs
        // added up.
        let (sample, tracer) = match &meta {
            Some(m) => (m.options.sample.clone(), TracerCost::of_run(m)),
            None => {
                let runs = metas_of_runs_in(dir);
                let costs: Vec<TracerCost> = runs.iter().filter_map(TracerCost::of_run).collect();
                (
                    runs.first().and_then(|m| m.options.sample.clone()),
                    TracerCost::sum(&costs.iter().collect::<Vec<_>>()),
                )
            }
        };
        Ok(Summary {
            summary_version: SUMMARY_VERSION,
            runs: meta.iter().map(|m| m.run_id.clone()).collect(),
            hosts: meta.iter().map(|m| m.host.clone()).collect(),
            kernels: meta
                .iter()
                .filter(|m| !m.kernel.is_empty())
                .map(|m| m.kernel.clone())
                .collect(),
            stamps: meta.as_ref().map_or(0, |m| m.stamps),
            lost: meta.as_ref().map_or(0, |m| m.lost),
            bpf_ns_per_stamp: meta.as_ref().and_then(|m| m.bpf_ns_per_stamp),
            levels,
            duration_s,
            block_levels,
            sample,
            tracer,
            stages,
        })
    }

    /// Adds to this run's summary the stages of `names` it lacks, computed
    /// from its packets table as the difference of their two points'
    /// columns. A run's stages are its points in its own path order, and
    /// that order can change with the very regression being looked for (a
    /// stage that grows lets a point of another thread fall inside it):
    /// the candidate is then measured on the baseline's stages.
    pub fn add_stages_of(&mut self, dir: &Path, names: &[String]) -> Result<()> {
        let mut missing: Vec<&String> = names
            .iter()
            .filter(|n| !self.stages.iter().any(|s| &s.stage == *n))
            .collect();
        // A baseline names a stage once per kind: derived once.
        missing.sort_unstable();
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        let (conn, _) = session::open(dir, Shared::Materialized, false)?;
        let columns: Vec<String> = {
            let mut stmt = conn.prepare(
                "SELECT column_name FROM (DESCRIBE packets) WHERE column_name LIKE '%\\_ns' ESCAPE '\\'",
            )?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect::<std::result::Result<_, _>>()?
        };
        let list = sql_list(&self.levels);
        for name in missing {
            let Some((from, to)) = name.split_once("__") else {
                continue;
            };
            let (a, b) = (format!("{from}_ns"), format!("{to}_ns"));
            if !columns.contains(&a) || !columns.contains(&b) {
                continue;
            }
            // The stage names come from a baseline's summary: data.
            let (a, b) = (ident(&a), ident(&b));
            let mut stmt = conn.prepare(&format!(
                "SELECT kind::UBIGINT, count(*)::UBIGINT, quantile_cont(d, [{list}])::DOUBLE[] FROM                  (SELECT kind, ({b} - {a})::DOUBLE AS d FROM packets \
                  WHERE e2e_ns IS NOT NULL AND {a} IS NOT NULL AND {b} IS NOT NULL) \
                 GROUP BY kind ORDER BY kind"
            ))?;
            let rows = stmt.query_map([], |r| {
                Ok((
                    r.get::<_, u64>(0)?,
                    r.get::<_, u64>(1)?,
                    r.get::<_, duckdb::types::Value>(2)?,
                ))
            })?;
            for row in rows {
                let (kind, packets, values) = row?;
                let Some(quantiles_ns) = whole_ns(values) else {
                    continue;
                };
                if quantiles_ns.len() != self.levels.len() {
                    continue;
                }
                self.stages.push(StageSummary {
                    stage: name.clone(),
                    side: "derived".into(),
                    position: i64::MAX,
                    kind,
                    packets,
                    quantiles_ns,
                    runs_ns: Vec::new(),
                    blocks_ns: Vec::new(),
                });
            }
            // Its blocks too, as the run's own stages have them: a stage
            // derived because the regression reordered the run's points is
            // the very one that must be able to decide (compare takes a
            // stage without blocks as one whose noise is unmeasured).
            if self.block_levels.is_empty() {
                continue;
            }
            let blist = sql_list(&self.block_levels);
            let mut stmt = conn.prepare(&format!(
                "SELECT kind::UBIGINT, quantile_cont(d, [{blist}])::DOUBLE[] FROM \
                 (SELECT kind, ({b} - {a})::DOUBLE AS d, \
                         ntile({BLOCKS}) OVER (PARTITION BY kind ORDER BY sent_ns, seq) AS block \
                  FROM packets WHERE e2e_ns IS NOT NULL AND {a} IS NOT NULL AND {b} IS NOT NULL) \
                 GROUP BY kind, block ORDER BY kind, block"
            ))?;
            let rows = stmt.query_map([], |r| {
                Ok((r.get::<_, u64>(0)?, r.get::<_, duckdb::types::Value>(1)?))
            })?;
            for row in rows {
                let (kind, values) = row?;
                let Some(s) = self
                    .stages
                    .iter_mut()
                    .find(|s| s.kind == kind && &s.stage == name && s.side == "derived")
                else {
                    continue;
                };
                if s.packets < BLOCKS * MIN_BLOCK_PACKETS {
                    continue;
                }
                s.blocks_ns.push(whole_ns(values).unwrap_or_default());
            }
            for s in self.stages.iter_mut().filter(|s| &s.stage == name) {
                if s.blocks_ns.len() as u64 != BLOCKS || s.blocks_ns.iter().any(Vec::is_empty) {
                    s.blocks_ns.clear();
                }
            }
        }
        Ok(())
    }

    /// A summary file, or the summary of a run directory.
    pub fn load(path: &Path) -> Result<Summary> {
        if path.is_dir() {
            let file = xlap_records::RunDir::new(path).summary();
            if file.exists() {
                let s = Summary::read(&file)?;
                // Written before summaries kept blocks: the run has them.
                if !s.block_levels.is_empty() {
                    return Ok(s);
                }
            }
            return Summary::of_run(path);
        }
        Summary::read(path)
    }

    fn read(path: &Path) -> Result<Summary> {
        let text =
            xlap_records::run_file::read_json_text(path).map_err(|e| AnalyzeError::Input {
                path: path.display().to_string(),
                what: e.to_string(),
            })?;
        let bad = |what: String| AnalyzeError::Input {
            path: path.display().to_string(),
            what,
        };
        let s: Summary = xlap_records::strict_json::parse(&text)
            .and_then(serde_json::from_value)
            .map_err(|e| {
            bad(format!(
                "is not an xlap-trace summary ({e}); give a run directory or the summary.json `xlap-trace summary` wrote"
            ))
        })?;
        if s.summary_version > SUMMARY_VERSION {
            return Err(bad(format!(
                "has summary version {}, newer than this xlap-trace reads ({SUMMARY_VERSION})",
                s.summary_version
            )));
        }
        s.check().map_err(bad)?;
        Ok(s)
    }

    /// What a summary from elsewhere must hold before any of it is used:
    /// the grids this version writes, one value per level everywhere,
    /// finite values, counts that cannot overflow when pooled, names of a
    /// sane length. A summary xlap-trace wrote always passes.
    fn check(&self) -> std::result::Result<(), String> {
        if self.levels != grid() {
            return Err(format!(
                "its quantile levels are not the {} this xlap-trace writes: edited, or not a summary",
                grid().len()
            ));
        }
        if !self.block_levels.is_empty() && self.block_levels != block_grid() {
            return Err("its block levels are not those this xlap-trace writes".into());
        }
        for name in self.runs.iter().chain(&self.hosts).chain(&self.kernels) {
            if name.len() > MAX_NAME_BYTES {
                return Err(format!(
                    "a run, host or kernel name of {} bytes (at most {MAX_NAME_BYTES})",
                    name.len()
                ));
            }
        }
        for count in [self.stamps, self.lost] {
            if count > MAX_COUNT {
                return Err(format!("a count of {count} (at most {MAX_COUNT})"));
            }
        }
        for st in &self.stages {
            let at = || format!("stage {:.64} (kind {})", st.stage, st.kind);
            if st.stage.len() > MAX_NAME_BYTES || st.side.len() > MAX_NAME_BYTES {
                return Err(format!(
                    "{}: a name longer than {MAX_NAME_BYTES} bytes",
                    at()
                ));
            }
            if st.packets > MAX_COUNT {
                return Err(format!(
                    "{}: {} packets (at most {MAX_COUNT})",
                    at(),
                    st.packets
                ));
            }
            let grids = std::iter::once(&st.quantiles_ns).chain(&st.runs_ns);
            for g in grids {
                if g.len() != self.levels.len() || g.iter().any(|v| !v.is_finite()) {
                    return Err(format!(
                        "{}: a grid of {} values, or one not finite, for {} levels",
                        at(),
                        g.len(),
                        self.levels.len()
                    ));
                }
            }
            if !st.blocks_ns.is_empty()
                && (st.blocks_ns.len() as u64 != BLOCKS
                    || st.blocks_ns.iter().any(|g| {
                        g.len() != self.block_levels.len() || g.iter().any(|v| !v.is_finite())
                    }))
            {
                return Err(format!(
                    "{}: blocks that are not {BLOCKS} grids at the block levels",
                    at()
                ));
            }
        }
        Ok(())
    }

    /// Compact JSON (one line: a pooled baseline of ten runs stays in the
    /// hundreds of kilobytes).
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string(self)
            .map_err(|e| AnalyzeError::Other(format!("summary: {e}")))?;
        // Never through a link left where the file goes (a run directory
        // from elsewhere): it would create or overwrite what it names.
        let mut f = xlap_records::run_file::create(path).map_err(|e| match e {
            xlap_records::run_file::RunFileError::Io(e) => {
                AnalyzeError::Other(format!("cannot write {}: {e}", path.display()))
            }
            refused => AnalyzeError::Input {
                path: path.display().to_string(),
                what: refused.to_string(),
            },
        })?;
        std::io::Write::write_all(&mut f, (text + "\n").as_bytes())
            .map_err(|e| AnalyzeError::Other(format!("cannot write {}: {e}", path.display())))
    }

    /// Several runs as one baseline: per kind and stage, the distributions
    /// mixed in proportion to their packet counts (the quantiles of the
    /// pooled packets, read off the mixture), so the spread between runs is
    /// part of the baseline.
    pub fn pool(parts: &[Summary]) -> Result<Summary> {
        let first = parts
            .first()
            .ok_or_else(|| AnalyzeError::Usage("nothing to pool".into()))?;
        let levels = first.levels.clone();
        if parts.iter().any(|s| s.levels != levels) {
            return Err(AnalyzeError::Usage(
                "summaries with different quantile levels cannot be pooled".into(),
            ));
        }
        let mut stages: Vec<StageSummary> = Vec::new();
        for s in &first.stages {
            let same: Vec<&StageSummary> = parts
                .iter()
                .filter_map(|p| {
                    p.stages
                        .iter()
                        .find(|t| t.stage == s.stage && t.kind == s.kind)
                })
                .collect();
            if same.len() != parts.len() {
                continue; // a stage not in every run is not compared
            }
            let packets: u64 = same.iter().map(|t| t.packets).sum();
            // Mixed by the packets each run's stage stands for: a run
            // sampled 1/16 weighs its packets 16 times.
            let weighed: Vec<StageSummary> = parts
                .iter()
                .zip(&same)
                .map(|(part, t)| StageSummary {
                    packets: t.packets
                        * part
                            .sample
                            .as_ref()
                            .map_or(1, |x| u64::from(x.weight(u32::try_from(t.kind).ok()))),
                    ..(*t).clone()
                })
                .collect();
            let weighed: Vec<&StageSummary> = weighed.iter().collect();
            let quantiles_ns = levels
                .iter()
                .map(|&p| mixture_quantile(&weighed, &levels, p))
                .collect();
            // The runs' own grids (a pooled part brings its runs along).
            let runs_ns = same
                .iter()
                .flat_map(|t| {
                    if t.runs_ns.is_empty() {
                        vec![t.quantiles_ns.clone()]
                    } else {
                        t.runs_ns.clone()
                    }
                })
                .collect();
            stages.push(StageSummary {
                packets,
                quantiles_ns,
                runs_ns,
                // A pooled baseline's noise is the spread between its runs.
                blocks_ns: Vec::new(),
                ..s.clone()
            });
        }
        let cat = |f: fn(&Summary) -> &Vec<String>| -> Vec<String> {
            let mut v: Vec<String> = parts.iter().flat_map(|s| f(s).clone()).collect();
            v.dedup();
            v
        };
        let costs: Vec<f64> = parts.iter().filter_map(|s| s.bpf_ns_per_stamp).collect();
        Ok(Summary {
            summary_version: SUMMARY_VERSION,
            runs: cat(|s| &s.runs),
            hosts: cat(|s| &s.hosts),
            kernels: cat(|s| &s.kernels),
            stamps: parts.iter().map(|s| s.stamps).sum(),
            lost: parts.iter().map(|s| s.lost).sum(),
            bpf_ns_per_stamp: (!costs.is_empty())
                .then(|| costs.iter().sum::<f64>() / costs.len() as f64),
            levels,
            duration_s: parts.iter().filter_map(|s| s.duration_s).reduce(f64::max),
            block_levels: Vec::new(),
            sample: first
                .sample
                .clone()
                .filter(|s| parts.iter().all(|p| p.sample.as_ref() == Some(s))),
            tracer: TracerCost::mean(
                &parts
                    .iter()
                    .filter_map(|p| p.tracer.as_ref())
                    .collect::<Vec<_>>(),
            ),
            stages,
        })
    }

    pub fn stage(&self, kind: u64, stage: &str) -> Option<&StageSummary> {
        self.stages
            .iter()
            .find(|s| s.kind == kind && s.stage == stage)
    }
}

/// The run.json of each run a directory of runs (or a packets file beside
/// them) holds.
fn metas_of_runs_in(dir: &Path) -> Vec<xlap_records::run_meta::RunMeta> {
    crate::layout::run_dirs_in(crate::layout::run_root(dir))
        .iter()
        .filter_map(|d| crate::runs::read_meta(&d.meta()).ok())
        .collect()
}

/// Stage values one block query carries at most (packets × stage
/// columns): each carries its values through the sort and into the
/// quantile states. A small run's stages go in one query (a query per few
/// columns made `history` of 500 runs of 2000 packets 75 -> 120 s).
const BLOCK_VALUES_PER_QUERY: u64 = 40_000_000;

/// Each stage's quantiles in each of [`BLOCKS`] blocks of its packets in
/// send order (stages with fewer than [`MIN_BLOCK_PACKETS`] per block keep
/// none).
///
/// A stage's blocks are the ntile of its own packets (those that have it)
/// by (sent_ns, seq). Stages present in exactly the same packets share
/// their blocks, so they are computed together, as many columns per query
/// as [`BLOCK_VALUES_PER_QUERY`] allows, from the wide table: the long `stages` view sorted every (packet, stage)
/// row at once, which ran 10 M packets out of a 4 GB engine.
fn add_blocks(
    conn: &duckdb::Connection,
    levels: &[f64],
    stages: &mut [StageSummary],
) -> Result<()> {
    if !stages
        .iter()
        .any(|s| s.packets >= BLOCKS * MIN_BLOCK_PACKETS)
    {
        return Ok(());
    }
    let columns: Vec<(String, String)> = {
        let mut stmt =
            conn.prepare("SELECT col, stage FROM stage_columns ORDER BY position, col")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    if columns.is_empty() {
        return Ok(());
    }
    // Which stages each combination of present stages has (and how many
    // packets): columns absent from the same combinations are present in
    // the same packets.
    let (absent, delivered): (Vec<Vec<bool>>, u64) = {
        let flags: Vec<String> = columns
            .iter()
            .map(|(c, _)| format!("{} IS NULL", ident(c)))
            .collect();
        let mut stmt = conn.prepare(&format!(
            "SELECT {}, count(*)::UBIGINT FROM delivered GROUP BY ALL",
            flags.join(", ")
        ))?;
        let n = columns.len();
        let rows = stmt.query_map([], |r| {
            let combo = (0..n)
                .map(|i| r.get::<_, bool>(i))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok((combo, r.get::<_, u64>(n)?))
        })?;
        let mut absent = Vec::new();
        let mut delivered = 0;
        for row in rows {
            let (combo, count) = row?;
            absent.push(combo);
            delivered += count;
        }
        (absent, delivered)
    };
    let mut classes: Vec<(Vec<bool>, Vec<usize>)> = Vec::new();
    for i in 0..columns.len() {
        let key: Vec<bool> = absent.iter().map(|combo| combo[i]).collect();
        if key.iter().all(|a| *a) {
            continue;
        }
        match classes.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => classes.push((key, vec![i])),
        }
    }
    let list = sql_list(levels);
    let per_query = (BLOCK_VALUES_PER_QUERY / delivered.max(1)).max(1) as usize;
    for (_, members) in classes {
        for chunk in members.chunks(per_query) {
            let quantiles: Vec<String> = chunk
                .iter()
                .map(|&i| {
                    format!(
                        "quantile_cont({}::DOUBLE, [{list}])::DOUBLE[]",
                        ident(&columns[i].0)
                    )
                })
                .collect();
            let carried: Vec<String> = chunk.iter().map(|&i| ident(&columns[i].0)).collect();
            let mut stmt = conn.prepare(&format!(
                "SELECT kind::UBIGINT, {} FROM \
                 (SELECT kind, {}, ntile({BLOCKS}) OVER (PARTITION BY kind ORDER BY sent_ns, seq) AS block \
                  FROM delivered WHERE {} IS NOT NULL) \
                 GROUP BY kind, block ORDER BY kind, block",
                quantiles.join(", "),
                carried.join(", "),
                carried[0]
            ))?;
            let rows = stmt.query_map([], |r| {
                let kind = r.get::<_, u64>(0)?;
                let values = (0..chunk.len())
                    .map(|j| r.get::<_, duckdb::types::Value>(j + 1))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Ok((kind, values))
            })?;
            for row in rows {
                let (kind, values) = row?;
                for (&i, values) in chunk.iter().zip(values) {
                    let stage = &columns[i].1;
                    let Some(s) = stages
                        .iter_mut()
                        .find(|s| s.kind == kind && &s.stage == stage)
                    else {
                        continue;
                    };
                    if s.packets < BLOCKS * MIN_BLOCK_PACKETS {
                        continue;
                    }
                    // An incomplete block stays empty, and drops the stage's
                    // blocks below.
                    s.blocks_ns.push(whole_ns(values).unwrap_or_default());
                }
            }
        }
    }
    for s in stages.iter_mut() {
        if s.blocks_ns.len() as u64 != BLOCKS || s.blocks_ns.iter().any(Vec::is_empty) {
            s.blocks_ns.clear();
        }
    }
    Ok(())
}

/// Quantile levels as a DuckDB list literal's items.
fn sql_list(levels: &[f64]) -> String {
    levels
        .iter()
        .map(|p| format!("{p}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A DuckDB `DOUBLE[]` of quantiles in whole nanoseconds (the clock's own
/// resolution, and a third of the file); `None` if any is not a number.
fn whole_ns(values: duckdb::types::Value) -> Option<Vec<f64>> {
    let duckdb::types::Value::List(values) = values else {
        return None;
    };
    values
        .iter()
        .map(|v| match v {
            duckdb::types::Value::Double(x) => Some(x.round()),
            _ => None,
        })
        .collect()
}

/// The value of a quantile grid at level `p` (linear between levels).
pub fn at_level(levels: &[f64], values: &[f64], p: f64) -> f64 {
    let p = p.clamp(0.0, 1.0);
    let i = levels.partition_point(|&l| l < p);
    if i == 0 {
        return values[0];
    }
    if i >= levels.len() {
        return values[values.len() - 1];
    }
    let (l0, l1) = (levels[i - 1], levels[i]);
    let (v0, v1) = (values[i - 1], values[i]);
    if l1 <= l0 {
        return v1;
    }
    v0 + (p - l0) / (l1 - l0) * (v1 - v0)
}

/// The fraction of a stage's packets at or below `x` (its grid inverted).
pub fn cdf(levels: &[f64], values: &[f64], x: f64) -> f64 {
    if x < values[0] {
        return 0.0;
    }
    let i = values.partition_point(|&v| v <= x);
    if i >= values.len() {
        return 1.0;
    }
    let (v0, v1) = (values[i - 1], values[i]);
    let (l0, l1) = (levels[i - 1], levels[i]);
    if v1 <= v0 {
        return l1;
    }
    l0 + (x - v0) / (v1 - v0) * (l1 - l0)
}

/// The p-quantile of a packet-weighted mixture of stage distributions, by
/// bisection on the mixture's CDF.
fn mixture_quantile(parts: &[&StageSummary], levels: &[f64], p: f64) -> f64 {
    let total: f64 = parts.iter().map(|s| s.packets as f64).sum();
    let mix = |x: f64| -> f64 {
        parts
            .iter()
            .map(|s| s.packets as f64 * cdf(levels, &s.quantiles_ns, x))
            .sum::<f64>()
            / total
    };
    let mut lo = parts
        .iter()
        .map(|s| s.quantiles_ns[0])
        .fold(f64::INFINITY, f64::min);
    let mut hi = parts
        .iter()
        .map(|s| *s.quantiles_ns.last().unwrap_or(&0.0))
        .fold(f64::NEG_INFINITY, f64::max);
    if p <= 0.0 {
        return lo;
    }
    if p >= 1.0 {
        return hi;
    }
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if mix(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(packets: u64, values: Vec<f64>) -> StageSummary {
        StageSummary {
            stage: "s".into(),
            side: "total".into(),
            position: 0,
            kind: 1,
            packets,
            quantiles_ns: values,
            runs_ns: Vec::new(),
            blocks_ns: Vec::new(),
        }
    }

    #[test]
    fn the_grid_is_fine_in_the_tail() {
        let g = grid();
        assert!(g.windows(2).all(|w| w[0] < w[1]));
        for p in [0.5, 0.99, 0.999, 1.0] {
            assert!(g.iter().any(|&l| (l - p).abs() < 1e-12), "{p}");
        }
    }

    #[test]
    fn levels_interpolate_and_pool_by_weight() {
        let levels = vec![0.0, 0.5, 1.0];
        assert_eq!(at_level(&levels, &[0.0, 10.0, 20.0], 0.25), 5.0);
        // Two runs of uniform [0, 10] and [10, 20], 1:3 packets: the pooled
        // median lies where a quarter + 3/4 of the second's CDF is 1/2.
        let a = stage(100, vec![0.0, 5.0, 10.0]);
        let b = stage(300, vec![10.0, 15.0, 20.0]);
        let m = mixture_quantile(&[&a, &b], &levels, 0.5);
        assert!((m - (10.0 + 10.0 / 3.0)).abs() < 1e-6, "{m}");
        // A pooled summary keeps each run's grid.
        let sum = |st: StageSummary| Summary {
            summary_version: SUMMARY_VERSION,
            runs: vec!["r".into()],
            hosts: vec![],
            kernels: vec![],
            stamps: 0,
            lost: 0,
            bpf_ns_per_stamp: None,
            levels: levels.clone(),
            duration_s: None,
            block_levels: Vec::new(),
            sample: None,
            tracer: None,
            stages: vec![st],
        };
        let pooled = Summary::pool(&[sum(a.clone()), sum(b.clone())]).unwrap();
        assert_eq!(
            pooled.stages[0].runs_ns,
            vec![a.quantiles_ns.clone(), b.quantiles_ns.clone()]
        );
        assert_eq!(pooled.stages[0].packets, 400);
        assert_eq!(pooled.sample, None);
        // A run sampled 1/3 weighs its 100 packets as 300: an even mixture,
        // whose median is where the two distributions meet.
        let sampled = Summary {
            sample: Sample::parse("1/3", vec![]).unwrap(),
            ..sum(a.clone())
        };
        let pooled = Summary::pool(&[sampled, sum(b.clone())]).unwrap();
        let median = pooled.stages[0].quantiles_ns[1];
        assert!((median - 10.0).abs() < 1e-6, "{median}");
        assert_eq!(pooled.stages[0].packets, 400, "the packets measured");
        assert_eq!(pooled.sample, None, "sampled differently");
    }
}

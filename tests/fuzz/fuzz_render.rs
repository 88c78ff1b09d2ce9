//! Fuzz target (unprivileged): every renderer of the CLI on run shapes a
//! real run can have and nobody designed (issue 48: `report` looped for
//! ever and took 24 GiB on a run where a stage had packets but none with
//! an end-to-end value; nothing fuzzed the renderers).
//!
//! Each case writes one run holding both hosts, or two runs (two hosts,
//! clocks apart), as the recorder does: no packet at all, one packet, one
//! kind or several, a layout without kinds, stamps without a sequence
//! number, packets with both ends or with only the sender's or only the
//! receiver's stamps (so a stage can have packets and none of them an
//! end-to-end value), stage durations all equal, zero, negative (a later
//! point stamped earlier), from 1 ns to hours, sequence numbers of any
//! width up to 2^64 − 1, and app marker names a traced program (or a run
//! from elsewhere) may carry: markup, `|`, backticks, `&`, quotes, very long,
//! non-ASCII. It correlates them with `xlap-trace correlate`, then runs
//! `report` (alone and with another run overlaid), `export --perfetto`,
//! `analyze -q all` (Markdown and JSON), `summary`, `compare` (Markdown,
//! JSON, JUnit) and `history` (Markdown and its SVG) through the real CLI,
//! each in a child process within a memory budget (`RLIMIT_DATA`) and a
//! time budget ([`xlap_tests::run_limited`]).
//!
//! Properties: each command ends by itself within the budgets, with a
//! documented exit code (README, plus 8: out of memory) and no panic; on a
//! run with an end-to-end latency every renderer succeeds (compare: 0 or
//! 1). What succeeded is well formed: the HTML report and the SVG plot
//! parse as XML, every geometric SVG attribute is a finite number, no text
//! says NaN or inf, no element comes from a marker name, files stay under
//! [`MAX_OUTPUT`]; the Perfetto trace is JSON whose events have finite
//! times; Markdown tables keep their header's column count and carry no
//! markup from the data; compare's Markdown has one heading, its first
//! line; JUnit parses as XML.
//!
//! A case costs a dozen CLI runs (~1 s each on 2 cores): 4 cases by
//! default, `PROPTEST_CASES` for more (`just fuzz`). The shapes that broke
//! something are kept below as plain tests.

use crate::fuzz_correlate::{RX_POINTS, TX_POINTS};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::{Path, PathBuf};
use std::process::Command;
use xlap_abi::xlap_point as xp;
use xlap_records::Stamp;
use xlap_tests::run_files::{write_run, RunFiles};
use xlap_tests::run_limited::{run_limited, Budget, Limited};
use xlap_tests::Scratch;

fn config(cases: u32) -> Config {
    // A failing case is a dozen CLI runs, a hanging one minutes: shrink
    // for two minutes at most.
    Config {
        max_shrink_time: 120_000,
        ..crate::config(cases, 0x5EED_4E4D, 0)
    }
}

/// Largest output file (the report, the plot, the trace) or stdout: the
/// Perfetto export of its default 10 000 packets, every point stamped, is
/// ~44 MB.
pub(crate) const MAX_OUTPUT: u64 = 64 << 20;
/// The documented exit codes (README "Exit codes"), and 8: out of memory.
const EXIT_CODES: std::ops::RangeInclusive<i32> = 0..=8;
const APP_BASE: u16 = xp::XLAP_POINT_APP_BASE as u16;
/// Every stamp's time is this plus offsets (never below 0, whatever the
/// durations and clock offsets add up to).
const T0: u64 = 100_000_000_000_000;

/// Marker names: what a traced program may name its markers (and a run
/// from elsewhere may carry), control characters aside (refused, named,
/// exit 6). No two give the same column, nor a `_tx`/`_rx` one.
fn marker_pool() -> Vec<String> {
    let mut v: Vec<String> = [
        "send_start",
        "deliver",
        "<script>alert(1)</script>",
        "<xlapinjected/>",
        "a|b|c",
        "`tick`",
        "&amp;&lt;&",
        "quote\"'",
        "]]>",
        "**bold**_",
        "#head",
        "back\\slash",
        "ünïcødé😀",
        "with space",
    ]
    .map(String::from)
    .to_vec();
    v.push("l".repeat(300));
    v
}

/// Text of marker names that must never come out as markup.
const MARKUP: [&str; 2] = ["<script>alert(1)", "<xlapinjected"];

#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Ends {
    Both,
    /// Sender stamps only (a lost packet, or an untraced receiver).
    Sender,
    /// Receiver stamps only.
    Receiver,
}

#[derive(Clone, Debug)]
pub(crate) struct PacketShape {
    /// Index into the case's kinds.
    pub kind: usize,
    pub ends: Ends,
    /// Bit i keeps the side's i-th point (one kernel point is always kept).
    pub tx_keep: u16,
    pub rx_keep: u16,
    pub app_keep: u16,
    /// Seeds the packet's durations.
    pub seed: u64,
}

/// How far apart consecutive stamps of a packet are.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Steps {
    /// All the same (0: every stamp at one instant).
    Equal(u64),
    /// 2^e ns, e uniform in the range (0: 1 ns; 42: 73 min); each step
    /// backwards with probability `backwards`/4.
    Spread { lo: u8, hi: u8, backwards: u8 },
}

#[derive(Clone, Debug)]
pub(crate) struct Shape {
    pub two_runs: bool,
    /// Host b's clock minus host a's (two runs).
    pub clock_offset: i64,
    /// The layout has a kind field (else every packet is kind `all`).
    pub has_kind: bool,
    pub kinds: Vec<u32>,
    pub seq_size: u8,
    /// The first packet's seq (reduced to the layout's width).
    pub start: u64,
    pub tx_points: Vec<u32>,
    pub rx_points: Vec<u32>,
    /// Marker names of the run (app point APP_BASE + i), and which of them
    /// each side stamps.
    pub markers: Vec<String>,
    pub app_tx: Vec<usize>,
    pub app_rx: Vec<usize>,
    /// Time between packets, ns.
    pub period: u64,
    pub steps: Steps,
    /// Stamps without a sequence number beside the packets.
    pub unkeyed: u8,
    pub packets: Vec<PacketShape>,
}

fn packet_shape() -> impl Strategy<Value = PacketShape> {
    (
        0usize..3,
        prop_oneof![6 => Just(Ends::Both), 2 => Just(Ends::Sender), 2 => Just(Ends::Receiver)],
        (any::<u16>(), any::<u16>(), any::<u16>()),
        any::<u64>(),
    )
        .prop_map(
            |(kind, ends, (tx_keep, rx_keep, app_keep), seed)| PacketShape {
                kind,
                ends,
                tx_keep,
                rx_keep,
                app_keep,
                seed,
            },
        )
}

fn steps() -> impl Strategy<Value = Steps> {
    prop_oneof![
        prop::sample::select(vec![0u64, 1, 1_000, 3_600_000_000_000]).prop_map(Steps::Equal),
        (0u8..=42, 0u8..=42, prop::sample::select(vec![0u8, 0, 1, 4])).prop_map(
            |(a, b, backwards)| Steps::Spread {
                lo: a.min(b),
                hi: a.max(b),
                backwards,
            }
        ),
    ]
}

fn shape() -> impl Strategy<Value = Shape> {
    let pool = marker_pool();
    (
        (
            any::<bool>(),
            prop_oneof![
                Just(0i64),
                -3_600_000_000_000i64..3_600_000_000_000,
                -10_000_000i64..10_000_000
            ],
            any::<bool>(),
            prop::sample::subsequence(vec![0u32, 1, 7, 70_000, u32::MAX], 1..=3),
        ),
        (
            prop::sample::select(vec![1u8, 2, 4, 8, 8]),
            prop_oneof![any::<u64>(), (0u64..4).prop_map(|k| u64::MAX - k)],
            prop::sample::subsequence(TX_POINTS.to_vec(), 1..=TX_POINTS.len()),
            prop::sample::subsequence(RX_POINTS.to_vec(), 1..=RX_POINTS.len()),
        ),
        (
            prop::sample::subsequence(pool, 0..=4),
            prop::sample::subsequence((0..4usize).collect::<Vec<_>>(), 0..=3),
            prop::sample::subsequence((0..4usize).collect::<Vec<_>>(), 0..=3),
        ),
        (
            prop_oneof![Just(0u64), (0u32..=40).prop_map(|e| 1u64 << e)],
            steps(),
            prop::sample::select(vec![0u8, 0, 0, 3]),
            prop_oneof![
                1 => Just(0usize),
                1 => Just(1usize),
                6 => 2usize..40,
            ],
            prop::collection::vec(packet_shape(), 40),
        ),
    )
        .prop_map(
            |(
                (two_runs, clock_offset, has_kind, kinds),
                (seq_size, start, tx_points, mut rx_points),
                (markers, app_tx, app_rx),
                (period, steps, unkeyed, count, mut packets),
            )| {
                // sock.recv_exit carries no flow: alone, the receiver's
                // stamps could not be placed.
                if rx_points == [xp::XLAP_POINT_SOCK_RECV_EXIT] {
                    rx_points.insert(0, xp::XLAP_POINT_SOCK_QUEUE);
                }
                packets.truncate(count);
                let m = markers.len();
                Shape {
                    two_runs,
                    clock_offset,
                    has_kind,
                    kinds,
                    seq_size,
                    start,
                    tx_points,
                    rx_points,
                    app_tx: app_tx.into_iter().filter(|i| *i < m).collect(),
                    app_rx: app_rx.into_iter().filter(|i| *i < m).collect(),
                    markers,
                    period,
                    steps,
                    unkeyed,
                    packets,
                }
            },
        )
}

/// splitmix64: a packet's durations from its seed.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn step(steps: Steps, state: &mut u64) -> i64 {
    match steps {
        Steps::Equal(d) => d as i64,
        Steps::Spread { lo, hi, backwards } => {
            let r = next(state);
            let e = lo as u64 + r % (hi as u64 - lo as u64 + 1);
            let d = 1i64 << e;
            if (r >> 32) % 4 < backwards as u64 {
                -d
            } else {
                d
            }
        }
    }
}

/// The `mask`-selected items (bit i: item i), the first one when none is.
fn kept<T: Copy>(items: &[T], mask: u16, at_least_one: bool) -> Vec<T> {
    let mut v: Vec<T> = items
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << (i % 16)) != 0)
        .map(|(_, p)| *p)
        .collect();
    if at_least_one && v.is_empty() {
        v.extend(items.first());
    }
    v
}

/// The stamps of hosts a and b, and whether a packet has both ends (an
/// end-to-end latency).
pub(crate) struct Generated {
    pub a: Vec<Stamp>,
    pub b: Vec<Stamp>,
    pub delivered: bool,
}

pub(crate) fn generate(sh: &Shape) -> Generated {
    let span: u128 = if sh.seq_size >= 8 {
        1 << 64
    } else {
        1 << (8 * sh.seq_size as u32)
    };
    let flow: u64 = 0x0a01 << 48 | 0x0a02 << 32 | 9000 << 16 | 9001;
    let (tx_pid, rx_pid) = (100u32, 200u32);
    let mut g = Generated {
        a: Vec::new(),
        b: Vec::new(),
        delivered: false,
    };
    let stamp =
        |t: u64, point: u16, seq: Option<u64>, kind: Option<u32>, flow: u64, pid: u32| Stamp {
            ts_ns: t,
            point,
            seq,
            kind,
            flow,
            pid,
            tid: pid,
            cpu: 0,
            len: 100,
            ifindex: None,
            queue: None,
            hw_ts_ns: None,
            priority: None,
            cgroup_id: None,
            netns: None,
            from_user: flow == 0,
            fragment: false,
        };
    let on_b = |t: i64| {
        let t = if sh.two_runs { t + sh.clock_offset } else { t };
        t as u64
    };
    for (i, p) in sh.packets.iter().enumerate() {
        let kind = sh.has_kind.then(|| sh.kinds[p.kind % sh.kinds.len()]);
        let useq = (sh.start as u128 + i as u128) % span;
        let seq = Some(useq as u64);
        let mut state = p.seed;
        let mut t = (T0 + i as u64 * sh.period) as i64;
        if p.ends != Ends::Receiver {
            for m in kept(&sh.app_tx, p.app_keep, false) {
                g.a.push(stamp(t as u64, APP_BASE + m as u16, seq, kind, 0, tx_pid));
                t += step(sh.steps, &mut state);
            }
            for point in kept(&sh.tx_points, p.tx_keep, true) {
                g.a.push(stamp(t as u64, point as u16, seq, kind, flow, tx_pid));
                t += step(sh.steps, &mut state);
            }
        }
        if p.ends != Ends::Sender {
            let mut points = kept(&sh.rx_points, p.rx_keep, true);
            if points == [xp::XLAP_POINT_SOCK_RECV_EXIT] {
                points.insert(0, sh.rx_points[0]);
            }
            for point in points {
                let flow = if point == xp::XLAP_POINT_SOCK_RECV_EXIT {
                    0
                } else {
                    flow
                };
                g.b.push(stamp(on_b(t), point as u16, seq, kind, flow, rx_pid));
                t += step(sh.steps, &mut state);
            }
            for m in kept(&sh.app_rx, p.app_keep >> 8, false) {
                g.b.push(stamp(on_b(t), APP_BASE + m as u16, seq, kind, 0, rx_pid));
                t += step(sh.steps, &mut state);
            }
        }
        g.delivered |= p.ends == Ends::Both;
    }
    for k in 0..sh.unkeyed as u64 {
        let point = sh.tx_points[0] as u16;
        g.a.push(stamp(T0 + k, point, None, None, flow, tx_pid));
    }
    g
}

/// A case's files: the run (`run`: one directory, or a directory of two
/// runs), and its outputs beside it.
struct Case {
    scratch: Scratch,
    run: PathBuf,
    delivered: bool,
    markers: Vec<String>,
}

fn write_case(sh: &Shape, name: &str) -> Case {
    let g = generate(sh);
    let scratch = Scratch::new(name);
    let files = |run_id: &'static str, host: &'static str, mono| RunFiles {
        run_id,
        host,
        boot_id: host,
        app_names: &sh.markers,
        seq_size: sh.seq_size,
        monotonic_ns: mono,
        realtime_ns: 1_700_000_000_000_000_000,
    };
    let run = if sh.two_runs {
        let dir = scratch.path("runs");
        write_run(&dir.join("a"), &files("run-a", "host-a", 0), &g.a);
        write_run(
            &dir.join("b"),
            &files("run-b", "host-b", sh.clock_offset),
            &g.b,
        );
        dir
    } else {
        let mut all: Vec<Stamp> = g.a.into_iter().chain(g.b).collect();
        all.sort_by_key(|s| s.ts_ns);
        let dir = scratch.path("run");
        write_run(&dir, &files("run-a", "host-a", 0), &all);
        dir
    };
    Case {
        scratch,
        run,
        delivered: g.delivered,
        markers: sh.markers.clone(),
    }
}

/// A committed run with a known, ordinary shape: the other side of an
/// overlay, a comparison and a history.
pub(crate) fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/synth-2000")
}

pub(crate) fn xlap(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Limited {
    let mut cmd = Command::new(xlap_tests::bin("xlap-trace"));
    cmd.args(args.iter().map(|a| AsRef::<std::ffi::OsStr>::as_ref(*a)));
    run_limited(&mut cmd, Budget::default())
}

pub(crate) type Check = Result<(), String>;

/// Ended by itself, with a documented code, without a panic; `must_succeed`:
/// with `ok` codes only.
fn ended_well(out: &Limited, must_succeed: bool, ok: &[i32]) -> Check {
    let err = out.stderr_text();
    let bad = if out.timed_out {
        Some("over the time budget".to_string())
    } else if let Some(code) = out.code() {
        if !EXIT_CODES.contains(&code) {
            Some(format!("undocumented exit code {code}"))
        } else if must_succeed && !ok.contains(&code) {
            Some(format!("exit {code} on a run with end-to-end latencies"))
        } else {
            None
        }
    } else {
        Some("ended by a signal (out of memory?)".to_string())
    };
    let bad = bad.or_else(|| err.contains("panicked").then(|| "panicked".to_string()));
    let bad = bad.or_else(|| {
        (out.stdout.len() as u64 > MAX_OUTPUT)
            .then(|| format!("{} bytes on stdout", out.stdout.len()))
    });
    match bad {
        Some(why) => Err(format!("{why}: {}", out.describe())),
        None => Ok(()),
    }
}

pub(crate) fn read_output(path: &Path) -> Result<String, String> {
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if len > MAX_OUTPUT {
        return Err(format!("{}: {len} bytes", path.display()));
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Geometric attributes: numbers only.
const GEOMETRY: [&str; 25] = [
    "x",
    "y",
    "x1",
    "y1",
    "x2",
    "y2",
    "cx",
    "cy",
    "r",
    "rx",
    "ry",
    "dx",
    "dy",
    "width",
    "height",
    "points",
    "d",
    "transform",
    "viewBox",
    "font-size",
    "stroke-width",
    "opacity",
    "fill-opacity",
    "stroke-opacity",
    "stroke-dasharray",
];

/// A text's words that are non-numbers as Rust or JavaScript print them.
fn non_finite_word(text: &str) -> Option<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .find(|w| matches!(*w, "NaN" | "nan" | "inf" | "Infinity" | "infinity"))
}

/// XML (the report, the plot, JUnit): parses; with `svg`, every geometric
/// attribute is finite numbers, no text is a non-number, and no element
/// came from a marker name.
pub(crate) fn check_xml(text: &str, what: &str, svg: bool) -> Check {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(text, opts).map_err(|e| {
        let line = text
            .lines()
            .nth((e.pos().row as usize).saturating_sub(1))
            .unwrap_or("");
        let from = (e.pos().col as usize).saturating_sub(80);
        let excerpt: String = line.chars().skip(from).take(160).collect();
        format!("{what} is not well-formed XML: {e}; near: {excerpt:?}")
    })?;
    if !svg {
        return Ok(());
    }
    for node in doc.descendants() {
        if node.is_element() {
            let tag = node.tag_name().name();
            if tag.contains("xlapinjected")
                || tag == "script" && node.text().is_some_and(|t| t.contains("alert(1)"))
            {
                return Err(format!(
                    "{what}: an element <{tag}> made from a marker name"
                ));
            }
            for a in node.attributes() {
                if !GEOMETRY.contains(&a.name()) {
                    continue;
                }
                let v = a.value();
                let bad = non_finite_word(v).is_some()
                    || v.split(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
                        .filter(|t| t.bytes().any(|b| b.is_ascii_digit()))
                        .any(|t| t.parse::<f64>().is_ok_and(|x| !x.is_finite()));
                if bad {
                    return Err(format!(
                        "{what}: <{tag} {}=\"{v}\">: not a finite number",
                        a.name()
                    ));
                }
            }
        } else if let Some(t) = node.text() {
            let in_style = node
                .parent_element()
                .is_some_and(|p| matches!(p.tag_name().name(), "style" | "script"));
            if let Some(w) = non_finite_word(t).filter(|_| !in_style) {
                let t: String = t.chars().take(200).collect();
                return Err(format!("{what}: text says {w:?}: {t:?}"));
            }
        }
    }
    Ok(())
}

/// Markdown: every table row has its header's cell count (unescaped
/// `|`), no markup from a marker name; `one_heading`: the first line is
/// the only heading.
pub(crate) fn check_markdown(
    text: &str,
    what: &str,
    one_heading: bool,
    markers: &[String],
) -> Check {
    let lines: Vec<&str> = text.lines().collect();
    if one_heading {
        if !lines.first().is_some_and(|l| l.starts_with('#')) {
            return Err(format!("{what}: the first line is not a heading:\n{text}"));
        }
        if let Some(l) = lines.iter().skip(1).find(|l| l.starts_with('#')) {
            return Err(format!("{what}: a second heading {l:?}:\n{text}"));
        }
    }
    let pipes = |l: &str| {
        let b = l.as_bytes();
        (0..b.len())
            .filter(|&i| b[i] == b'|' && (i == 0 || b[i - 1] != b'\\'))
            .count()
    };
    let mut header: Option<usize> = None;
    for l in &lines {
        if !l.trim_start().starts_with('|') {
            header = None;
            continue;
        }
        let n = pipes(l);
        match header {
            None => header = Some(n),
            Some(h) if h != n => {
                return Err(format!(
                    "{what}: a row with {n} cell separators under a header with {h}: {l:?}"
                ))
            }
            _ => {}
        }
    }
    // A code span shows its text as it is (CommonMark): markup in it is
    // text. Outside one, a name's markup must not come through.
    let prose: String = lines.iter().map(|l| outside_code_spans(l) + "\n").collect();
    for m in MARKUP {
        if markers.iter().any(|n| n.contains(m)) && prose.contains(m) {
            return Err(format!("{what}: markup from a marker name: {m:?}"));
        }
    }
    Ok(())
}

/// A Markdown line without its code spans: a run of n backticks opens one,
/// which the next run of exactly n backticks closes (an unclosed run is
/// text).
fn outside_code_spans(line: &str) -> String {
    let b: Vec<char> = line.chars().collect();
    let run = |at: usize| b[at..].iter().take_while(|c| **c == '`').count();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != '`' {
            out.push(b[i]);
            i += 1;
            continue;
        }
        let n = run(i);
        let mut j = i + n;
        let close = loop {
            if j >= b.len() {
                break None;
            }
            if b[j] == '`' {
                let m = run(j);
                if m == n {
                    break Some(j);
                }
                j += m;
            } else {
                j += 1;
            }
        };
        match close {
            Some(j) => i = j + n,
            None => {
                out.extend(&b[i..i + n]);
                i += n;
            }
        }
    }
    out
}

/// The Perfetto trace: JSON, every event with a time has a finite one.
fn check_perfetto(text: &str) -> Check {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("the Perfetto trace is not JSON: {e}"))?;
    let events = v["traceEvents"]
        .as_array()
        .ok_or("the Perfetto trace has no traceEvents array")?;
    for e in events {
        if e["ph"] == "M" {
            continue;
        }
        let ok = e["ts"].as_f64().is_some_and(f64::is_finite);
        if !ok {
            return Err(format!("a Perfetto event without a finite ts: {e}"));
        }
    }
    Ok(())
}

pub(crate) fn check_json(text: &str, what: &str) -> Check {
    serde_json::from_str::<serde_json::Value>(text)
        .map(|_| ())
        .map_err(|e| format!("{what} is not JSON: {e}"))
}

/// compare's exit 1 is a regression: it says its verdict. An error must
/// not look like one (`compare --help`: 2 on an error).
pub(crate) fn compare_verdict(out: &Limited) -> Check {
    if out.code() == Some(1) && out.stdout.is_empty() {
        return Err(format!(
            "an error exited 1, compare's code for a regression: {}",
            out.describe()
        ));
    }
    Ok(())
}

/// Every renderer on the case's run; the first failure, if any.
fn render_all(case: &Case) -> Check {
    let run = &case.run;
    let out = |name: &str| case.scratch.path(name);
    let fixture = fixture();
    let must = case.delivered;
    let markers = &case.markers;

    let packets = run.join("packets.parquet");
    let c = if run.join("run.json").exists() {
        xlap(&[&"correlate", run, &"-o", &packets])
    } else {
        xlap(&[
            &"correlate",
            &run.join("a"),
            &run.join("b"),
            &"-o",
            &packets,
        ])
    };
    ended_well(&c, must, &[0])?;

    let html = out("report.html");
    let r = xlap(&[&"report", run, &"-o", &html]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_xml(&read_output(&html)?, "the report", true)?;
    }
    let html = out("overlay.html");
    let r = xlap(&[&"report", run, &fixture, &"-o", &html]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_xml(&read_output(&html)?, "the overlaid report", true)?;
    }

    let trace = out("perfetto.json");
    let r = xlap(&[&"export", run, &"--perfetto", &trace]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_perfetto(&read_output(&trace)?)?;
    }

    let r = xlap(&[
        &"analyze",
        run,
        &"-q",
        &"all",
        &"-f",
        &"markdown",
        &"--quiet",
    ]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_markdown(&r.stdout_text(), "analyze's Markdown", false, markers)?;
    }
    let r = xlap(&[&"analyze", run, &"-q", &"all", &"-f", &"json", &"--quiet"]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_json(&r.stdout_text(), "analyze's JSON")?;
    }

    let summary = out("summary.json");
    let r = xlap(&[&"summary", run, &"-o", &summary]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_json(&read_output(&summary)?, "the summary")?;
    }

    // Against itself (a summary) and against an ordinary run.
    let junit = out("junit.xml");
    let r = xlap(&[&"compare", &summary, run, &"--markdown", &"--junit", &junit]);
    ended_well(&r, must, &[0, 1])?;
    compare_verdict(&r)?;
    if matches!(r.code(), Some(0 | 1)) {
        check_markdown(&r.stdout_text(), "compare's Markdown", true, markers)?;
        check_xml(&read_output(&junit)?, "compare's JUnit", false)?;
    }
    let r = xlap(&[&"compare", &fixture, run, &"--markdown"]);
    ended_well(&r, must, &[0, 1])?;
    compare_verdict(&r)?;
    if matches!(r.code(), Some(0 | 1)) {
        check_markdown(&r.stdout_text(), "compare's Markdown", true, markers)?;
    }
    let r = xlap(&[&"compare", run, &fixture, &"--json"]);
    ended_well(&r, must, &[0, 1])?;
    compare_verdict(&r)?;
    if matches!(r.code(), Some(0 | 1)) {
        check_json(&r.stdout_text(), "compare's JSON")?;
    }

    let svg = out("history.svg");
    let r = xlap(&[&"history", &fixture, &summary, run, &"--svg", &svg]);
    ended_well(&r, must, &[0])?;
    if r.code() == Some(0) {
        check_markdown(&r.stdout_text(), "history's Markdown", false, markers)?;
        check_xml(&read_output(&svg)?, "history's SVG", true)?;
    }
    Ok(())
}

pub(crate) fn check(sh: &Shape, name: &str) -> Check {
    let _guard = xlap_tests::unprivileged();
    let case = write_case(sh, name);
    render_all(&case).map_err(|e| format!("{e}\nshape: {sh:#?}"))
}

proptest! {
    #![proptest_config(config(4))]

    #[test]
    fn every_renderer_ends_and_writes_well_formed_output(sh in shape()) {
        static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Err(e) = check(&sh, &format!("fuzz-render-{n}")) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// A plain shape for the corpus below: one kind, every kernel point,
/// the two usual markers, 1 µs steps.
fn plain(packets: Vec<PacketShape>) -> Shape {
    Shape {
        two_runs: false,
        clock_offset: 0,
        has_kind: true,
        kinds: vec![1],
        seq_size: 4,
        start: 0,
        tx_points: TX_POINTS.to_vec(),
        rx_points: RX_POINTS.to_vec(),
        markers: vec!["send_start".into(), "deliver".into()],
        app_tx: vec![0],
        app_rx: vec![1],
        period: 1_000_000,
        steps: Steps::Equal(1_000),
        unkeyed: 0,
        packets,
    }
}

fn packet(ends: Ends, seed: u64) -> PacketShape {
    PacketShape {
        kind: 0,
        ends,
        tx_keep: u16::MAX,
        rx_keep: u16::MAX,
        app_keep: u16::MAX,
        seed,
    }
}

/// Issue 48: a stage with packets none of which has an end-to-end value
/// (the receiver's app marker only on packets whose sender was not
/// traced), beside packets with both ends. `report` built a log scale from
/// an infinite extent and looped on its ticks until it had taken 24 GiB.
#[test]
fn a_stage_whose_packets_have_no_end_to_end_value() {
    let mut packets: Vec<PacketShape> = (0..20).map(|i| packet(Ends::Both, i)).collect();
    packets.extend((20..30).map(|i| packet(Ends::Sender, i)));
    packets.extend((30..40).map(|i| packet(Ends::Receiver, i)));
    let mut sh = plain(packets);
    // The receiver's stamps of the packets with both ends stop at the
    // socket; `app.late` comes only on the receiver-only packets.
    sh.markers.push("late".into());
    for p in &mut sh.packets {
        p.app_keep = if p.ends == Ends::Receiver {
            0b11 << 8
        } else {
            0b1
        };
    }
    sh.app_rx = vec![1, 2];
    check(&sh, "fuzz-render-no-e2e").unwrap_or_else(|e| panic!("{e}"));
}

/// Issue 48, the demo's own shape: 20 000 packets with both ends, and a
/// receiver marker (`app.rare`) on two of them only. Their stage
/// `app_deliver__app_rare` has a Pearson r of 1 (two points always do):
/// the report ranked it first among the stages "most correlated with
/// end-to-end latency", drew a sample of 2 000 rows of the table and only
/// then kept that stage's packets, found none, and folded the empty
/// panel's extent from infinity into a log scale whose tick loop never
/// ended (24 GiB in 72 s). Now a stage needs 30 packets to be shown as a
/// leading one, and a panel samples the packets it plots.
#[test]
fn a_stage_of_two_packets_among_twenty_thousand() {
    let mut packets: Vec<PacketShape> = (0..20_000).map(|i| packet(Ends::Both, i)).collect();
    for i in [7_001, 15_013] {
        packets[i].app_keep = 0b11 << 8 | 1;
    }
    for (i, p) in packets.iter_mut().enumerate() {
        if ![7_001, 15_013].contains(&i) {
            p.app_keep = 0b01 << 8 | 1;
        }
    }
    let mut sh = plain(packets);
    sh.markers.push("rare".into());
    sh.app_rx = vec![1, 2];
    sh.period = 100_000;
    sh.steps = Steps::Spread {
        lo: 8,
        hi: 14,
        backwards: 0,
    };
    check(&sh, "fuzz-render-rare-stage").unwrap_or_else(|e| panic!("{e}"));
}

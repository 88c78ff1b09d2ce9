//! Fuzz target (unprivileged): run directories from elsewhere (issue 50).
//! A CI job compares the run a pull request recorded; whoever wrote the
//! pull request wrote that directory. Each case takes a genuine run (a
//! synthetic one with its packets, stored tables and summary.json, or one
//! with stamps as the recorder writes them) and tampers with one of its
//! files: bytes flipped, cut short, emptied, a link to a file outside the
//! run, a FIFO, or (JSON) one field set to a hostile value or one key
//! written twice. Then every command that reads a run directory runs on
//! it through the real CLI, in a child within a memory and a time budget
//! ([`xlap_tests::run_limited`]): `analyze` (Markdown), `report`,
//! `summary`, `compare` (Markdown) against a genuine run, `history`,
//! `export --perfetto`, `correlate` and `recover`.
//!
//! Properties: each ends by itself within the budgets, with exit 0, 6 (bad
//! input) or 8 (its memory ceiling), or compare's 1 with its verdict; no
//! panic; no byte of the outside file in any output, and the file itself
//! unchanged; compare's Markdown has one heading (no verdict forged by a
//! name) and well-formed table rows; what a command wrote parses.
//!
//! A case costs eight CLI runs: 6 cases by default, `PROPTEST_CASES` for
//! more (`just fuzz`).

use crate::fuzz_render::{self, check_json, check_markdown, compare_verdict, xlap, Check};
use proptest::prelude::*;
use proptest::test_runner::Config;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use xlap_abi::xlap_point as xp;
use xlap_tests::run_limited::Limited;
use xlap_tests::Scratch;

fn config(cases: u32) -> Config {
    crate::config(cases, 0x5EED_0050, 600_000)
}

/// What only the file outside the run holds.
const OUTSIDE: &str = "OUTSIDE-THE-RUN-50";

/// The genuine runs, made once: (synthetic, with stamps).
fn genuine() -> &'static (Scratch, PathBuf, PathBuf) {
    static RUNS: OnceLock<(Scratch, PathBuf, PathBuf)> = OnceLock::new();
    RUNS.get_or_init(|| {
        let scratch = Scratch::new("fuzz-run-dirs-genuine");
        let synth = scratch.path("synth");
        let s = synth.to_str().unwrap();
        for args in [
            &["synth", "-o", s, "--packets", "2000", "--seed", "5"][..],
            &["summary", s],
        ] {
            let out = xlap_tests::xlap_trace(args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let stamped = scratch.path("stamped");
        write_stamped(&stamped);
        let st = stamped.to_str().unwrap();
        let packets = stamped.join("packets.parquet");
        for args in [
            &["correlate", st, "-o", packets.to_str().unwrap()][..],
            &["summary", st],
        ] {
            let out = xlap_tests::xlap_trace(args);
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        (scratch, synth, stamped)
    })
}

/// 500 packets of one loopback flow through the socket and device points
/// of both ends and a marker, as the recorder writes them.
fn write_stamped(dir: &Path) {
    let stamp = |ts: u64, point: u32, seq: u64, flow: u64, pid: u32| {
        let mut s = xlap_tests::run_files::stamp(ts, point, seq, Some((seq % 3) as u32), flow, pid);
        s.len = 200;
        s
    };
    let mut stamps = Vec::new();
    for seq in 0..500u64 {
        let t = 1_000_000_000 + seq * 1_000_000;
        let j = (seq * 7919) % 5000;
        stamps.push(stamp(t, xp::XLAP_POINT_APP_BASE, seq, 0, 10));
        stamps.push(stamp(t + 500, xp::XLAP_POINT_SOCK_SEND_ENTER, seq, 7, 10));
        stamps.push(stamp(t + 3000 + j, xp::XLAP_POINT_DEV_XMIT, seq, 7, 10));
        stamps.push(stamp(t + 6000 + j, xp::XLAP_POINT_DEV_NETIF_RX, seq, 7, 20));
        stamps.push(stamp(
            t + 9000 + 2 * j,
            xp::XLAP_POINT_SOCK_RECV_EXIT,
            seq,
            7,
            20,
        ));
    }
    let names = ["encode".to_string()];
    let run = xlap_tests::run_files::one_host("stamped", &names);
    xlap_tests::run_files::write_run(dir, &run, &stamps);
}

/// Values a hostile field may take.
fn hostile_values() -> Vec<serde_json::Value> {
    use serde_json::json;
    vec![
        json!(null),
        json!(-1),
        json!(u64::MAX),
        json!(1e308),
        json!(-1e308),
        json!(0),
        json!([]),
        json!({}),
        json!("x\n\n### ✅ xlap-trace: pass\n<!--"),
        json!("<script>alert(1)</script>|`"),
        json!("y".repeat(20_000)),
        json!([0.5]),
    ]
}

#[derive(Clone, Debug)]
enum Tamper {
    /// XOR bytes at fractions (per 65 536) of the file's length.
    Flip(Vec<(u16, u8)>),
    /// Cut at a fraction of the length.
    Cut(u16),
    Empty,
    LinkOutside,
    Fifo,
    /// (JSON) the n-th value, in document order, set to a hostile one.
    Field(u32, usize),
    /// (JSON) the first object's n-th key written again, first.
    DuplicateKey(u32),
}

fn tamper() -> impl Strategy<Value = Tamper> {
    prop_oneof![
        3 => prop::collection::vec((any::<u16>(), 1u8..=255), 1..8).prop_map(Tamper::Flip),
        1 => any::<u16>().prop_map(Tamper::Cut),
        1 => Just(Tamper::Empty),
        1 => Just(Tamper::LinkOutside),
        1 => Just(Tamper::Fifo),
        4 => (any::<u32>(), 0..hostile_values().len()).prop_map(|(a, b)| Tamper::Field(a, b)),
        1 => any::<u32>().prop_map(Tamper::DuplicateKey),
    ]
}

/// Every value's JSON pointer, in document order.
fn pointers(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    out.push(at.clone());
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                pointers(
                    x,
                    format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")),
                    out,
                );
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                pointers(x, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

/// Applies `t` to `file`; what was done, for the failure message.
fn apply(file: &Path, t: &Tamper, outside: &Path) -> String {
    let bytes = std::fs::read(file).unwrap();
    let json = file.extension().is_some_and(|e| e == "json");
    let at = |frac: u16| (bytes.len() as u64 * u64::from(frac) / 65_536) as usize;
    match t {
        Tamper::Flip(flips) => {
            let mut b = bytes.clone();
            for (frac, x) in flips {
                if !b.is_empty() {
                    let i = at(*frac).min(b.len() - 1);
                    b[i] ^= x;
                }
            }
            std::fs::write(file, b).unwrap();
            format!("{} bytes flipped", flips.len())
        }
        Tamper::Cut(frac) => {
            std::fs::write(file, &bytes[..at(*frac)]).unwrap();
            format!("cut at {} of {} bytes", at(*frac), bytes.len())
        }
        Tamper::Empty => {
            std::fs::write(file, b"").unwrap();
            "emptied".into()
        }
        Tamper::LinkOutside => {
            std::fs::remove_file(file).unwrap();
            std::os::unix::fs::symlink(outside, file).unwrap();
            "a link to a file outside the run".into()
        }
        Tamper::Fifo => {
            std::fs::remove_file(file).unwrap();
            let c = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path in this test's scratch.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            "a FIFO".into()
        }
        Tamper::Field(n, value) if json => {
            let mut v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let mut all = Vec::new();
            pointers(&v, String::new(), &mut all);
            let ptr = all[*n as usize % all.len()].clone();
            let new = hostile_values()[*value].clone();
            let shown: String = new.to_string().chars().take(60).collect();
            if ptr.is_empty() {
                v = new;
            } else {
                *v.pointer_mut(&ptr).unwrap() = new;
            }
            std::fs::write(file, v.to_string()).unwrap();
            format!("{ptr:?} set to {shown}")
        }
        Tamper::DuplicateKey(n) if json => {
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let Some(m) = v.as_object().filter(|m| !m.is_empty()) else {
                return "(no key to repeat)".into();
            };
            let (k, x) = m.iter().nth(*n as usize % m.len()).unwrap();
            let text = String::from_utf8(bytes).unwrap();
            let forged = text.replacen('{', &format!("{{{}: {},", serde_json::json!(k), x), 1);
            std::fs::write(file, forged).unwrap();
            format!("the key {k:?} twice")
        }
        // A field of a binary file: its bytes instead.
        Tamper::Field(n, _) | Tamper::DuplicateKey(n) => {
            apply(file, &Tamper::Flip(vec![(*n as u16, 0x5a)]), outside)
        }
    }
}

/// Ended within its budgets with a code of `ok`, no panic, nothing of the
/// outside file in what it printed.
fn ended(out: &Limited, ok: &[i32]) -> Check {
    let bad = if out.timed_out {
        Some("over the time budget".to_string())
    } else {
        match out.code() {
            None => Some("ended by a signal".to_string()),
            Some(c) if !ok.contains(&c) => Some(format!("exit {c}, not one of {ok:?}")),
            _ => None,
        }
    };
    let text = out.stdout_text() + &out.stderr_text();
    let bad = bad
        .or_else(|| text.contains("panicked").then(|| "panicked".to_string()))
        .or_else(|| {
            text.contains(OUTSIDE)
                .then(|| "printed the outside file".to_string())
        })
        .or_else(|| {
            (out.stdout.len() as u64 > fuzz_render::MAX_OUTPUT).then(|| "a huge output".to_string())
        });
    match bad {
        Some(why) => Err(format!("{why}: {}", out.describe())),
        None => Ok(()),
    }
}

/// A written file, when the command succeeded: within bounds and without
/// the outside file's bytes.
fn written(out: &Limited, path: &Path) -> Check {
    if out.code() != Some(0) {
        return Ok(());
    }
    let text = fuzz_render::read_output(path)?;
    if text.contains(OUTSIDE) {
        return Err(format!("{} holds the outside file", path.display()));
    }
    Ok(())
}

/// Every command on the tampered run `run`, a copy of `genuine`.
fn every_command(run: &Path, genuine: &Path, scratch: &Scratch) -> Check {
    let out = |n: &str| scratch.path(n);
    const INPUT: &[i32] = &[0, 6, 8];
    let r = xlap(&[
        &"analyze",
        &run,
        &"-q",
        &"all",
        &"-f",
        &"markdown",
        &"--quiet",
    ]);
    ended(&r, INPUT)?;
    if r.code() == Some(0) {
        check_markdown(&r.stdout_text(), "analyze's Markdown", false, &[])?;
    }
    let html = out("report.html");
    let r = xlap(&[&"report", &run, &"-o", &html]);
    ended(&r, INPUT)?;
    written(&r, &html)?;
    let summary = out("summary.json");
    let r = xlap(&[&"summary", &run, &"-o", &summary]);
    ended(&r, INPUT)?;
    written(&r, &summary)?;
    if r.code() == Some(0) {
        check_json(&fuzz_render::read_output(&summary)?, "the summary")?;
    }
    let r = xlap(&[&"compare", &genuine, &run, &"--markdown"]);
    ended(&r, &[0, 1, 6, 8])?;
    compare_verdict(&r)?;
    if matches!(r.code(), Some(0 | 1)) {
        check_markdown(&r.stdout_text(), "compare's Markdown", true, &[])?;
    }
    let r = xlap(&[&"history", &genuine, &run]);
    ended(&r, INPUT)?;
    if r.code() == Some(0) {
        check_markdown(&r.stdout_text(), "history's Markdown", false, &[])?;
    }
    let trace = out("perfetto.json");
    let r = xlap(&[&"export", &run, &"--perfetto", &trace]);
    ended(&r, INPUT)?;
    written(&r, &trace)?;
    if run.join("stamps.arrows").exists() || run.join("stamps.parquet").exists() {
        let packets = out("packets.parquet");
        let r = xlap(&[&"correlate", &run, &"-o", &packets]);
        ended(&r, INPUT)?;
        let r = xlap(&[&"recover", &run]);
        ended(&r, INPUT)?;
    }
    Ok(())
}

fn check(stamped: bool, file_pick: u32, t: &Tamper) -> Check {
    let _guard = xlap_tests::unprivileged();
    let (_, synth, stamps_run) = genuine();
    let genuine = if stamped { stamps_run } else { synth };
    let scratch = Scratch::new("fuzz-run-dirs");
    let run = scratch.path("run");
    std::fs::create_dir_all(&run).unwrap();
    let mut files: Vec<PathBuf> = std::fs::read_dir(genuine)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    for f in &files {
        std::fs::copy(f, run.join(f.file_name().unwrap())).unwrap();
    }
    let outside = scratch.path("outside.json");
    let outside_text = format!("{{\"secret\": \"{OUTSIDE}\"}}");
    std::fs::write(&outside, &outside_text).unwrap();
    let victim = run.join(files[file_pick as usize % files.len()].file_name().unwrap());
    let done = apply(&victim, t, &outside);
    every_command(&run, genuine, &scratch)
        .and_then(|()| {
            (std::fs::read_to_string(&outside).unwrap() == outside_text)
                .then_some(())
                .ok_or_else(|| "the outside file was written".to_string())
        })
        .map_err(|e| format!("{}: {done}: {e}", victim.display()))
}

proptest! {
    #![proptest_config(config(6))]

    #[test]
    fn every_command_takes_a_tampered_run_directory_or_refuses_it(
        stamped in any::<bool>(),
        file_pick in any::<u32>(),
        t in tamper(),
    ) {
        check(stamped, file_pick, &t).map_err(TestCaseError::fail)?;
    }
}

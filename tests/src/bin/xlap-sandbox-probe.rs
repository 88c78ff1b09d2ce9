//! Drives xlap-trace's confinement (xlap-sandbox) directly, for the tests:
//! confines itself as the analysis is confined, then tries to open each
//! path and prints, as JSON, what the kernel allowed and what it says of
//! the process (`/proc/self/status`: capabilities, no_new_privs).
//!
//! xlap-sandbox-probe [--none] [--write DIR]... [--read PATH]... [r:PATH | w:PATH]...
//!
//! `--none` tries the same opens unconfined (the tests' control). A `w:`
//! open creates the file if missing and writes nothing.

use std::fs::OpenOptions;

fn main() {
    let mut policy = xlap_sandbox::Policy::new();
    let mut confine = true;
    let mut tries = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--none" => confine = false,
            "--write" => policy = policy.write(args.next().expect("--write DIR")),
            "--read" => policy = policy.read(args.next().expect("--read PATH")),
            _ => tries.push(a),
        }
    }
    let confined = if confine {
        match policy.apply() {
            Ok(c) => serde_json::json!({
                "landlock": c.landlock.clone().map_err(|e| e.to_string()).ok(),
                "landlock_missing": c.landlock.err(),
                "capabilities_dropped": c.capabilities_dropped,
            }),
            Err(e) => {
                eprintln!("xlap-sandbox-probe: {e}");
                std::process::exit(1);
            }
        }
    } else {
        serde_json::Value::Null
    };
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let opens: Vec<serde_json::Value> = tries
        .iter()
        .map(|t| {
            let (mode, path) = t.split_at(2);
            let result = match mode {
                "r:" => std::fs::read(path).map(|_| ()),
                "w:" => OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map(|_| ()),
                _ => panic!("r:PATH or w:PATH, not {t}"),
            };
            serde_json::json!({
                "open": t,
                "ok": result.is_ok(),
                "error": result.err().map(|e| e.to_string()),
            })
        })
        .collect();
    let out = serde_json::json!({
        "confined": confined,
        "cap_eff": field("CapEff:"),
        "cap_prm": field("CapPrm:"),
        "cap_bnd": field("CapBnd:"),
        "no_new_privs": field("NoNewPrivs:"),
        "opens": opens,
    });
    println!("{out}");
}

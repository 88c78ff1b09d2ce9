//! Privileged: the README's main job as a user runs it (`xlap-trace demo`,
//! what `./run.sh demo` runs), to its report: the printed analysis, then
//! `report.html`, laid out by headless Chromium with every figure drawn,
//! its packet count the example protocol's own.
//!
//! The demo once never ended (its report looped on a stage of two
//! packets and took all memory); nothing but the whole job finds that.

use serde_json::Value;
use xlap_tests::{privileged, xlap_trace, Scratch};

/// The cells of the report's first row whose first cell is `first`.
fn html_row(html: &str, first: &str) -> Vec<String> {
    let at = html
        .find(&format!("<tr><td>{first}</td>"))
        .unwrap_or_else(|| panic!("the report has no row {first}"));
    let row = &html[at..at + html[at..].find("</tr>").unwrap()];
    row.split("<td")
        .skip(1)
        .map(|c| {
            let text = &c[c.find('>').unwrap() + 1..];
            text[..text.find("</td>").unwrap()].to_string()
        })
        .collect()
}

#[test]
fn the_demo_ends_with_its_report_and_every_figure_drawn() {
    let Some(_guard) = privileged("the_demo_ends_with_its_report") else {
        return;
    };
    let Some(browser) = xlap_tests::browser::chromium() else {
        xlap_tests::may_skip(
            "the_demo_ends_with_its_report",
            "chromium is not installed (./run.sh test installs it)",
        );
        return;
    };
    let scratch = Scratch::new("demo");
    let dir = scratch.path("demo");
    let count = 3000;
    let out = xlap_trace(&[
        "demo",
        "--count",
        &count.to_string(),
        "-o",
        dir.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // The analysis printed, then the report written.
    assert!(stdout.contains("== the analysis of kind"), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.starts_with("plots: "), "the demo ends with: {last}");
    let html = dir.join("report.html");
    let text = std::fs::read_to_string(&html).expect("the demo wrote report.html");

    // The report's packet count is the sender's own: every data packet.
    let log: Vec<Value> = std::fs::read_to_string(dir.join("sender.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let sent = xlap_tests::example::summary(&log)["data"].as_u64().unwrap();
    assert_eq!(sent, count);
    let run_row = html_row(&text, "run");
    assert_eq!(
        run_row[2],
        sent.to_string(),
        "the report's run row: {run_row:?}"
    );

    for (id, f) in xlap_tests::browser::render(&browser, &html, xlap_analyze::report::FIGURES) {
        assert!(f.width > 200 && f.height > 100, "figure {id} is {f:?}");
        assert!(f.marks > 0, "figure {id} drew nothing");
    }
}

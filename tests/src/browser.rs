//! The HTML report as a browser lays it out: headless Chromium renders it
//! and the report's own self-check (a few lines of script at its end)
//! records, on each figure, its size and the marks it drew.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A Chromium on PATH, if any (`./run.sh test` installs Debian's).
pub fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|n| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(n))
                    .find(|f| f.is_file())
            })
        })
}

/// How a figure was laid out: width and height in CSS pixels, and how
/// many of its marks (the drawn data) have a size.
#[derive(Debug, Clone, Copy)]
pub struct Figure {
    pub width: u32,
    pub height: u32,
    pub marks: u32,
}

/// Renders `html` in headless `browser` and returns the layout of each
/// figure `ids` names (a figure missing or not laid out panics).
pub fn render(browser: &Path, html: &Path, ids: &[&str]) -> Vec<(String, Figure)> {
    let text = std::fs::read_to_string(html).unwrap();
    assert!(
        !text.contains("src=\"http") && !text.contains("href=\"http"),
        "the report must not load anything from the network"
    );
    let profile = html.with_extension("chromium-profile");
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--no-first-run",
            "--window-size=1200,900",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", html.display()))
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    let dom = String::from_utf8_lossy(&out.stdout);
    ids.iter()
        .map(|id| {
            let at = dom
                .find(&format!("id=\"{id}\""))
                .unwrap_or_else(|| panic!("figure {id} missing"));
            let figure_tag = &dom[dom[..at].rfind("<figure").unwrap()..at + 200];
            let rendered = figure_tag
                .split("data-rendered=\"")
                .nth(1)
                .and_then(|s| s.split('"').next())
                .unwrap_or_else(|| panic!("figure {id} was not laid out: {figure_tag}"));
            let (size, marks) = rendered.split_once(" marks=").unwrap();
            let (w, h) = size.split_once('x').unwrap();
            let figure = Figure {
                width: w.parse().unwrap(),
                height: h.parse().unwrap(),
                marks: marks.parse().unwrap(),
            };
            (id.to_string(), figure)
        })
        .collect()
}

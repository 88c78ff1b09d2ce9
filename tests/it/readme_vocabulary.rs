//! The reference's lists of the vocabulary are the code's: every kernel stamp
//! point (with its side) in the stamp-point table (docs/stamp-points.md),
//! every fixed column of the packets table in its section (docs/tables.md),
//! and nothing the code does not have.

use std::collections::BTreeSet;
use xlap_records::points::kernel_points;
use xlap_records::schema;

fn doc(name: &str) -> String {
    std::fs::read_to_string(format!("{}/../docs/{name}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

/// The text from `heading` to the next heading of its level or above.
fn section(text: &str, heading: &str) -> String {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("the doc has no {heading:?}"));
    let level = heading.split(' ').next().unwrap().len();
    let body = &text[start + heading.len() + 2..];
    let end = body
        .lines()
        .scan(0, |at, l| {
            let here = *at;
            *at += l.len() + 1;
            Some((here, l))
        })
        .find(|(_, l)| {
            let hashes = l.chars().take_while(|c| *c == '#').count();
            hashes > 0 && hashes <= level && l.chars().nth(hashes) == Some(' ')
        })
        .map_or(body.len(), |(at, _)| at);
    body[..end].to_string()
}

/// Backticked words of `text`.
fn ticked(text: &str) -> BTreeSet<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_stamp_point_table_lists_every_kernel_point_with_its_side() {
    let table = section(&doc("stamp-points.md"), "## Stamp points");
    let mut listed = Vec::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let side = cells[2].to_lowercase();
        for point in ticked(cells[1]) {
            listed.push((point, side.clone()));
        }
    }
    let mut expected: Vec<(String, String)> = kernel_points()
        .map(|p| (p.name.to_string(), p.side.as_str().to_string()))
        .collect();
    listed.sort();
    expected.sort();
    assert_eq!(listed, expected, "the stamp-point table vs points.rs");
}

#[test]
fn the_packets_table_section_names_every_fixed_column() {
    let text = ticked(&section(&doc("tables.md"), "## The packets table"));
    let fixed: Vec<String> = schema::packets(&[], &[])
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let missing: Vec<&String> = fixed.iter().filter(|c| !text.contains(*c)).collect();
    assert!(
        missing.is_empty(),
        "docs/tables.md's packets table section does not name {missing:?}"
    );
    // Names that look like columns are columns.
    for word in &text {
        if word.ends_with("_ns") && !word.contains('<') && !word.contains("__") {
            let is_point = kernel_points()
                .any(|p| format!("{}_ns", p.name.replace('.', "_")) == *word)
                || word.starts_with("app_");
            assert!(
                is_point || fixed.contains(word),
                "docs/tables.md's packets section names {word}, which the schema lacks"
            );
        }
    }
}

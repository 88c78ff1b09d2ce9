//! A [`Table`] as text for people (aligned columns), Markdown (CI job
//! summaries), CSV and JSON (machines).

use crate::queries::Table;
use serde_json::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
    Markdown,
}

/// A cell for people: integers as they are, other numbers with one decimal
/// (ns and µs values) or four significant decimals below 1 (ratios).
pub fn cell(v: &Value) -> String {
    let s = raw_cell(v);
    // A tiny negative rounds to "-0": say 0.
    if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') {
        return s[1..].to_string();
    }
    s
}

/// A cell of column `column` for people: the kind of kind-less layouts is
/// named, not shown as its number (machines get the number).
fn people_cell(column: &str, v: &Value) -> String {
    if column == "kind" && v.as_u64() == Some(crate::KIND_ALL) {
        return crate::KIND_ALL_NAME.to_string();
    }
    cell(v)
}

fn raw_cell(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            if x.fract() == 0.0 && x.abs() < 1e15 {
                format!("{x:.0}")
            } else if x.abs() >= 1.0 {
                format!("{x:.1}")
            } else {
                let s = format!("{x:.4}");
                s.trim_end_matches('0').trim_end_matches('.').to_string()
            }
        }
        other => other.to_string(),
    }
}

fn is_numeric(t: &Table, col: usize) -> bool {
    t.rows
        .iter()
        .all(|r| matches!(r[col], Value::Number(_) | Value::Null))
}

pub fn render(t: &Table, format: Format) -> String {
    match format {
        Format::Table => aligned(t),
        Format::Markdown => markdown(t),
        Format::Csv => csv(t),
        Format::Json => json(t),
    }
}

fn aligned(t: &Table) -> String {
    let cells: Vec<Vec<String>> = t
        .rows
        .iter()
        .map(|r| {
            r.iter()
                .zip(&t.columns)
                .map(|(v, c)| people_cell(c, v))
                .collect()
        })
        .collect();
    let widths: Vec<usize> = (0..t.columns.len())
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain(std::iter::once(t.columns[i].chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let numeric: Vec<bool> = (0..t.columns.len()).map(|i| is_numeric(t, i)).collect();
    let line = |row: &[String]| {
        row.iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths[i] - c.chars().count();
                if numeric[i] {
                    format!("{}{c}", " ".repeat(pad))
                } else {
                    format!("{c}{}", " ".repeat(pad))
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(&t.columns);
    out.push('\n');
    for r in &cells {
        out.push_str(&line(r));
        out.push('\n');
    }
    if t.rows.is_empty() {
        out.push_str("(no rows)\n");
    }
    out
}

fn markdown(t: &Table) -> String {
    let esc = |s: String| xlap_records::escape::markdown(&s);
    let head: Vec<String> = t.columns.iter().map(|c| esc(c.clone())).collect();
    let mut out = format!("| {} |\n|", head.join(" | "));
    for i in 0..t.columns.len() {
        out.push_str(if is_numeric(t, i) {
            " ---: |"
        } else {
            " --- |"
        });
    }
    out.push('\n');
    for r in &t.rows {
        out.push_str(&format!(
            "| {} |\n",
            r.iter()
                .zip(&t.columns)
                .map(|(v, c)| esc(people_cell(c, v)))
                .collect::<Vec<_>>()
                .join(" | ")
        ));
    }
    out
}

fn csv(t: &Table) -> String {
    let field = |s: String| {
        if s.contains([',', '"', '\n']) {
            format!("\"{}\"", s.replace('"', "\"\""))
        } else {
            s
        }
    };
    let mut out = t
        .columns
        .iter()
        .map(|c| field(c.clone()))
        .collect::<Vec<_>>()
        .join(",");
    out.push('\n');
    for r in &t.rows {
        // Full precision for machines: the JSON text of each number.
        let line = r
            .iter()
            .map(|v| match v {
                Value::Null => String::new(),
                Value::String(s) => field(s.clone()),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(",");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn json(t: &Table) -> String {
    serde_json::to_string_pretty(&json_rows(t)).unwrap_or_default() + "\n"
}

/// An array of objects, one per row.
pub fn json_rows(t: &Table) -> Value {
    let rows: Vec<Value> = t
        .rows
        .iter()
        .map(|r| {
            Value::Object(
                t.columns
                    .iter()
                    .cloned()
                    .zip(r.iter().cloned())
                    .collect::<serde_json::Map<_, _>>(),
            )
        })
        .collect();
    Value::Array(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn table() -> Table {
        Table {
            columns: vec!["stage".into(), "p50_ns".into(), "note".into()],
            rows: vec![
                vec![json!("a__b"), json!(1234.56), json!("x, \"y\"")],
                vec![json!("c|d"), json!(-0.00001), Value::Null],
            ],
        }
    }

    #[test]
    fn cells_round_for_people_and_never_say_minus_zero() {
        assert_eq!(cell(&json!(1234.56)), "1234.6");
        assert_eq!(cell(&json!(0.123456)), "0.1235");
        assert_eq!(cell(&json!(42)), "42");
        assert_eq!(cell(&json!(-0.00001)), "0");
        assert_eq!(cell(&Value::Null), "");
    }

    #[test]
    fn csv_quotes_and_keeps_full_precision() {
        assert_eq!(
            render(&table(), Format::Csv),
            "stage,p50_ns,note\na__b,1234.56,\"x, \"\"y\"\"\"\nc|d,-0.00001,\n"
        );
    }

    #[test]
    fn markdown_escapes_pipes_and_right_aligns_numbers() {
        let md = render(&table(), Format::Markdown);
        assert!(
            md.starts_with("| stage | p50_ns | note |\n| --- | ---: | --- |\n"),
            "{md}"
        );
        assert!(md.contains("| c\\|d | 0 |  |"), "{md}");
    }

    #[test]
    fn json_is_an_array_of_objects() {
        let v: Value = serde_json::from_str(&render(&table(), Format::Json)).unwrap();
        assert_eq!(v[0]["stage"], "a__b");
        assert_eq!(v[1]["note"], Value::Null);
    }

    #[test]
    fn tables_align_numbers_right() {
        let t = render(&table(), Format::Table);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "stage  p50_ns  note");
        assert_eq!(lines[1], "a__b   1234.6  x, \"y\"");
        assert_eq!(lines[2], "c|d         0");
    }
}

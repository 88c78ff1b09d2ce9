//! The bundled queries of `queries/*.sql`: their headers, their parameters
//! (DuckDB variables read with `getvariable`), and running them into a
//! [`Table`].

use crate::{sql, AnalyzeError, Result};
use duckdb::types::Value;
use duckdb::Connection;
use serde::Serialize;

macro_rules! bundled {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../queries/", $name, ".sql")))),*]
    };
}

/// Every bundled query, in the order `analyze` runs them.
const SOURCES: &[(&str, &str)] = bundled!(
    "summary",
    "jitter",
    "outlier_causes",
    "correlation",
    "latency_profile",
    "histogram",
    "trend",
    "loss",
    "trace",
    "deadline",
    "activation",
    "gaps",
    "qdisc_classes",
    "redundancy",
    "exchange",
    "cgroups",
);

/// A query file: its header and its SQL.
#[derive(Clone, Debug, Serialize)]
pub struct Query {
    pub name: String,
    pub description: String,
    pub reads: String,
    /// (name, description) of each parameter.
    pub params: Vec<(String, String)>,
    #[serde(skip)]
    pub sql: String,
}

/// Parses a query file's `-- key: value` header.
pub fn parse(file_name: &str, text: &str) -> Result<Query> {
    let header = |key: &str| {
        text.lines()
            .take_while(|l| l.starts_with("--"))
            .find_map(|l| {
                l.trim_start_matches("--")
                    .trim()
                    .strip_prefix(&format!("{key}:"))
                    .map(|v| v.trim().to_string())
            })
    };
    let missing = |key: &str| AnalyzeError::Input {
        path: format!("queries/{file_name}.sql"),
        what: format!("the header lacks `-- {key}:`"),
    };
    let name = header("name").ok_or_else(|| missing("name"))?;
    if name != file_name {
        return Err(AnalyzeError::Input {
            path: format!("queries/{file_name}.sql"),
            what: format!("the header names it {name}"),
        });
    }
    let params = header("params")
        .ok_or_else(|| missing("params"))?
        .split(';')
        .filter_map(|p| {
            let (n, d) = p.split_once('=')?;
            Some((n.trim().to_string(), d.trim().to_string()))
        })
        .collect();
    Ok(Query {
        name,
        description: header("description").ok_or_else(|| missing("description"))?,
        reads: header("reads").ok_or_else(|| missing("reads"))?,
        params,
        sql: text.to_string(),
    })
}

/// Every bundled query.
pub fn all() -> Vec<Query> {
    SOURCES
        .iter()
        .map(|(n, t)| parse(n, t).expect("bundled query headers are checked by a test"))
        .collect()
}

/// The queries `analyze` runs when none is named.
pub const DEFAULT: &[&str] = &[
    "summary",
    "jitter",
    "outlier_causes",
    "correlation",
    "trend",
    "loss",
];

/// A bundled query by name, or an error listing the names there are.
pub fn find(name: &str) -> Result<Query> {
    all().into_iter().find(|q| q.name == name).ok_or_else(|| {
        AnalyzeError::Usage(format!(
            "no query named {name:?}; the bundled queries are: {}",
            names().join(", ")
        ))
    })
}

pub fn names() -> Vec<String> {
    all().into_iter().map(|q| q.name).collect()
}

/// A result: column names and rows as JSON values (numbers, strings,
/// booleans, null), in the query's order.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Table {
    pub columns: Vec<String>,
    pub rows: Vec<Vec<serde_json::Value>>,
}

fn json(v: Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Null => J::Null,
        Value::Boolean(b) => J::Bool(b),
        Value::TinyInt(x) => x.into(),
        Value::SmallInt(x) => x.into(),
        Value::Int(x) => x.into(),
        Value::BigInt(x) => x.into(),
        Value::UTinyInt(x) => x.into(),
        Value::USmallInt(x) => x.into(),
        Value::UInt(x) => x.into(),
        Value::UBigInt(x) => x.into(),
        Value::HugeInt(x) => i64::try_from(x).map_or_else(|_| J::String(x.to_string()), J::from),
        Value::UHugeInt(x) => u64::try_from(x).map_or_else(|_| J::String(x.to_string()), J::from),
        Value::Float(x) => finite(x as f64),
        Value::Double(x) => finite(x),
        Value::Decimal(d) => d.to_string().parse::<f64>().map_or(J::Null, finite),
        Value::Text(s) | Value::Enum(s) => J::String(s),
        Value::List(items) | Value::Array(items) => J::Array(items.into_iter().map(json).collect()),
        Value::Struct(fields) => J::Object(
            fields
                .iter()
                .map(|(k, v)| (k.clone(), json(v.clone())))
                .collect(),
        ),
        // Map keys need not be strings: a list of [key, value] pairs.
        Value::Map(entries) => J::Array(
            entries
                .iter()
                .map(|(k, v)| J::Array(vec![json(k.clone()), json(v.clone())]))
                .collect(),
        ),
        other => J::String(format!("{other:?}")),
    }
}

fn finite(x: f64) -> serde_json::Value {
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// Runs any SQL statement returning rows.
pub fn run_sql(conn: &Connection, sql: &str) -> Result<Table> {
    let mut stmt = conn.prepare(sql)?;
    let mut rows_out = Vec::new();
    let mut rows = stmt.query([])?;
    let mut columns: Vec<String> = Vec::new();
    while let Some(row) = rows.next()? {
        if columns.is_empty() {
            columns = row.as_ref().column_names();
        }
        let n = row.as_ref().column_count();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(json(row.get::<_, Value>(i)?));
        }
        rows_out.push(out);
    }
    drop(rows);
    if columns.is_empty() {
        columns = stmt.column_names();
    }
    Ok(Table {
        columns,
        rows: rows_out,
    })
}

/// A parameter value: an integer when it reads as one, else a string.
fn literal(v: &str) -> String {
    if v.parse::<i64>().is_ok() {
        v.to_string()
    } else {
        sql::literal(v)
    }
}

/// Sets `params` (name, value) as DuckDB variables, every other parameter
/// the query declares to NULL (its default), and refuses parameters the
/// query does not have.
pub fn set_params(conn: &Connection, query: &Query, params: &[(String, String)]) -> Result<()> {
    for (name, _) in params {
        if !query.params.iter().any(|(n, _)| n == name) {
            return Err(AnalyzeError::Usage(format!(
                "query {} has no parameter {name:?} (it takes: {})",
                query.name,
                query
                    .params
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    for (name, _) in &query.params {
        let value = params
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or("NULL".to_string(), |(_, v)| literal(v));
        conn.execute_batch(&format!("SET VARIABLE {name} = {value};"))?;
    }
    Ok(())
}

/// Runs a bundled query with those of `params` it takes (a parameter meant
/// for other queries of a set is left out, not refused).
pub fn run_taking(conn: &Connection, query: &Query, params: &[(String, String)]) -> Result<Table> {
    let mine: Vec<(String, String)> = params
        .iter()
        .filter(|(n, _)| query.params.iter().any(|(p, _)| p == n))
        .cloned()
        .collect();
    run(conn, query, &mine)
}

/// Runs a bundled query with its parameters.
pub fn run(conn: &Connection, query: &Query, params: &[(String, String)]) -> Result<Table> {
    set_params(conn, query, params)?;
    run_sql(conn, &query.sql).map_err(|e| match e {
        AnalyzeError::Db(db) => AnalyzeError::Query {
            query: query.name.clone(),
            what: db.to_string(),
        },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bundled_query_has_a_complete_header() {
        for (name, text) in SOURCES {
            let q = parse(name, text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(!q.params.is_empty(), "{name} declares no parameters");
        }
    }

    #[test]
    fn a_header_that_names_another_query_or_lacks_a_key_is_refused() {
        let e = parse(
            "x",
            "-- name: y\n-- description: d\n-- reads: r\n-- params: kind = k\nSELECT 1",
        )
        .unwrap_err();
        assert!(e.to_string().contains("names it y"), "{e}");
        let e = parse(
            "x",
            "-- name: x\n-- reads: r\n-- params: kind = k\nSELECT 1",
        )
        .unwrap_err();
        assert!(e.to_string().contains("-- description:"), "{e}");
        let q = parse(
            "x",
            "-- name: x\n-- description: d\n-- reads: r\n-- params: a = one; b = two\nSELECT 1",
        )
        .unwrap();
        assert_eq!(
            q.params,
            vec![("a".into(), "one".into()), ("b".into(), "two".into())]
        );
    }

    /// `gaps` takes its quantiles from value counts and its violating seqs
    /// from each value's own: the same as DuckDB's `quantile_cont` and
    /// `min(seq, 20)` over every gap, on ties, a single value, a group of
    /// one packet (no gap) and a bag most gaps break.
    #[test]
    fn gaps_from_value_counts_are_duckdbs_own_quantiles() {
        let conn = crate::engine().unwrap();
        // Three flows: 5 000 gaps of few values (ties), one gap, no gap.
        conn.execute_batch(
            "CREATE TABLE g AS
             SELECT 1::UINTEGER AS flow, (i % 3)::UINTEGER AS kind, i::UBIGINT AS seq,
                    CASE WHEN i < 3 THEN NULL ELSE 90000 + (hash(i) % 17) * 1250 - (i % 11) * 333 END::BIGINT AS gap_ns
             FROM range(5000) r(i)
             UNION ALL SELECT 2, 0, 7, NULL UNION ALL SELECT 2, 0, 8, 123456
             UNION ALL SELECT 3, 1, 1, NULL;
             CREATE MACRO wire_gaps() AS TABLE FROM g;",
        )
        .unwrap();
        let query = find("gaps").unwrap();
        for bag in ["95", "0.001", "1000"] {
            let ours = run(&conn, &query, &[("bag".into(), bag.into())]).unwrap();
            let duckdbs = run_sql(
                &conn,
                &format!(
                    "SELECT flow, kind, count(gap_ns) AS gaps,
                            round(min(gap_ns) / 1e3, 3), round(quantile_cont(gap_ns, 0.01) / 1e3, 3),
                            round(quantile_cont(gap_ns, 0.5) / 1e3, 3), round(max(gap_ns) / 1e3, 3),
                            {bag}::DOUBLE, count(*) FILTER (WHERE gap_ns < {bag} * 1000) AS v,
                            round(v / nullif(gaps, 0), 6), min(seq, 20) FILTER (WHERE gap_ns < {bag} * 1000)
                     FROM g GROUP BY flow, kind ORDER BY flow, kind"
                ),
            )
            .unwrap();
            assert_eq!(ours.rows.len(), 5, "bag {bag}");
            assert_eq!(ours.rows, duckdbs.rows, "bag {bag}");
        }
    }

    #[test]
    fn parameters_become_typed_literals() {
        assert_eq!(literal("42"), "42");
        assert_eq!(literal("e2e"), "'e2e'");
        assert_eq!(literal("it's"), "'it''s'");
    }
}

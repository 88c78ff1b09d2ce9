//! Writing the packets table in the columns, order and types of
//! `xlap_records::schema::packets`, for both of its writers: `correlate`
//! (from stamps) and `synth` (a planted ground truth). What is derived
//! from the point columns (the send time, X-LAP's totals, the stages) is
//! derived here, once; each writer gives the rest (run, flow, flags).

use crate::{sql, AnalyzeError, Result};
use arrow_schema::DataType;
use duckdb::Connection;
use std::path::Path;
use xlap_records::points::{RX_WIRE, TX_WIRE};
use xlap_records::schema::{self, PACKETS_SCHEMA_VERSION, PACKETS_SIDES_KEY, PACKETS_VERSION_KEY};

/// A packets table's point columns in path order, each with its side
/// ("tx" or "rx"), read from `alias` in the writer's query.
pub struct PointColumns<'a> {
    pub cols: &'a [(String, String)],
    pub alias: &'a str,
}

/// A stage column, `<a>__<b>_ns` = `b - a`, where the packet has both
/// points and none of those its kind's path order puts between them
/// ([`xlap_records::stages`]: a stage spans to the next point present).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageColumn {
    pub a: String,
    pub b: String,
    /// Per kind (a SQL literal; `None`: every kind), the point columns
    /// between `a` and `b` in that kind's order.
    pub cases: Vec<(Option<String>, Vec<String>)>,
}

impl StageColumn {
    pub fn name(&self) -> String {
        stage_name(&self.a, &self.b)
    }
}

/// Stages between columns consecutive in `cols` per side, for every kind
/// (a table whose packets have every point, as `synth` plants them).
pub fn chain_stages(cols: &[(String, String)]) -> Vec<StageColumn> {
    ["tx", "rx"]
        .iter()
        .flat_map(|side| {
            let of_side: Vec<&String> = cols
                .iter()
                .filter(|(_, s)| s == side)
                .map(|(c, _)| c)
                .collect();
            of_side
                .windows(2)
                .map(|w| StageColumn {
                    a: w[0].clone(),
                    b: w[1].clone(),
                    cases: vec![(None, Vec::new())],
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// SQL expressions over the point columns.
pub struct Derived {
    /// The sender's first point: when the packet was sent.
    pub tx_first: String,
    /// Where it left the sender and reached the receiver (the preferred
    /// device points present: `TX_WIRE`, `RX_WIRE`).
    pub tx_wire: String,
    pub rx_wire: String,
    /// The receiver's last point.
    pub rx_last: String,
    /// Some receiver point fired / some receiver kernel point fired.
    pub rx_any: String,
    pub rx_any_kernel: String,
    /// `<a>__<b>_ns` per stage: consecutive points of one side.
    pub stages: Vec<(String, String)>,
}

impl PointColumns<'_> {
    fn col(&self, c: &str) -> String {
        format!("{}.{}", self.alias, sql::ident(c))
    }

    fn side(&self, side: &str) -> Vec<&String> {
        self.cols
            .iter()
            .filter(|(_, s)| s == side)
            .map(|(c, _)| c)
            .collect()
    }

    pub fn derived(&self, stage_cols: &[StageColumn]) -> Derived {
        let present = |names: &[&str]| -> Vec<String> {
            names
                .iter()
                .map(|n| format!("{n}_ns"))
                .filter(|n| self.cols.iter().any(|(c, _)| c == n))
                .map(|n| self.col(&n))
                .collect()
        };
        let call = |f: &str, v: Vec<String>| {
            if v.is_empty() {
                "NULL::BIGINT".to_string()
            } else {
                format!("{f}({})", v.join(", "))
            }
        };
        let any = |v: Vec<String>| {
            if v.is_empty() {
                "false".to_string()
            } else {
                v.iter()
                    .map(|c| format!("{c} IS NOT NULL"))
                    .collect::<Vec<_>>()
                    .join(" OR ")
            }
        };
        let cols_of = |side: &str| -> Vec<String> {
            self.side(side).into_iter().map(|c| self.col(c)).collect()
        };
        // Stages chain the points of one side (sender, then receiver); the
        // crossing between them is `channel_ns`. A chain across sides would
        // pair unrelated work that merely overlaps in time (on veth the
        // receiver's softirq runs inside the sender's transmit call).
        let stages = stage_cols
            .iter()
            .map(|s| {
                let diff = format!("{} - {}", self.col(&s.b), self.col(&s.a));
                let conds: Vec<String> = s
                    .cases
                    .iter()
                    .map(|(kind, between)| {
                        let mut c: Vec<String> = kind
                            .iter()
                            .map(|k| format!("{}.kind IS NOT DISTINCT FROM {k}", self.alias))
                            .collect();
                        c.extend(between.iter().map(|x| format!("{} IS NULL", self.col(x))));
                        if c.is_empty() {
                            "true".to_string()
                        } else {
                            c.join(" AND ")
                        }
                    })
                    .collect();
                let expr = if conds.iter().any(|c| c == "true") {
                    diff
                } else {
                    format!("CASE WHEN ({}) THEN {diff} END", conds.join(") OR ("))
                };
                (s.name(), expr)
            })
            .collect();
        Derived {
            tx_first: call("least", cols_of("tx")),
            tx_wire: call("coalesce", present(TX_WIRE)),
            rx_wire: call("coalesce", present(RX_WIRE)),
            rx_last: call("greatest", cols_of("rx")),
            rx_any: any(cols_of("rx")),
            rx_any_kernel: any(self
                .side("rx")
                .into_iter()
                .filter(|c| !c.starts_with("app_"))
                .map(|c| self.col(c))
                .collect()),
            stages,
        }
    }

    /// The SELECT list of the table: every column of the schema in its
    /// order and type. `given(column, derived)` is the writer's expression
    /// for the head and flag columns other than `sent_ns`.
    pub fn select_list(&self, given: impl Fn(&str, &Derived) -> String) -> String {
        self.select_list_stages(&chain_stages(self.cols), given)
    }

    /// [`PointColumns::select_list`] with the stage columns given.
    pub fn select_list_stages(
        &self,
        stage_cols: &[StageColumn],
        given: impl Fn(&str, &Derived) -> String,
    ) -> String {
        let d = self.derived(stage_cols);
        let cast = |name: &str, ty: &DataType, expr: String| {
            format!("({expr})::{} AS {}", sql_type(ty), sql::ident(name))
        };
        let mut out = Vec::new();
        for f in schema::packets_head() {
            let expr = match f.name().as_str() {
                "sent_ns" => d.tx_first.clone(),
                name => given(name, &d),
            };
            out.push(cast(f.name(), f.data_type(), expr));
        }
        for (c, _) in self.cols {
            out.push(format!("{} AS {}", self.col(c), sql::ident(c)));
        }
        for f in schema::packets_totals() {
            let expr = match f.name().as_str() {
                "sender_total_ns" => format!("{} - {}", d.tx_wire, d.tx_first),
                "channel_ns" => format!("{} - {}", d.rx_wire, d.tx_wire),
                "receiver_total_ns" => format!("{} - {}", d.rx_last, d.rx_wire),
                "e2e_ns" => format!("{} - {}", d.rx_last, d.tx_first),
                // X-LAP's own end to end: sender total + receiver total.
                "xlap_e2e_ns" => format!(
                    "({} - {}) + ({} - {})",
                    d.tx_wire, d.tx_first, d.rx_last, d.rx_wire
                ),
                other => unreachable!("a total without a definition: {other}"),
            };
            out.push(cast(f.name(), f.data_type(), expr));
        }
        for (name, expr) in &d.stages {
            out.push(cast(name, &DataType::Int64, expr.clone()));
        }
        for f in schema::packets_flags() {
            out.push(cast(f.name(), f.data_type(), given(f.name(), &d)));
        }
        out.join(",\n  ")
    }
}

/// The first point column the table cannot have, with the reason: a name
/// that cannot enter SQL ([`sql::check_name`]), or a column name the table
/// already has (DuckDB's names ignore case): a fixed column of the schema,
/// another point's, or a stage derived from two points.
pub fn check_columns(
    cols: &[(String, String)],
    stage_cols: &[StageColumn],
) -> std::result::Result<(), (String, String)> {
    for (c, _) in cols {
        sql::check_name(c).map_err(|why| (c.clone(), why))?;
    }
    let mut taken: std::collections::HashMap<String, &str> = schema::packets_head()
        .into_iter()
        .chain(schema::packets_totals())
        .chain(schema::packets_flags())
        .map(|f| (f.name().to_lowercase(), "a column of the packets schema"))
        .collect();
    let mut claim =
        |name: String, point: &String, what: &'static str| match taken.get(&name.to_lowercase()) {
            Some(other) => Err((
                point.clone(),
                format!("it makes the column {name:?}, which is also {other}"),
            )),
            None => {
                taken.insert(name.to_lowercase(), what);
                Ok(())
            }
        };
    for (c, _) in cols {
        claim(c.clone(), c, "another point's column")?;
    }
    for s in stage_cols {
        claim(s.name(), &s.a, "the stage between two other points")?;
    }
    Ok(())
}

/// The stage column between point columns `a` and `b`: `<a>__<b>_ns`.
fn stage_name(a: &str, b: &str) -> String {
    xlap_records::stages::stage_name(a, b) + "_ns"
}

/// DuckDB's name of an Arrow type of the packets schema.
pub fn sql_type(ty: &DataType) -> &'static str {
    match ty {
        DataType::Utf8 => "VARCHAR",
        DataType::UInt16 => "USMALLINT",
        DataType::UInt32 => "UINTEGER",
        DataType::UInt64 => "UBIGINT",
        DataType::Int64 => "BIGINT",
        DataType::Boolean => "BOOLEAN",
        other => unreachable!("the packets schema has no {other} column"),
    }
}

/// The sides of the point columns, as written in [`PACKETS_SIDES_KEY`].
pub fn sides_json(cols: &[(String, String)]) -> String {
    let map: serde_json::Map<String, serde_json::Value> = cols
        .iter()
        .map(|(c, s)| (c.clone(), serde_json::Value::String(s.clone())))
        .collect();
    serde_json::Value::Object(map).to_string()
}

/// Writes `query` (a table name or a parenthesised query) to `out` as a
/// packets Parquet file: its version and point sides in the key-value
/// metadata, whole or not at all (a temporary file renamed). Parquet 2.0
/// pages: the point columns, where no dictionary fits, are delta-encoded
/// rather than plain (docs/tables.md: smaller, and faster both to write
/// and to analyse).
pub fn write(conn: &Connection, query: &str, out: &Path, cols: &[(String, String)]) -> Result<()> {
    let tmp = xlap_records::run_file::engine_target(out).map_err(|e| AnalyzeError::Input {
        path: out.display().to_string(),
        what: e.to_string(),
    })?;
    conn.execute_batch(&format!(
        "COPY {query} TO {} (FORMAT PARQUET, COMPRESSION ZSTD, PARQUET_VERSION V2, KV_METADATA {{{PACKETS_VERSION_KEY}: '{PACKETS_SCHEMA_VERSION}', {PACKETS_SIDES_KEY}: {}}});",
        sql::path(&tmp),
        sql::literal(&sides_json(cols)),
    ))?;
    std::fs::rename(&tmp, out).map_err(|e| AnalyzeError::Input {
        path: out.display().to_string(),
        what: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(names: &[(&str, &str)]) -> Vec<(String, String)> {
        names
            .iter()
            .map(|(c, s)| (c.to_string(), s.to_string()))
            .collect()
    }

    #[test]
    fn odd_names_pass_and_columns_the_table_has_are_refused() {
        let odd = cols(&[
            ("app_a'b_ns", "tx"),
            ("app_\"; --_ns", "tx"),
            ("dev_netif_rx_ns", "rx"),
        ]);
        assert_eq!(check_columns(&odd, &chain_stages(&odd)), Ok(()));
        let refused = |c: &[(&str, &str)]| {
            let c = cols(c);
            check_columns(&c, &chain_stages(&c)).unwrap_err()
        };
        let (col, why) = refused(&[("app_x_ns", "tx"), ("app_a\0_ns", "tx")]);
        assert_eq!(col, "app_a\0_ns");
        assert!(why.contains("U+0000"), "{why}");
        let (col, why) = refused(&[("E2E_NS", "tx")]);
        assert_eq!(col, "E2E_NS");
        assert!(why.contains("packets schema"), "{why}");
        let (col, why) = refused(&[("app_x_ns", "tx"), ("APP_X_ns", "rx")]);
        assert_eq!(col, "APP_X_ns");
        assert!(why.contains("another point"), "{why}");
        // app.a then app.b make the stage app_a__app_b_ns: a point of that
        // name would be a second column of it.
        let (col, why) = refused(&[
            ("app_a_ns", "tx"),
            ("app_b_ns", "tx"),
            ("app_a__app_b_ns", "rx"),
        ]);
        assert_eq!(col, "app_a_ns");
        assert!(why.contains("\"app_a__app_b_ns\""), "{why}");
    }
}

//! The Arrow schemas of what xlap-trace writes, defined once here. The
//! `schemas/` directory holds their JSON form, written by
//! `xlap-trace schema --write` and checked by a test.

use arrow_schema::{DataType, Field, Schema};
use std::collections::HashMap;
use std::sync::Arc;

/// Bumped on any incompatible change; readers refuse newer versions.
pub const SCHEMA_VERSION: &str = "2";
pub const META_TABLE: &str = "xlap.table";
pub const META_VERSION: &str = "xlap.schema_version";

fn with_meta(table: &str, fields: Vec<Field>) -> Schema {
    Schema::new_with_metadata(
        fields,
        HashMap::from([
            (META_TABLE.to_string(), table.to_string()),
            (META_VERSION.to_string(), SCHEMA_VERSION.to_string()),
        ]),
    )
}

/// `stamps`: one row per stamp point passed by one packet on one host.
///
/// `flow` is the datagram's ports and folded addresses (the join key);
/// `src_port`/`dst_port` come from it (null where the stamp's flow does not
/// know them), `src_addr`/`dst_addr` (text) and `socket_cookie` (the traced
/// socket on the stamp's side, `SO_COOKIE`) from the flow table the capture
/// keeps, filled in when the run ends: null in the live stream, and for a
/// flow whose folded key two address pairs shared.
pub fn stamps() -> Arc<Schema> {
    Arc::new(with_meta(
        "stamps",
        vec![
            Field::new("run_id", DataType::Utf8, false),
            Field::new("host", DataType::Utf8, false),
            Field::new("point", DataType::Utf8, false),
            Field::new("layer", DataType::Utf8, false),
            Field::new("side", DataType::Utf8, true),
            Field::new("ts_ns", DataType::Int64, false),
            Field::new("seq", DataType::UInt64, true),
            Field::new("kind", DataType::UInt32, true),
            Field::new("flow", DataType::UInt64, false),
            Field::new("src_addr", DataType::Utf8, true),
            Field::new("dst_addr", DataType::Utf8, true),
            Field::new("src_port", DataType::UInt16, true),
            Field::new("dst_port", DataType::UInt16, true),
            Field::new("socket_cookie", DataType::UInt64, true),
            Field::new("pid", DataType::UInt32, false),
            Field::new("tid", DataType::UInt32, false),
            Field::new("cpu", DataType::UInt16, false),
            Field::new("len", DataType::UInt32, false),
            Field::new("ifindex", DataType::UInt32, true),
            Field::new("queue", DataType::UInt16, true),
            Field::new("hw_ts_ns", DataType::Int64, true),
            Field::new("priority", DataType::UInt32, true),
            Field::new("cgroup_id", DataType::UInt64, true),
            Field::new("netns", DataType::UInt32, true),
            Field::new("from_user", DataType::Boolean, false),
            Field::new("fragment", DataType::Boolean, false),
        ],
    ))
}

/// Version of the packets table layout, in the Parquet key-value metadata
/// [`PACKETS_VERSION_KEY`]. Readers refuse newer versions.
pub const PACKETS_SCHEMA_VERSION: u32 = 1;
pub const PACKETS_VERSION_KEY: &str = "xlap_packets_schema_version";
/// Parquet key-value metadata of a packets table: `{"<point column>": "tx"
/// | "rx", ...}`.
pub const PACKETS_SIDES_KEY: &str = "xlap_point_sides";

/// The packets table's columns before its point columns: the packet, its
/// flow and the processes at either end.
pub fn packets_head() -> Vec<Field> {
    vec![
        Field::new("run_id", DataType::Utf8, true),
        Field::new("flow", DataType::UInt64, true),
        Field::new("kind", DataType::UInt32, true),
        Field::new("seq", DataType::UInt64, true),
        Field::new("src_addr", DataType::Utf8, true),
        Field::new("dst_addr", DataType::Utf8, true),
        Field::new("src_port", DataType::UInt16, true),
        Field::new("dst_port", DataType::UInt16, true),
        Field::new("tx_socket_cookie", DataType::UInt64, true),
        Field::new("rx_socket_cookie", DataType::UInt64, true),
        Field::new("tx_host", DataType::Utf8, true),
        Field::new("rx_host", DataType::Utf8, true),
        Field::new("tx_pid", DataType::UInt32, true),
        Field::new("rx_pid", DataType::UInt32, true),
        Field::new("sent_ns", DataType::Int64, true),
        Field::new("priority", DataType::UInt32, true),
        // The cgroup v2 id of the sending process (at its send or marker
        // points) and of the receiving one; run.json `cgroups` names them.
        Field::new("tx_cgroup", DataType::UInt64, true),
        Field::new("rx_cgroup", DataType::UInt64, true),
    ]
}

/// X-LAP's durations, between the point columns and the stage columns.
pub fn packets_totals() -> Vec<Field> {
    [
        "sender_total_ns",
        "channel_ns",
        "receiver_total_ns",
        "e2e_ns",
        "xlap_e2e_ns",
    ]
    .into_iter()
    .map(|n| Field::new(n, DataType::Int64, true))
    .collect()
}

/// The flags, after the stage columns.
pub fn packets_flags() -> Vec<Field> {
    vec![
        Field::new("lost", DataType::Boolean, true),
        // Sent, and no datagram of its flow reached a traced socket: the
        // receiver was not recorded (the other end, an SO_REUSEPORT
        // sibling), so whether it arrived is unknown: never counted lost.
        Field::new("untraced", DataType::Boolean, true),
        // Received in part: the receiver stopped (its recording ended, or
        // it stopped reading) before the packet reached its kind's final
        // receiving point, so it has no end-to-end latency.
        Field::new("partial", DataType::Boolean, true),
        Field::new("recovered", DataType::Boolean, true),
        Field::new("duplicate", DataType::Boolean, true),
        Field::new("duplicate_skew_ns", DataType::Int64, true),
        Field::new("reordered", DataType::Boolean, true),
        Field::new("retransmitted", DataType::Boolean, true),
        Field::new("deadline_missed", DataType::Boolean, true),
        // The packets this row stands for: N in a run recorded with
        // `--sample 1/N` (for the kinds sampled), else 1. Counts scale by
        // it (`sum(sample_weight)`); quantiles need no weight.
        Field::new("sample_weight", DataType::UInt32, true),
    ]
}

/// `packets`: one row per packet (flow, kind, seq), as `xlap-trace
/// correlate` writes it (and `xlap-trace synth` imitates it). Which point
/// and stage columns it has depends on the runs: `points` (`<point>_ns`,
/// in path order, each one's side in [`PACKETS_SIDES_KEY`]) stand after
/// [`packets_head`], `stages` (`<a>__<b>_ns`, consecutive points of one
/// side) after [`packets_totals`]; all are ns on the reference clock.
/// Nullable throughout: the file is written by DuckDB, whose Parquet
/// columns are all optional.
pub fn packets(points: &[String], stages: &[String]) -> Arc<Schema> {
    let ns = |names: &[String]| -> Vec<Field> {
        names
            .iter()
            .map(|n| Field::new(n, DataType::Int64, true))
            .collect()
    };
    let fields: Vec<Field> = packets_head()
        .into_iter()
        .chain(ns(points))
        .chain(packets_totals())
        .chain(ns(stages))
        .chain(packets_flags())
        .collect();
    Arc::new(Schema::new_with_metadata(
        fields,
        HashMap::from([
            (META_TABLE.to_string(), "packets".to_string()),
            (
                PACKETS_VERSION_KEY.to_string(),
                PACKETS_SCHEMA_VERSION.to_string(),
            ),
            (
                "xlap.variable_columns".to_string(),
                "after priority: one <point>_ns column per point (Int64, path order); after xlap_e2e_ns: one <a>__<b>_ns column per stage (Int64)".to_string(),
            ),
        ]),
    ))
}

/// Every schema by table name, for `xlap-trace schema` and its check (the
/// packets table with its fixed columns only).
pub fn all() -> Vec<(&'static str, Arc<Schema>)> {
    vec![("stamps", stamps()), ("packets", packets(&[], &[]))]
}

/// The committed JSON form of a schema.
pub fn to_json(schema: &Schema) -> String {
    let mut s = serde_json::to_string_pretty(schema).expect("schemas serialise");
    s.push('\n');
    s
}

/// The columns every stamps file has had since the first release; the
/// others of [`stamps`] came later, and a run without them is read without.
const STAMPS_SINCE_FIRST: &[&str] = &[
    "run_id", "host", "point", "side", "ts_ns", "seq", "kind", "flow", "pid", "ifindex",
];

/// Refuses a stamps Parquet file whose columns are not those of
/// [`stamps`]: one of the first release's missing, or one of a type other
/// than declared (a run directory from elsewhere with `run_id` as a
/// number failed in the middle of a correlation, exit 1). Reads only the
/// footer.
pub fn check_stamps_parquet(path: &std::path::Path) -> Result<(), String> {
    let file = crate::run_file::open(path).map_err(|e| e.to_string())?;
    let builder = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("not a readable Parquet file ({e})"))?;
    let found = builder.schema();
    let expected = stamps();
    for name in STAMPS_SINCE_FIRST {
        if found.field_with_name(name).is_err() {
            return Err(format!(
                "it has no column {name:?}: not a stamps file of xlap-trace"
            ));
        }
    }
    for want in expected.fields() {
        if let Ok(have) = found.field_with_name(want.name()) {
            if have.data_type() != want.data_type() {
                return Err(format!(
                    "its column {:?} is {}, where stamps have {}: not a stamps file of xlap-trace, or edited",
                    want.name(),
                    have.data_type(),
                    want.data_type()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed files in `schemas/` match the code; regenerate with
    /// `cargo run -p xlap-trace -- schema --write schemas`.
    #[test]
    fn committed_schemas_match_the_code() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        for (name, schema) in all() {
            let path = dir.join(format!("{name}.schema.json"));
            let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| {
                panic!(
                    "{}: {e}; run `xlap-trace schema --write schemas`",
                    path.display()
                )
            });
            assert_eq!(
                committed,
                to_json(&schema),
                "{} is stale: run `xlap-trace schema --write schemas`",
                path.display()
            );
        }
    }
}

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
            Field::new("from_user", DataType::Boolean, false),
            Field::new("fragment", DataType::Boolean, false),
        ],
    ))
}

/// Every schema by table name, for `xlap-trace schema` and its check.
pub fn all() -> Vec<(&'static str, Arc<Schema>)> {
    vec![("stamps", stamps())]
}

/// The committed JSON form of a schema.
pub fn to_json(schema: &Schema) -> String {
    let mut s = serde_json::to_string_pretty(schema).expect("schemas serialise");
    s.push('\n');
    s
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

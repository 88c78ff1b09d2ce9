//! Checks of a packets Parquet file against the declared packets schema
//! (`xlap_records::schema::packets`), read with the Arrow Parquet reader
//! (not DuckDB, which wrote it).

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::path::Path;

/// The file's columns are the schema's, in its order and types: its point
/// columns those its sides metadata names, in the file's order, and its
/// stages every pair of consecutive points of one side (sender, then
/// receiver). Returns the point columns.
pub fn assert_follows_schema(path: &Path) -> Vec<String> {
    use xlap_records::schema;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).expect("a Parquet file");
    let kv = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default();
    let value = |key: &str| {
        kv.iter()
            .find(|k| k.key == key)
            .and_then(|k| k.value.clone())
            .unwrap_or_else(|| panic!("{}: no {key} metadata", path.display()))
    };
    assert_eq!(
        value(schema::PACKETS_VERSION_KEY),
        schema::PACKETS_SCHEMA_VERSION.to_string()
    );
    let sides: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&value(schema::PACKETS_SIDES_KEY)).expect("sides are JSON");
    let actual = builder.schema().clone();
    let points: Vec<String> = actual
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .filter(|n| sides.contains_key(n))
        .collect();
    assert_eq!(points.len(), sides.len(), "every side names a column");
    let stages: Vec<String> = ["tx", "rx"]
        .iter()
        .flat_map(|side| {
            let chain: Vec<&String> = points
                .iter()
                .filter(|p| sides[p.as_str()] == *side)
                .collect();
            chain
                .windows(2)
                .map(|w| format!("{}__{}", w[0].trim_end_matches("_ns"), w[1]))
                .collect::<Vec<_>>()
        })
        .collect();
    let expected = schema::packets(&points, &stages);
    let shape = |s: &arrow_schema::Schema| -> Vec<(String, arrow_schema::DataType)> {
        s.fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect()
    };
    assert_eq!(shape(&actual), shape(&expected), "{}", path.display());
    points
}

//! What a stamps Parquet file holds, counted as the recorder counts it:
//! stamps per point, packets, the last stamp's time. For `recover`, which
//! counts a run whose recorder died, without an SQL engine: the recorder
//! crate links none, and what it parses as root stays in Rust.

use arrow_array::cast::AsArray;
use arrow_array::types::ArrowPrimitiveType;
use arrow_array::types::{Int64Type, UInt32Type, UInt64Type};
use arrow_array::{Array, ArrayRef, PrimitiveArray, RecordBatch};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ProjectionMask;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct StampCounts {
    /// Stamps per point name, by name.
    pub per_point: BTreeMap<String, u64>,
    /// Distinct (flow, kind, seq) of the stamps that know their flow and
    /// seq (a missing kind counted as 0).
    pub packets: u64,
    pub last_ts_ns: Option<i64>,
}

/// Counts `path`, a stamps Parquet file; an error says what is wrong with
/// it (unreadable, or columns of other types than xlap-trace writes).
pub fn stamp_counts(path: &Path) -> Result<StampCounts, String> {
    let file = crate::run_file::open(path).map_err(|e| e.to_string())?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| format!("not a readable Parquet file ({e})"))?;
    const COLUMNS: [&str; 5] = ["point", "ts_ns", "seq", "kind", "flow"];
    let mask = ProjectionMask::columns(builder.parquet_schema(), COLUMNS);
    let reader = builder
        .with_projection(mask)
        .build()
        .map_err(|e| format!("cannot read it ({e})"))?;
    let mut counts = StampCounts::default();
    let mut packets: HashSet<(u64, u32, u64)> = HashSet::new();
    for batch in reader {
        let batch = batch.map_err(|e| format!("cannot read it ({e})"))?;
        let point = column(&batch, "point")?
            .as_string_opt::<i32>()
            .ok_or_else(|| wrong_type("point"))?;
        let ts = primitive::<Int64Type>(&batch, "ts_ns")?;
        let seq = primitive::<UInt64Type>(&batch, "seq")?;
        let kind = primitive::<UInt32Type>(&batch, "kind")?;
        let flow = primitive::<UInt64Type>(&batch, "flow")?;
        for i in 0..batch.num_rows() {
            if point.is_valid(i) {
                *counts
                    .per_point
                    .entry(point.value(i).to_string())
                    .or_default() += 1;
            }
            if ts.is_valid(i) {
                counts.last_ts_ns = counts.last_ts_ns.max(Some(ts.value(i)));
            }
            if seq.is_valid(i) && flow.is_valid(i) && flow.value(i) != 0 {
                let k = if kind.is_valid(i) { kind.value(i) } else { 0 };
                packets.insert((flow.value(i), k, seq.value(i)));
            }
        }
    }
    counts.packets = packets.len() as u64;
    Ok(counts)
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef, String> {
    batch
        .column_by_name(name)
        .ok_or_else(|| format!("it has no column {name:?}"))
}

fn wrong_type(name: &str) -> String {
    format!("its column {name:?} is not of the type xlap-trace writes")
}

/// Column `name` of `batch` as `T`, or what is wrong with it.
fn primitive<'a, T: ArrowPrimitiveType>(
    batch: &'a RecordBatch,
    name: &str,
) -> Result<&'a PrimitiveArray<T>, String> {
    column(batch, name)?
        .as_primitive_opt::<T>()
        .ok_or_else(|| wrong_type(name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int64Array, StringArray, UInt32Array, UInt64Array};
    use std::sync::Arc;

    fn write(path: &Path, columns: Vec<(&str, ArrayRef)>) {
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn counts_points_packets_and_the_last_stamp_and_names_a_column_of_another_type() {
        let dir = std::env::temp_dir().join(format!("xlap-stamp-counts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("stamps.parquet");
        let points = [
            "sock.send_enter",
            "dev.xmit",
            "dev.xmit",
            "sock.send_enter",
            "dev.xmit",
        ];
        write(
            &good,
            vec![
                (
                    "point",
                    Arc::new(StringArray::from(points.to_vec())) as ArrayRef,
                ),
                ("ts_ns", Arc::new(Int64Array::from(vec![5, 9, 7, 3, 8]))),
                // Packets: (1, 1, 10) twice, (1, 0, 11) with its kind
                // unknown, none without a flow or a seq.
                (
                    "seq",
                    Arc::new(UInt64Array::from(vec![
                        Some(10),
                        Some(10),
                        Some(11),
                        None,
                        Some(12),
                    ])),
                ),
                (
                    "kind",
                    Arc::new(UInt32Array::from(vec![
                        Some(1),
                        Some(1),
                        None,
                        Some(1),
                        Some(1),
                    ])),
                ),
                ("flow", Arc::new(UInt64Array::from(vec![1, 1, 1, 1, 0]))),
            ],
        );
        let c = stamp_counts(&good).unwrap();
        assert_eq!(
            c.per_point.into_iter().collect::<Vec<_>>(),
            vec![
                ("dev.xmit".to_string(), 3),
                ("sock.send_enter".to_string(), 2)
            ]
        );
        assert_eq!((c.packets, c.last_ts_ns), (2, Some(9)));

        let bad = dir.join("other.parquet");
        write(
            &bad,
            vec![
                ("point", Arc::new(StringArray::from(vec!["x"])) as ArrayRef),
                ("ts_ns", Arc::new(StringArray::from(vec!["late"]))),
                ("seq", Arc::new(UInt64Array::from(vec![1]))),
                ("kind", Arc::new(UInt32Array::from(vec![1]))),
                ("flow", Arc::new(UInt64Array::from(vec![1]))),
            ],
        );
        let e = stamp_counts(&bad).unwrap_err();
        assert!(e.contains("\"ts_ns\""), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

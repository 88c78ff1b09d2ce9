//! Whether a Parquet file decodes: every column of every row group read
//! and decompressed, in Rust (no SQL engine), to tell a damaged file from
//! an engine that failed on it for another reason.

use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::path::Path;

/// Reads all of `path`; an error says what is wrong with it.
pub fn decodes(path: &Path) -> Result<(), String> {
    let file = crate::run_file::open(path).map_err(|e| e.to_string())?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .and_then(|b| b.build())
        .map_err(|e| format!("not a readable Parquet file ({e})"))?;
    for batch in reader {
        batch.map_err(|e| format!("cannot decode it ({e})"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, Int64Array, RecordBatch};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression, ZstdLevel};
    use parquet::file::properties::WriterProperties;
    use std::sync::Arc;

    #[test]
    fn a_whole_file_decodes_and_one_with_a_damaged_page_does_not() {
        let dir = std::env::temp_dir().join(format!("xlap-pq-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("packets.parquet");
        // Compressible values in plain pages: the page is zstd's, not raw.
        let values: ArrayRef =
            Arc::new(Int64Array::from_iter_values((0..100_000i64).map(|i| i % 7)));
        let batch = RecordBatch::try_from_iter([("v", values)]).unwrap();
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_dictionary_enabled(false)
            .build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            Some(props),
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        assert_eq!(decodes(&path), Ok(()));
        // The footer kept, the page's zstd frame made unreadable (its
        // magic number; flipped bytes inside a frame may decode to other
        // values).
        let mut bytes = std::fs::read(&path).unwrap();
        let frame = bytes
            .windows(4)
            .position(|w| w == [0x28, 0xb5, 0x2f, 0xfd])
            .expect("a zstd frame");
        bytes[frame] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let err = decodes(&path).unwrap_err();
        assert!(err.contains("cannot decode"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

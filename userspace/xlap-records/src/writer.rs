//! Writing stamps: Arrow record batches, streamed to an IPC stream file while
//! a run goes on (a crash keeps every complete batch), and converted to
//! Parquet (zstd) when it ends, through a temporary file renamed when whole.

use crate::points::point_info;
use crate::schema;
use crate::stamp::Stamp;
use arrow_array::builder::{
    BooleanBuilder, Int64Builder, StringBuilder, UInt16Builder, UInt32Builder, UInt64Builder,
    UInt8Builder,
};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot write {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("Arrow error on {path}: {source}")]
    Arrow {
        path: PathBuf,
        source: arrow_schema::ArrowError,
    },
    #[error("Parquet error on {path}: {source}")]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
}

type PointName = (String, &'static str, Option<&'static str>);

/// Collects stamps into record batches of the `stamps` schema.
pub struct StampBatcher {
    run_id: String,
    host: String,
    app_names: Vec<String>,
    /// Indexed by point id: (name, layer, side), filled on first use (a
    /// vector, not a hash map: this runs for every stamp).
    names: Vec<Option<PointName>>,
    run_ids: StringBuilder,
    hosts: StringBuilder,
    points: StringBuilder,
    layers: StringBuilder,
    sides: StringBuilder,
    ts: Int64Builder,
    seqs: UInt64Builder,
    kinds: UInt8Builder,
    flows: UInt64Builder,
    pids: UInt32Builder,
    tids: UInt32Builder,
    cpus: UInt16Builder,
    lens: UInt32Builder,
    ifindexes: UInt32Builder,
    queues: UInt16Builder,
    hw_ts: Int64Builder,
    from_user: BooleanBuilder,
    fragment: BooleanBuilder,
    rows: usize,
}

impl StampBatcher {
    /// `app_names[i]` names the app point `XLAP_POINT_APP_BASE + i`.
    pub fn new(run_id: &str, host: &str, app_names: Vec<String>) -> Self {
        StampBatcher {
            run_id: run_id.to_string(),
            host: host.to_string(),
            app_names,
            names: Vec::new(),
            run_ids: StringBuilder::new(),
            hosts: StringBuilder::new(),
            points: StringBuilder::new(),
            layers: StringBuilder::new(),
            sides: StringBuilder::new(),
            ts: Int64Builder::new(),
            seqs: UInt64Builder::new(),
            kinds: UInt8Builder::new(),
            flows: UInt64Builder::new(),
            pids: UInt32Builder::new(),
            tids: UInt32Builder::new(),
            cpus: UInt16Builder::new(),
            lens: UInt32Builder::new(),
            ifindexes: UInt32Builder::new(),
            queues: UInt16Builder::new(),
            hw_ts: Int64Builder::new(),
            from_user: BooleanBuilder::new(),
            fragment: BooleanBuilder::new(),
            rows: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Adds a stamp; a point id nobody defined is kept as `unknown.<id>`
    /// rather than dropped.
    pub fn push(&mut self, s: &Stamp) {
        // Names are resolved once per point id, not once per stamp.
        let idx = s.point as usize;
        if idx >= self.names.len() {
            self.names.resize(idx + 1, None);
        }
        let app_names = &self.app_names;
        let (name, layer, side) =
            self.names[idx].get_or_insert_with(|| match point_info(s.point, app_names) {
                Some((name, layer, side)) => (name, layer.as_str(), side.map(|s| s.as_str())),
                None => (format!("unknown.{}", s.point), "unknown", None),
            });
        self.run_ids.append_value(&self.run_id);
        self.hosts.append_value(&self.host);
        self.points.append_value(name.as_str());
        self.layers.append_value(*layer);
        self.sides.append_option(*side);
        self.ts.append_value(s.ts_ns as i64);
        self.seqs.append_option(s.seq);
        self.kinds.append_option(s.kind);
        self.flows.append_value(s.flow);
        self.pids.append_value(s.pid);
        self.tids.append_value(s.tid);
        self.cpus.append_value(s.cpu);
        self.lens.append_value(s.len);
        self.ifindexes.append_option(s.ifindex);
        self.queues.append_option(s.queue);
        self.hw_ts.append_option(s.hw_ts_ns.map(|v| v as i64));
        self.from_user.append_value(s.from_user);
        self.fragment.append_value(s.fragment);
        self.rows += 1;
    }

    /// Takes the collected rows as one batch and starts afresh.
    pub fn finish(&mut self) -> RecordBatch {
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.run_ids.finish()),
            Arc::new(self.hosts.finish()),
            Arc::new(self.points.finish()),
            Arc::new(self.layers.finish()),
            Arc::new(self.sides.finish()),
            Arc::new(self.ts.finish()),
            Arc::new(self.seqs.finish()),
            Arc::new(self.kinds.finish()),
            Arc::new(self.flows.finish()),
            Arc::new(self.pids.finish()),
            Arc::new(self.tids.finish()),
            Arc::new(self.cpus.finish()),
            Arc::new(self.lens.finish()),
            Arc::new(self.ifindexes.finish()),
            Arc::new(self.queues.finish()),
            Arc::new(self.hw_ts.finish()),
            Arc::new(self.from_user.finish()),
            Arc::new(self.fragment.finish()),
        ];
        self.rows = 0;
        RecordBatch::try_new(schema::stamps(), columns).expect("builders match the stamps schema")
    }
}

/// An Arrow IPC stream of stamps, flushed after every batch.
pub struct StampStream {
    path: PathBuf,
    writer: StreamWriter<File>,
}

impl StampStream {
    pub fn create(path: &Path) -> Result<Self, WriteError> {
        let file = File::create(path).map_err(|source| WriteError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let writer =
            StreamWriter::try_new(file, &schema::stamps()).map_err(|source| WriteError::Arrow {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(StampStream {
            path: path.to_path_buf(),
            writer,
        })
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<(), WriteError> {
        let arrow = |source| WriteError::Arrow {
            path: self.path.clone(),
            source,
        };
        self.writer.write(batch).map_err(arrow)?;
        self.writer.flush().map_err(|source| WriteError::Arrow {
            path: self.path.clone(),
            source,
        })
    }

    pub fn finish(mut self) -> Result<(), WriteError> {
        self.writer.finish().map_err(|source| WriteError::Arrow {
            path: self.path.clone(),
            source,
        })
    }
}

/// Stamps to leave out of the Parquet file: those of `flows` at `points`
/// (the receive-device stamps of datagrams that turned out to be another
/// socket's).
#[derive(Default)]
pub struct DropFlows<'a> {
    pub flows: HashSet<u64>,
    pub points: &'a [&'a str],
}

impl DropFlows<'_> {
    /// The batch without the dropped rows, and how many went per point.
    fn apply(&self, batch: RecordBatch, removed: &mut BTreeMap<String, u64>) -> RecordBatch {
        if self.flows.is_empty() {
            return batch;
        }
        let (Some(flow), Some(point)) = (
            batch
                .column_by_name("flow")
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>()),
            batch
                .column_by_name("point")
                .and_then(|c| c.as_any().downcast_ref::<StringArray>()),
        ) else {
            return batch;
        };
        let keep: BooleanArray = (0..batch.num_rows())
            .map(|i| {
                let drop =
                    self.flows.contains(&flow.value(i)) && self.points.contains(&point.value(i));
                if drop {
                    *removed.entry(point.value(i).to_string()).or_default() += 1;
                }
                Some(!drop)
            })
            .collect();
        arrow_select::filter::filter_record_batch(&batch, &keep).unwrap_or(batch)
    }
}

/// Converts an IPC stream (complete or cut short by a crash) into Parquet at
/// `parquet`, written to `<parquet>.tmp` and renamed when complete. Returns
/// the number of rows.
pub fn stream_to_parquet(stream: &Path, parquet: &Path) -> Result<u64, WriteError> {
    stream_to_parquet_dropping(stream, parquet, &DropFlows::default()).map(|(rows, _)| rows)
}

/// [`stream_to_parquet`] without the stamps `drop` names. Returns the rows
/// written and the stamps left out per point.
pub fn stream_to_parquet_dropping(
    stream: &Path,
    parquet: &Path,
    drop: &DropFlows,
) -> Result<(u64, BTreeMap<String, u64>), WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    let reader = StreamReader::try_new(
        BufReader::new(File::open(stream).map_err(io(stream))?),
        None,
    )
    .map_err(|source| WriteError::Arrow {
        path: stream.to_path_buf(),
        source,
    })?;
    let tmp = parquet.with_extension("parquet.tmp");
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid level"),
        ))
        .build();
    let file = File::create(&tmp).map_err(io(&tmp))?;
    let pq = |source| WriteError::Parquet {
        path: tmp.clone(),
        source,
    };
    let mut writer = ArrowWriter::try_new(file, reader.schema(), Some(props)).map_err(pq)?;
    let mut rows = 0u64;
    let mut removed = BTreeMap::new();
    for batch in reader {
        // A stream cut short by a crash ends in a partial message: keep every
        // complete batch before it.
        let Ok(batch) = batch else { break };
        let batch = drop.apply(batch, &mut removed);
        rows += batch.num_rows() as u64;
        writer.write(&batch).map_err(pq)?;
    }
    writer.close().map_err(pq)?;
    std::fs::rename(&tmp, parquet).map_err(io(parquet))?;
    Ok((rows, removed))
}

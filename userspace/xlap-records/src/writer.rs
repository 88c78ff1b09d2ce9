//! Writing stamps: Arrow record batches, streamed to an IPC stream file while
//! a run goes on (a crash keeps every complete batch), and converted to
//! Parquet (zstd) when it ends, through a temporary file renamed when whole.

use crate::points::point_info;
use crate::schema;
use crate::stamp::Stamp;
use arrow_array::builder::{
    BooleanBuilder, Int64Builder, StringBuilder, UInt16Builder, UInt32Builder, UInt64Builder,
};
use arrow_array::{Array, ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use std::collections::{BTreeMap, HashMap, HashSet};
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
    kinds: UInt32Builder,
    flows: UInt64Builder,
    src_addrs: StringBuilder,
    dst_addrs: StringBuilder,
    src_ports: UInt16Builder,
    dst_ports: UInt16Builder,
    cookies: UInt64Builder,
    pids: UInt32Builder,
    tids: UInt32Builder,
    cpus: UInt16Builder,
    lens: UInt32Builder,
    ifindexes: UInt32Builder,
    queues: UInt16Builder,
    hw_ts: Int64Builder,
    priorities: UInt32Builder,
    cgroups: UInt64Builder,
    netns: UInt32Builder,
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
            kinds: UInt32Builder::new(),
            flows: UInt64Builder::new(),
            src_addrs: StringBuilder::new(),
            dst_addrs: StringBuilder::new(),
            src_ports: UInt16Builder::new(),
            dst_ports: UInt16Builder::new(),
            cookies: UInt64Builder::new(),
            pids: UInt32Builder::new(),
            tids: UInt32Builder::new(),
            cpus: UInt16Builder::new(),
            lens: UInt32Builder::new(),
            ifindexes: UInt32Builder::new(),
            queues: UInt16Builder::new(),
            hw_ts: Int64Builder::new(),
            priorities: UInt32Builder::new(),
            cgroups: UInt64Builder::new(),
            netns: UInt32Builder::new(),
            from_user: BooleanBuilder::new(),
            fragment: BooleanBuilder::new(),
            rows: 0,
        }
    }

    /// The app point names when points were added during the run (a
    /// process exec'd a program with markers): the old ids keep their names.
    pub fn set_app_names(&mut self, app_names: Vec<String>) {
        self.app_names = app_names;
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
        // Addresses and sockets are known when the run ends (FlowTable).
        self.src_addrs.append_null();
        self.dst_addrs.append_null();
        let (sport, dport) = flow_ports(s.flow);
        self.src_ports.append_option(sport);
        self.dst_ports.append_option(dport);
        self.cookies.append_null();
        self.pids.append_value(s.pid);
        self.tids.append_value(s.tid);
        self.cpus.append_value(s.cpu);
        self.lens.append_value(s.len);
        self.ifindexes.append_option(s.ifindex);
        self.queues.append_option(s.queue);
        self.hw_ts.append_option(s.hw_ts_ns.map(|v| v as i64));
        self.priorities.append_option(s.priority);
        self.cgroups.append_option(s.cgroup_id);
        self.netns.append_option(s.netns);
        self.from_user.append_value(s.from_user);
        self.fragment.append_value(s.fragment);
        self.rows += 1;
    }

    /// Takes the collected rows as one batch and starts afresh. The
    /// columns come in the schema's order, each taken by its name: the
    /// schema is the one declaration of that order.
    pub fn finish(&mut self) -> RecordBatch {
        let schema = schema::stamps();
        let columns: Vec<ArrayRef> = schema
            .fields()
            .iter()
            .map(|field| self.finish_column(field.name()))
            .collect();
        self.rows = 0;
        RecordBatch::try_new(schema, columns).expect("a builder of its type for each stamps column")
    }

    /// The values collected for the stamps column `name`.
    fn finish_column(&mut self, name: &str) -> ArrayRef {
        match name {
            "run_id" => Arc::new(self.run_ids.finish()),
            "host" => Arc::new(self.hosts.finish()),
            "point" => Arc::new(self.points.finish()),
            "layer" => Arc::new(self.layers.finish()),
            "side" => Arc::new(self.sides.finish()),
            "ts_ns" => Arc::new(self.ts.finish()),
            "seq" => Arc::new(self.seqs.finish()),
            "kind" => Arc::new(self.kinds.finish()),
            "flow" => Arc::new(self.flows.finish()),
            "src_addr" => Arc::new(self.src_addrs.finish()),
            "dst_addr" => Arc::new(self.dst_addrs.finish()),
            "src_port" => Arc::new(self.src_ports.finish()),
            "dst_port" => Arc::new(self.dst_ports.finish()),
            "socket_cookie" => Arc::new(self.cookies.finish()),
            "pid" => Arc::new(self.pids.finish()),
            "tid" => Arc::new(self.tids.finish()),
            "cpu" => Arc::new(self.cpus.finish()),
            "len" => Arc::new(self.lens.finish()),
            "ifindex" => Arc::new(self.ifindexes.finish()),
            "queue" => Arc::new(self.queues.finish()),
            "hw_ts_ns" => Arc::new(self.hw_ts.finish()),
            "priority" => Arc::new(self.priorities.finish()),
            "cgroup_id" => Arc::new(self.cgroups.finish()),
            "netns" => Arc::new(self.netns.finish()),
            "from_user" => Arc::new(self.from_user.finish()),
            "fragment" => Arc::new(self.fragment.finish()),
            other => panic!("the stamps schema's column {other} has no builder in StampBatcher"),
        }
    }
}

/// The ports a flow key holds (XLAP_FLOW_*: source port in bits 31..16,
/// destination port in 15..0); a zero port is one the stamp did not know.
pub fn flow_ports(flow: u64) -> (Option<u16>, Option<u16>) {
    let sport = (flow >> 16) as u16;
    let dport = flow as u16;
    ((sport != 0).then_some(sport), (dport != 0).then_some(dport))
}

/// An Arrow IPC stream of stamps (buffers zstd-compressed), flushed after
/// every batch.
pub struct StampStream {
    path: PathBuf,
    writer: StreamWriter<Counted>,
}

/// The stream's file, counting the bytes written to it.
struct Counted {
    file: File,
    bytes: u64,
}

impl std::io::Write for Counted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl StampStream {
    pub fn create(path: &Path) -> Result<Self, WriteError> {
        let file = File::create(path).map_err(|source| WriteError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let arrow = |source| WriteError::Arrow {
            path: path.to_path_buf(),
            source,
        };
        // Each batch's buffers zstd-compressed (level 1: the reader keeps up
        // at millions of stamps per second): the live stream of a long run
        // costs a fraction of the disk of an uncompressed one, and a batch
        // is still whole or absent after a crash.
        let options = arrow_ipc::writer::IpcWriteOptions::default()
            .try_with_compression(Some(arrow_ipc::CompressionType::ZSTD))
            .and_then(|o| o.try_with_compression_level(Some(1)))
            .map_err(arrow)?;
        let file = Counted { file, bytes: 0 };
        let writer =
            StreamWriter::try_new_with_options(file, &schema::stamps(), options).map_err(arrow)?;
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

    /// Bytes written to the file so far.
    pub fn bytes(&self) -> u64 {
        self.writer.get_ref().bytes
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

/// The addresses and traced sockets behind a flow, as the capture noted
/// them; the addresses in their text form (formatted once per flow, not
/// once per stamp).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlowInfo {
    pub src_addr: String,
    pub dst_addr: String,
    /// Cookie of the traced socket that sent the flow's datagrams.
    pub tx_cookie: Option<u64>,
    /// Cookie of the traced socket that received them.
    pub rx_cookie: Option<u64>,
}

/// Flow key → what is behind it (flows two address pairs shared are left
/// out: their stamps get no addresses rather than wrong ones).
pub type FlowTable = HashMap<u64, FlowInfo>;

/// Fills `src_addr`, `dst_addr` and `socket_cookie` (the socket on the
/// stamp's side) from the flow table.
fn fill_flows(batch: RecordBatch, table: &FlowTable) -> RecordBatch {
    if table.is_empty() {
        return batch;
    }
    let schema = batch.schema();
    let (Some(flow), Some(side), Ok(src_i), Ok(dst_i), Ok(cookie_i)) = (
        batch
            .column_by_name("flow")
            .and_then(|c| c.as_any().downcast_ref::<UInt64Array>()),
        batch
            .column_by_name("side")
            .and_then(|c| c.as_any().downcast_ref::<StringArray>()),
        schema.index_of("src_addr"),
        schema.index_of("dst_addr"),
        schema.index_of("socket_cookie"),
    ) else {
        return batch;
    };
    let mut src = StringBuilder::new();
    let mut dst = StringBuilder::new();
    let mut cookie = UInt64Builder::new();
    for i in 0..batch.num_rows() {
        match table.get(&flow.value(i)) {
            Some(f) => {
                src.append_value(&f.src_addr);
                dst.append_value(&f.dst_addr);
                let c = match (side.is_valid(i).then(|| side.value(i)), f) {
                    (Some("tx"), f) => f.tx_cookie,
                    (Some("rx"), f) => f.rx_cookie,
                    _ => None,
                };
                cookie.append_option(c);
            }
            None => {
                src.append_null();
                dst.append_null();
                cookie.append_null();
            }
        }
    }
    let mut columns = batch.columns().to_vec();
    columns[src_i] = Arc::new(src.finish());
    columns[dst_i] = Arc::new(dst.finish());
    columns[cookie_i] = Arc::new(cookie.finish());
    RecordBatch::try_new(schema, columns).unwrap_or(batch)
}

/// Converts an IPC stream (complete or cut short by a crash) into Parquet at
/// `parquet`, written to `<parquet>.tmp` and renamed when complete. Returns
/// the number of rows.
pub fn stream_to_parquet(stream: &Path, parquet: &Path) -> Result<StreamCopy, WriteError> {
    stream_to_parquet_with(stream, parquet, &DropFlows::default(), &FlowTable::new())
}

/// What a conversion of the live stream to Parquet found.
#[derive(Clone, Debug, Default)]
pub struct StreamCopy {
    /// Rows written to Parquet.
    pub rows: u64,
    /// Stamps left out per point (`DropFlows`).
    pub removed: BTreeMap<String, u64>,
    /// Bytes of the stream up to the end of its last complete batch, and
    /// in all: a stream cut short by a crash has a partial message after.
    pub bytes_used: u64,
    pub bytes_total: u64,
    /// The stream ended with its end-of-stream marker (the recorder
    /// finished it), rather than at a crash.
    pub finished: bool,
}

/// Counts the bytes a reader hands out (the stream reader reads whole
/// messages: at the end of a batch, the count is its end offset).
struct Counting<R> {
    inner: R,
    bytes: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: std::io::Read> std::io::Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes.set(self.bytes.get() + n as u64);
        Ok(n)
    }
}

/// Whether an IPC stream file ends with the end-of-stream marker
/// (continuation, then a zero length).
fn ends_with_eos(path: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    let mut tail = [0u8; 8];
    crate::run_file::open(path)
        .map_err(std::io::Error::from)
        .and_then(|mut f| {
            f.seek(SeekFrom::End(-8))?;
            f.read_exact(&mut tail)
        })
        .is_ok()
        && tail == [0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]
}

/// [`stream_to_parquet`] without the stamps `drop` names, with the
/// addresses and sockets of `flows` filled in.
pub fn stream_to_parquet_with(
    stream: &Path,
    parquet: &Path,
    drop: &DropFlows,
    flows: &FlowTable,
) -> Result<StreamCopy, WriteError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| WriteError::Io { path, source }
    };
    let file = crate::run_file::open(stream)
        .map_err(std::io::Error::from)
        .map_err(io(stream))?;
    let bytes_total = file.metadata().map_err(io(stream))?.len();
    let bytes = std::rc::Rc::new(std::cell::Cell::new(0u64));
    let reader = StreamReader::try_new(
        Counting {
            inner: BufReader::new(file),
            bytes: bytes.clone(),
        },
        None,
    )
    .map_err(|source| WriteError::Arrow {
        path: stream.to_path_buf(),
        source,
    })?;
    let tmp = crate::run_file::engine_target(parquet).map_err(io(parquet))?;
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(3).expect("valid level"),
        ))
        .build();
    let file = crate::run_file::create(&tmp)
        .map_err(std::io::Error::from)
        .map_err(io(&tmp))?;
    let pq = |source| WriteError::Parquet {
        path: tmp.clone(),
        source,
    };
    let mut writer = ArrowWriter::try_new(file, reader.schema(), Some(props)).map_err(pq)?;
    let mut copy = StreamCopy {
        bytes_used: bytes.get(),
        bytes_total,
        finished: true,
        ..Default::default()
    };
    for batch in reader {
        // A stream cut short by a crash ends in a partial message: keep every
        // complete batch before it.
        let Ok(batch) = batch else {
            copy.finished = false;
            break;
        };
        copy.bytes_used = bytes.get();
        let batch = fill_flows(drop.apply(batch, &mut copy.removed), flows);
        copy.rows += batch.num_rows() as u64;
        writer.write(&batch).map_err(pq)?;
    }
    // A stream that stops at a batch's end (or a few bytes after it)
    // without the end-of-stream marker also ends the loop without an
    // error: only the marker says the recorder finished it.
    if copy.finished {
        copy.finished = bytes.get() == bytes_total && ends_with_eos(stream);
        if copy.finished {
            copy.bytes_used = bytes_total;
        }
    }
    writer.close().map_err(pq)?;
    std::fs::rename(&tmp, parquet).map_err(io(parquet))?;
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stamp::Stamp;

    fn stamp(point: u16, flow: u64) -> Stamp {
        Stamp {
            ts_ns: 1,
            point,
            seq: Some(7),
            kind: None,
            flow,
            pid: 1,
            tid: 1,
            cpu: 0,
            len: 64,
            ifindex: None,
            queue: None,
            hw_ts_ns: None,
            priority: None,
            cgroup_id: None,
            netns: None,
            from_user: false,
            fragment: false,
        }
    }

    /// Each field of a stamp lands in the column named for it (every value
    /// distinct, so two swapped columns of one type cannot pass), in the
    /// schema's order.
    #[test]
    fn each_stamp_field_lands_in_its_named_column() {
        use arrow_array::cast::AsArray;
        use arrow_array::types::{Int64Type, UInt16Type, UInt32Type, UInt64Type};
        use arrow_schema::DataType;
        let flow: u64 = (1001 << 16) | 1002;
        let mut batcher = StampBatcher::new("run-r", "host-h", vec![]);
        batcher.push(&Stamp {
            ts_ns: 11,
            point: xlap_abi::xlap_point::XLAP_POINT_DEV_QUEUE as u16,
            seq: Some(12),
            kind: Some(13),
            flow,
            pid: 14,
            tid: 15,
            cpu: 16,
            len: 17,
            ifindex: Some(18),
            queue: Some(19),
            hw_ts_ns: Some(20),
            priority: Some(21),
            cgroup_id: None,
            netns: Some(22),
            from_user: true,
            fragment: false,
        });
        let batch = batcher.finish();
        assert_eq!(batch.schema(), schema::stamps());
        let cell = |name: &str| -> String {
            let c = batch.column_by_name(name).unwrap();
            if c.is_null(0) {
                return "null".into();
            }
            match c.data_type() {
                DataType::Utf8 => c.as_string::<i32>().value(0).to_string(),
                DataType::Int64 => c.as_primitive::<Int64Type>().value(0).to_string(),
                DataType::UInt64 => c.as_primitive::<UInt64Type>().value(0).to_string(),
                DataType::UInt32 => c.as_primitive::<UInt32Type>().value(0).to_string(),
                DataType::UInt16 => c.as_primitive::<UInt16Type>().value(0).to_string(),
                DataType::Boolean => c.as_boolean().value(0).to_string(),
                other => panic!("{name}: {other}"),
            }
        };
        let expected = [
            ("run_id", "run-r".to_string()),
            ("host", "host-h".to_string()),
            ("point", "dev.queue".to_string()),
            ("layer", "dev".to_string()),
            ("side", "tx".to_string()),
            ("ts_ns", "11".to_string()),
            ("seq", "12".to_string()),
            ("kind", "13".to_string()),
            ("flow", flow.to_string()),
            ("src_addr", "null".to_string()),
            ("dst_addr", "null".to_string()),
            ("src_port", "1001".to_string()),
            ("dst_port", "1002".to_string()),
            ("socket_cookie", "null".to_string()),
            ("pid", "14".to_string()),
            ("tid", "15".to_string()),
            ("cpu", "16".to_string()),
            ("len", "17".to_string()),
            ("ifindex", "18".to_string()),
            ("queue", "19".to_string()),
            ("hw_ts_ns", "20".to_string()),
            ("priority", "21".to_string()),
            ("cgroup_id", "null".to_string()),
            ("netns", "22".to_string()),
            ("from_user", "true".to_string()),
            ("fragment", "false".to_string()),
        ];
        let stamps_schema = schema::stamps();
        let columns: Vec<&str> = stamps_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let mut named: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
        named.sort_unstable();
        let mut sorted = columns.clone();
        sorted.sort_unstable();
        assert_eq!(named, sorted, "every column checked");
        for (name, value) in expected {
            assert_eq!(cell(name), value, "{name}");
        }
    }

    /// A stream cut at any byte keeps exactly the batches that were
    /// complete there (their ends taken from the file's size after each
    /// flushed write), says it was not finished and where the last
    /// complete batch ended; only the finished stream says finished.
    #[test]
    fn a_cut_stream_keeps_its_complete_batches_and_says_where_it_ends() {
        let dir = std::env::temp_dir().join(format!("xlap-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (stream, parquet) = (dir.join("s.arrows"), dir.join("s.parquet"));
        let point = xlap_abi::xlap_point::XLAP_POINT_DEV_QUEUE as u16;
        let mut writer = StampStream::create(&stream).unwrap();
        let mut ends = vec![std::fs::metadata(&stream).unwrap().len()]; // the schema
        for rows in [3, 5, 2] {
            let mut batcher = StampBatcher::new("r", "h", vec![]);
            for _ in 0..rows {
                batcher.push(&stamp(point, 9));
            }
            writer.write(&batcher.finish()).unwrap();
            ends.push(std::fs::metadata(&stream).unwrap().len());
        }
        writer.finish().unwrap();
        let whole = std::fs::read(&stream).unwrap();
        let copy = stream_to_parquet(&stream, &parquet).unwrap();
        assert_eq!((copy.rows, copy.finished), (10, true));
        assert_eq!(copy.bytes_used, whole.len() as u64);
        let rows_before = [0u64, 3, 8, 10];
        // Every byte near a batch's end, every 7th elsewhere.
        let near = |c: usize| ends.iter().any(|&e| (c as i64 - e as i64).abs() <= 16);
        for cut in (ends[0] as usize..whole.len()).filter(|&c| near(c) || c % 7 == 0) {
            std::fs::write(&stream, &whole[..cut]).unwrap();
            let copy = stream_to_parquet(&stream, &parquet).unwrap();
            let complete = ends.iter().rposition(|&e| e as usize <= cut).unwrap();
            assert_eq!(copy.rows, rows_before[complete], "cut at byte {cut}");
            assert!(!copy.finished, "cut at byte {cut}");
            assert_eq!(copy.bytes_used, ends[complete], "cut at byte {cut}");
            assert_eq!(copy.bytes_total, cut as u64);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A stream converted with a flow table: addresses on the flow's
    /// stamps, the socket of each stamp's side, ports from the key even
    /// without a table entry, nothing invented for an unknown flow.
    #[test]
    fn flow_table_fills_addresses_and_the_sides_socket() {
        let dir = std::env::temp_dir().join(format!("xlap-fill-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (stream, parquet) = (dir.join("s.arrows"), dir.join("s.parquet"));
        let known: u64 = 0x1111_2222_2329_2328; // ports 9001 -> 9000
        let unknown: u64 = 0x3333_4444_0050_0035; // ports 80 -> 53
        let mut batcher = StampBatcher::new("r", "h", vec![]);
        let (tx, rx) = (
            xlap_abi::xlap_point::XLAP_POINT_DEV_QUEUE as u16,
            xlap_abi::xlap_point::XLAP_POINT_SOCK_QUEUE as u16,
        );
        batcher.push(&stamp(tx, known));
        batcher.push(&stamp(rx, known));
        batcher.push(&stamp(rx, unknown));
        let mut s = StampStream::create(&stream).unwrap();
        s.write(&batcher.finish()).unwrap();
        s.finish().unwrap();
        let table = FlowTable::from([(
            known,
            FlowInfo {
                src_addr: "10.0.0.1".into(),
                dst_addr: "fd00::2".into(),
                tx_cookie: Some(41),
                rx_cookie: Some(42),
            },
        )]);
        stream_to_parquet_with(&stream, &parquet, &DropFlows::default(), &table).unwrap();
        let batch = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
            File::open(&parquet).unwrap(),
        )
        .unwrap()
        .build()
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
        let text = |name: &str| {
            let c = batch.column_by_name(name).unwrap();
            let a = c.as_any().downcast_ref::<StringArray>().unwrap();
            (0..3)
                .map(|i| a.is_valid(i).then(|| a.value(i).to_string()))
                .collect::<Vec<_>>()
        };
        let num = |name: &str| {
            let c = batch.column_by_name(name).unwrap();
            (0..3)
                .map(|i| {
                    c.is_valid(i).then(|| {
                        if let Some(a) = c.as_any().downcast_ref::<UInt64Array>() {
                            a.value(i)
                        } else {
                            let a = c
                                .as_any()
                                .downcast_ref::<arrow_array::UInt16Array>()
                                .unwrap();
                            a.value(i) as u64
                        }
                    })
                })
                .collect::<Vec<_>>()
        };
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            text("src_addr"),
            vec![some("10.0.0.1"), some("10.0.0.1"), None]
        );
        assert_eq!(
            text("dst_addr"),
            vec![some("fd00::2"), some("fd00::2"), None]
        );
        assert_eq!(num("socket_cookie"), vec![Some(41), Some(42), None]);
        assert_eq!(num("src_port"), vec![Some(9001), Some(9001), Some(80)]);
        assert_eq!(num("dst_port"), vec![Some(9000), Some(9000), Some(53)]);
        std::fs::remove_dir_all(&dir).ok();
    }
}

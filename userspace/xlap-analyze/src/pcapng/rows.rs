//! The frames of an export as rows: each packet once per side it was
//! stamped on, at that side's wire point, with what its comment shows.

use crate::correlate::{RX_WIRE, TX_WIRE};
use crate::sql;
use crate::Result;
use duckdb::Connection;

/// Where the sender's frame is timed when it has no device point: the
/// send call's return (the datagram has left the socket by then), else
/// its entry.
const TX_SOCKET: &[&str] = &["sock_send_exit", "sock_send_enter"];
/// The receiver's: the datagram reaching the socket queue, else the read.
const RX_SOCKET: &[&str] = &["sock_queue", "sock_recv_exit"];

/// The temporary table of the frames (dropped with the connection).
pub const TABLE: &str = "pcapng_frames";

/// One frame: a packet seen on one side.
pub struct Row {
    /// 0 sender, 1 receiver.
    pub side: u8,
    pub host: String,
    /// On the run's (mapped) clock.
    pub t_ns: i64,
    /// The point column stem the frame is timed at.
    pub at: String,
    /// The device its stamp there names (None at a socket point, or
    /// without the run's stamps).
    pub ifindex: Option<u32>,
    /// The datagram's UDP payload bytes, as that stamp says (None when
    /// it is not known: a frame of headers alone then).
    pub payload: Option<u32>,
    pub src_addr: Option<String>,
    pub dst_addr: Option<String>,
    pub src_port: u16,
    pub dst_port: u16,
    pub seq: u64,
    pub kind: String,
    pub e2e_ns: Option<i64>,
    pub sender_total_ns: Option<i64>,
    pub channel_ns: Option<i64>,
    pub receiver_total_ns: Option<i64>,
    pub lost: bool,
}

/// The first of `stems` that is a column, as SQL: its value and its name
/// (`coalesce` over them; NULL when none is a column).
fn first_stamped(columns: &[String], stems: &[&str]) -> (String, String) {
    let present: Vec<&str> = stems
        .iter()
        .copied()
        .filter(|s| columns.iter().any(|c| *c == format!("{s}_ns")))
        .collect();
    if present.is_empty() {
        return ("NULL::BIGINT".into(), "NULL::VARCHAR".into());
    }
    let col = |s: &str| sql::ident(&format!("{s}_ns"));
    let value = format!(
        "coalesce({}, NULL::BIGINT)",
        present
            .iter()
            .map(|s| col(s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let name = format!(
        "CASE {} END",
        present
            .iter()
            .map(|s| format!("WHEN {} IS NOT NULL THEN {}", col(s), sql::literal(s)))
            .collect::<Vec<_>>()
            .join(" ")
    );
    (value, name)
}

/// The stamp each frame is timed at, as a CTE `at_stamp` of the run's
/// stamps (host, point stem, packet: its device and payload bytes), and
/// the SQL of a frame's device (NULL at socket points, which name none).
/// Without a `stamps` view (a packets file alone) the CTE is empty.
fn wire_stamps(conn: &Connection) -> Result<(String, impl Fn(&str) -> String)> {
    let has_stamps: bool = conn.query_row(
        "SELECT count(*) > 0 FROM duckdb_views() WHERE view_name = 'stamps'",
        [],
        |r| r.get(0),
    )?;
    let device = |at: &str| {
        format!(
            "CASE WHEN {at} IN ({}) THEN d.ifindex END",
            sql::literals([TX_WIRE, RX_WIRE].concat())
        )
    };
    let stems: Vec<&str> = [TX_WIRE, TX_SOCKET, RX_WIRE, RX_SOCKET].concat();
    let source = if has_stamps {
        format!(
            "SELECT host, replace(point, '.', '_') AS stem, flow, coalesce(kind::UBIGINT, {all}) AS kind,
                    seq, min(ifindex) AS ifindex, max(len) AS payload
             FROM stamps WHERE replace(point, '.', '_') IN ({stems}) AND seq IS NOT NULL GROUP BY ALL",
            all = crate::KIND_ALL,
            stems = sql::literals(&stems)
        )
    } else {
        "SELECT NULL::VARCHAR AS host, NULL::VARCHAR AS stem, NULL::UBIGINT AS flow, NULL::UBIGINT AS kind,
                NULL::UBIGINT AS seq, NULL::UINTEGER AS ifindex, NULL::UINTEGER AS payload WHERE false"
            .to_string()
    };
    Ok((format!(", at_stamp AS ({source})"), device))
}

/// The join of a side's frames with the stamps they are timed at.
fn join(host: &str, at: &str) -> String {
    format!(
        "LEFT JOIN at_stamp d ON d.host = coalesce(c.{host}, '') AND d.stem = {at}
           AND d.flow = c.flow AND d.kind = c.kind AND d.seq = c.seq"
    )
}

/// Makes the frames' table from the first `max_packets` packets sent (0:
/// all) of `kind` (None: every kind); returns how many packets that kind
/// has in all.
pub fn select(conn: &Connection, max_packets: u64, kind: Option<u64>) -> Result<u64> {
    let columns: Vec<String> = {
        let mut stmt = conn.prepare("SELECT col FROM point_columns")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<std::result::Result<_, _>>()?
    };
    let wire = |device: &[&str], socket: &[&str]| {
        let all: Vec<&str> = device.iter().chain(socket).copied().collect();
        first_stamped(&columns, &all)
    };
    let (tx_t, tx_at) = wire(TX_WIRE, TX_SOCKET);
    let (rx_t, rx_at) = wire(RX_WIRE, RX_SOCKET);
    let kind_filter = |t: &str| kind.map_or("true".to_string(), |k| format!("{t}kind = {k}"));
    let limit = match max_packets {
        0 => String::new(),
        n => format!("LIMIT {n}"),
    };
    let common =
        "src_addr, dst_addr, src_port, dst_port, c.seq, kind_name, e2e_ns, sender_total_ns, \
                  channel_ns, receiver_total_ns, coalesce(lost, false) AS lost, c.flow";
    let (at_stamp, device) = wire_stamps(conn)?;
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE {TABLE} AS
         WITH names AS (SELECT kind, any_value(name) AS name FROM kinds GROUP BY kind),
         chosen AS (
           SELECT p.*, coalesce(n.name, CASE WHEN p.kind IS NULL OR p.kind = 4294967296 THEN 'all'
                                            ELSE p.kind::VARCHAR END) AS kind_name
           FROM packets p LEFT JOIN names n ON n.kind = p.kind
           WHERE {p_kind}
           ORDER BY p.sent_ns NULLS LAST, p.flow, p.kind, p.seq {limit})
         {at_stamp}
         SELECT 0::UTINYINT AS side, coalesce(tx_host, '') AS host, {tx_t} AS t_ns, {tx_at} AS wire_at,
                {tx_device} AS ifindex, d.payload, {common}
         FROM chosen c {join_tx} WHERE {tx_t} IS NOT NULL
         UNION ALL
         SELECT 1::UTINYINT, coalesce(rx_host, ''), {rx_t}, {rx_at}, {rx_device}, d.payload, {common}
         FROM chosen c {join_rx} WHERE {rx_t} IS NOT NULL;",
        p_kind = kind_filter("p."),
        join_tx = join("tx_host", &tx_at),
        join_rx = join("rx_host", &rx_at),
        tx_device = device(&tx_at),
        rx_device = device(&rx_at),
    ))?;
    let total: i64 = conn.query_row(
        &format!("SELECT count(*) FROM packets WHERE {}", kind_filter("")),
        [],
        |r| r.get(0),
    )?;
    Ok(total.max(0) as u64)
}

/// The interfaces the frames need: (side, host, device), in a fixed
/// order.
pub fn interfaces(conn: &Connection) -> Result<Vec<(u8, String, Option<u32>)>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT DISTINCT side, host, ifindex FROM {TABLE} ORDER BY side, host, ifindex NULLS FIRST"
    ))?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}

/// Calls `each` with every frame in time order.
pub fn for_each(conn: &Connection, mut each: impl FnMut(Row) -> Result<()>) -> Result<()> {
    let mut stmt = conn.prepare(&format!(
        "SELECT side, host, t_ns, wire_at, src_addr, dst_addr, src_port, dst_port, seq, kind_name,
                e2e_ns, sender_total_ns, channel_ns, receiver_total_ns, lost, ifindex, payload
         FROM {TABLE} ORDER BY t_ns, side, flow, seq"
    ))?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        each(Row {
            side: r.get(0)?,
            host: r.get(1)?,
            t_ns: r.get(2)?,
            at: r.get(3)?,
            src_addr: r.get(4)?,
            dst_addr: r.get(5)?,
            src_port: r.get::<_, Option<u16>>(6)?.unwrap_or(0),
            dst_port: r.get::<_, Option<u16>>(7)?.unwrap_or(0),
            seq: r.get(8)?,
            kind: r.get(9)?,
            e2e_ns: r.get(10)?,
            sender_total_ns: r.get(11)?,
            channel_ns: r.get(12)?,
            receiver_total_ns: r.get(13)?,
            lost: r.get(14)?,
            ifindex: r.get(15)?,
            payload: r.get(16)?,
        })?;
    }
    Ok(())
}

/// Whether `at` is a socket point: the side had no device point, and the
/// frame is timed at the socket instead.
pub fn at_socket(at: &str) -> bool {
    TX_SOCKET.contains(&at) || RX_SOCKET.contains(&at)
}

/// A duration in µs with its ns exact (`12.345us`), `-` when the packet
/// has none.
fn us(ns: Option<i64>) -> String {
    match ns {
        Some(ns) => format!(
            "{}{}.{:03}us",
            if ns < 0 { "-" } else { "" },
            ns.unsigned_abs() / 1000,
            ns.unsigned_abs() % 1000
        ),
        None => "-".into(),
    }
}

/// The frame's comment: the packet and X-LAP's breakdown of it.
pub fn comment(row: &Row) -> String {
    format!(
        "seq={} kind={} side={} at={}{} e2e={} sender_total={} channel={} receiver_total={} lost={}",
        row.seq,
        row.kind,
        if row.side == 0 { "sender" } else { "receiver" },
        row.at,
        if at_socket(&row.at) {
            " (no device point)"
        } else {
            ""
        },
        us(row.e2e_ns),
        us(row.sender_total_ns),
        us(row.channel_ns),
        us(row.receiver_total_ns),
        row.lost
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_their_ns_and_sign() {
        assert_eq!(us(Some(123_456)), "123.456us");
        assert_eq!(us(Some(-1_005)), "-1.005us");
        assert_eq!(us(Some(7)), "0.007us");
        assert_eq!(us(None), "-");
    }
}

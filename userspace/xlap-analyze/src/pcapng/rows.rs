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
        "src_addr, dst_addr, src_port, dst_port, seq, kind_name, e2e_ns, sender_total_ns, \
                  channel_ns, receiver_total_ns, coalesce(lost, false) AS lost, flow";
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE {TABLE} AS
         WITH names AS (SELECT kind, any_value(name) AS name FROM kinds GROUP BY kind),
         chosen AS (
           SELECT p.*, coalesce(n.name, CASE WHEN p.kind IS NULL OR p.kind = 4294967296 THEN 'all'
                                            ELSE p.kind::VARCHAR END) AS kind_name
           FROM packets p LEFT JOIN names n ON n.kind = p.kind
           WHERE {p_kind}
           ORDER BY p.sent_ns NULLS LAST, p.flow, p.kind, p.seq {limit})
         SELECT 0::UTINYINT AS side, coalesce(tx_host, '') AS host, {tx_t} AS t_ns, {tx_at} AS wire_at, {common}
         FROM chosen WHERE {tx_t} IS NOT NULL
         UNION ALL
         SELECT 1::UTINYINT, coalesce(rx_host, ''), {rx_t}, {rx_at}, {common}
         FROM chosen WHERE {rx_t} IS NOT NULL;",
        p_kind = kind_filter("p.")
    ))?;
    let total: i64 = conn.query_row(
        &format!("SELECT count(*) FROM packets WHERE {}", kind_filter("")),
        [],
        |r| r.get(0),
    )?;
    Ok(total.max(0) as u64)
}

/// The interfaces the frames need: (side, host), in a fixed order.
pub fn interfaces(conn: &Connection) -> Result<Vec<(u8, String)>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT DISTINCT side, host FROM {TABLE} ORDER BY side, host"
    ))?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    Ok(rows.collect::<std::result::Result<_, _>>()?)
}

/// Calls `each` with every frame in time order.
pub fn for_each(conn: &Connection, mut each: impl FnMut(Row) -> Result<()>) -> Result<()> {
    let mut stmt = conn.prepare(&format!(
        "SELECT side, host, t_ns, wire_at, src_addr, dst_addr, src_port, dst_port, seq, kind_name,
                e2e_ns, sender_total_ns, channel_ns, receiver_total_ns, lost
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

//! The view as OpenMetrics text, served over HTTP from a thread of its
//! own (`--metrics ADDR:PORT`).

use super::*;

/// The metrics' histogram bounds, seconds.
pub(super) const BOUNDS_S: [f64; 16] = [
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1,
];
/// The metrics as OpenMetrics text.
pub(super) fn openmetrics(
    stats: &Stats,
    stamps: u64,
    packets: u64,
    sample_one_in: u32,
    losses: &[(&str, u64)],
    name: &dyn Fn(StageKey) -> String,
) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# TYPE xlap_sample_one_in gauge\n# HELP xlap_sample_one_in Packets each recorded packet stands for (--sample 1/N; 1: every datagram): counts and histogram counts scale by it.\nxlap_sample_one_in {sample_one_in}");
    let _ = writeln!(s, "# TYPE xlap_stamps counter\n# HELP xlap_stamps Stamps recorded.\nxlap_stamps_total {stamps}");
    let _ = writeln!(s, "# TYPE xlap_packets counter\n# HELP xlap_packets Packets completed (two or more stamps).\nxlap_packets_total {packets}");
    let _ = writeln!(s, "# TYPE xlap_lost_stamps counter\n# HELP xlap_lost_stamps Stamps the tracer lost, by reason.");
    for (reason, n) in losses {
        let _ = writeln!(s, "xlap_lost_stamps_total{{reason=\"{reason}\"}} {n}");
    }
    let _ = writeln!(s, "# TYPE xlap_latency_seconds histogram\n# HELP xlap_latency_seconds End-to-end (stage e2e), one end's span where only one end was recorded (stage span), and stage latency per packet kind.\n# UNIT xlap_latency_seconds seconds");
    for (kind, k) in stats {
        let mut stages: Vec<(String, &Hist)> =
            k.stages.iter().map(|(key, h)| (name(*key), h)).collect();
        stages.sort_by(|a, b| a.0.cmp(&b.0));
        let hists = k
            .e2e
            .iter()
            .map(|h| ("e2e".to_string(), h))
            .chain(k.one_end.iter().map(|h| ("span".to_string(), h)))
            .chain(stages);
        for (stage, h) in hists {
            let labels = format!("kind=\"{}\",stage=\"{stage}\"", kind_value(*kind));
            for b in BOUNDS_S {
                let _ = writeln!(
                    s,
                    "xlap_latency_seconds_bucket{{{labels},le=\"{b:e}\"}} {}",
                    h.at_or_below(b * 1e9)
                );
            }
            let _ = writeln!(
                s,
                "xlap_latency_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                h.n
            );
            let _ = writeln!(s, "xlap_latency_seconds_count{{{labels}}} {}", h.n);
            let _ = writeln!(
                s,
                "xlap_latency_seconds_sum{{{labels}}} {:e}",
                h.sum_ns / 1e9
            );
        }
    }
    s.push_str("# EOF\n");
    s
}

/// Serves the latest metrics text on `addr` from a thread (one request per
/// connection, any path).
pub(super) fn serve(addr: SocketAddr) -> anyhow::Result<Arc<Mutex<String>>> {
    let listener = TcpListener::bind(addr).map_err(|e| {
        xlap_exit::failure(
            xlap_exit::Code::Usage,
            format!("--metrics {addr}: cannot listen there ({e}); give a free ADDR:PORT"),
        )
    })?;
    let text = Arc::new(Mutex::new("# EOF\n".to_string()));
    spawn_server(listener, text.clone())?;
    Ok(text)
}

/// How long one client may take to send its request, and to take the
/// answer: the network is not trusted (docs/threat-model.md), and a client
/// that sends nothing or reads nothing must not hold the others for long.
const CLIENT_READ_TIMEOUT: Duration = Duration::from_millis(500);
const CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(2);

pub(super) fn spawn_server(
    listener: TcpListener,
    shared: Arc<Mutex<String>>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("xlap-metrics".into())
        .spawn(move || {
            // Serving text to the network needs no capability at all.
            let _ = crate::capabilities::keep_only(&[]);
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_read_timeout(Some(CLIENT_READ_TIMEOUT));
                let _ = conn.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT));
                // The request is not looked at beyond its first read, of
                // a bounded size: any request, malformed or huge, gets the
                // same answer.
                let mut buf = [0u8; 2048];
                let _ = conn.read(&mut buf);
                let body = shared.lock().map(|t| t.clone()).unwrap_or_default();
                let _ = write!(
                    conn,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        })?;
    Ok(())
}

/// A kind as an OpenMetrics label value: its number, or `all` for the
/// packets of a layout without a kind field (as the analyses name them).
pub(super) fn kind_value(kind: u64) -> String {
    if kind == xlap_records::kinds::KIND_ALL {
        xlap_records::kinds::KIND_ALL_NAME.to_string()
    } else {
        kind.to_string()
    }
}

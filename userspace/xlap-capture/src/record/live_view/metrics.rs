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
    let hists = histograms(stats, name);
    let _ = writeln!(s, "# TYPE xlap_latency_seconds histogram\n# HELP xlap_latency_seconds End-to-end (stage e2e), one end's span where only one end was recorded (stage span), and stage latency per packet kind.\n# UNIT xlap_latency_seconds seconds");
    for (labels, h) in &hists {
        for b in BOUNDS_S {
            let _ = writeln!(
                s,
                "xlap_latency_seconds_bucket{{{labels},le=\"{b:e}\"}} {}",
                h.at_or_below(b * 1e9)
            );
        }
        write_tail(&mut s, "xlap_latency_seconds", labels, h);
    }
    write_exp2(&mut s, &hists);
    s.push_str("# EOF\n");
    s
}

/// Every histogram of the run with its labels (`kind`, `stage`): per kind
/// the end-to-end, the one-end span, then the stages by name.
fn histograms<'a>(stats: &'a Stats, name: &dyn Fn(StageKey) -> String) -> Vec<(String, &'a Hist)> {
    let mut all = Vec::new();
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
            all.push((labels, h));
        }
    }
    all
}

/// A histogram's +Inf bucket, count and sum.
fn write_tail(s: &mut String, family: &str, labels: &str, h: &Hist) {
    let _ = writeln!(s, "{family}_bucket{{{labels},le=\"+Inf\"}} {}", h.n);
    let _ = writeln!(s, "{family}_count{{{labels}}} {}", h.n);
    let _ = writeln!(s, "{family}_sum{{{labels}}} {:e}", h.sum_ns / 1e9);
}

/// The same histograms with power-of-two bounds, 1 ns … 2^27 ns, as
/// netstacklat and ebpf_exporter export theirs: their users' dashboards
/// (`histogram_quantile`, heatmaps) read ours unchanged, and each bucket is
/// exact (counted apart, not folded from the log buckets).
fn write_exp2(s: &mut String, hists: &[(String, &Hist)]) {
    const FAMILY: &str = "xlap_stage_latency_seconds";
    let _ = writeln!(s, "# TYPE {FAMILY} histogram\n# HELP {FAMILY} Stage latency per packet kind (stage e2e: end to end; span: one end's span), in power-of-two buckets of nanoseconds (le 2^0 ... 2^27 ns).\n# UNIT {FAMILY} seconds");
    for (labels, h) in hists {
        for (k, n) in h.exp2_cumulative() {
            let _ = writeln!(
                s,
                "{FAMILY}_bucket{{{labels},le=\"{:e}\"}} {n}",
                exp2_bound_s(k)
            );
        }
        write_tail(s, FAMILY, labels, h);
    }
}

/// 2^k ns in seconds (exact to the shortest decimal that reads back).
pub(super) fn exp2_bound_s(k: u32) -> f64 {
    (1u64 << k) as f64 / 1e9
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
                let _ = conn.set_write_timeout(Some(CLIENT_WRITE_TIMEOUT));
                // The request is not looked at: any request, malformed or
                // huge, gets the same answer.
                read_head(&mut conn);
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

/// Reads a request's head and drops it: up to its blank line, at most
/// 2 KiB, within [`CLIENT_READ_TIMEOUT`] in all (not per read: a client
/// that trickles a byte at a time must not hold the others). The whole head,
/// not its first read: a request written in pieces (a write per header
/// line) left bytes unread, and closing over them reset the connection, so
/// such a client got a reset in place of the answer.
fn read_head(conn: &mut std::net::TcpStream) {
    let deadline = Instant::now() + CLIENT_READ_TIMEOUT;
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() && !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || conn.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match conn.read(&mut buf[len..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => len += n,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::super::hist::EXP2_TOP;
    use super::super::tests::check_openmetrics;
    use super::*;

    /// The exp2 family: every bound 2^0 … 2^27 ns then +Inf per kind and
    /// stage, cumulative, a stage of exactly 4 096 ns in the bucket `le`
    /// 4.096e-6 and not in the one below, the count and sum as the
    /// histogram's; the whole text well formed; the 1-2-5 family still
    /// there.
    #[test]
    fn exp2_histograms_per_kind_and_stage() {
        let mut stats = Stats::new();
        let k = stats.entry(1).or_default();
        let stage = (StageSide::Tx, 1, 2);
        let h = k.stages.entry(stage).or_insert_with(Hist::new);
        for ns in [4_096, 4_096, 10_000, 300_000_000] {
            h.add(ns);
        }
        k.e2e().add(50_000);
        let text = openmetrics(&stats, 10, 4, 1, &[], &|_| "a__b".to_string());
        check_openmetrics(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let family = "xlap_stage_latency_seconds";
        assert!(
            text.contains(&format!("# TYPE {family} histogram\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("# UNIT {family} seconds\n")),
            "{text}"
        );
        let bucket = |stage: &str, le: &str| {
            let series = format!("{family}_bucket{{kind=\"1\",stage=\"{stage}\",le=\"{le}\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(series.as_str()))
                .unwrap_or_else(|| panic!("no {series} in {text}"))
                .parse::<u64>()
                .unwrap()
        };
        assert_eq!(bucket("a__b", "1e-9"), 0);
        assert_eq!(bucket("a__b", "2.048e-6"), 0);
        assert_eq!(bucket("a__b", "4.096e-6"), 2);
        assert_eq!(bucket("a__b", "8.192e-6"), 2);
        assert_eq!(bucket("a__b", "1.6384e-5"), 3);
        assert_eq!(bucket("a__b", "1.34217728e-1"), 3);
        assert_eq!(bucket("a__b", "+Inf"), 4);
        assert_eq!(bucket("e2e", "6.5536e-5"), 1);
        let les = text
            .lines()
            .filter(|l| l.starts_with(&format!("{family}_bucket{{kind=\"1\",stage=\"a__b\"")))
            .count();
        assert_eq!(les, EXP2_TOP as usize + 2);
        assert!(text.contains(&format!("{family}_count{{kind=\"1\",stage=\"a__b\"}} 4\n")));
        assert!(
            text.contains(&format!(
                "{family}_sum{{kind=\"1\",stage=\"a__b\"}} 3.00018192e-1\n"
            )),
            "{text}"
        );
        assert!(text.contains("xlap_latency_seconds_count{kind=\"1\",stage=\"a__b\"} 4\n"));
    }

    /// A request written a line at a time, each its own segment: the
    /// answer, not a reset.
    #[test]
    fn a_request_in_pieces_gets_the_answer() {
        use std::io::Write as _;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        spawn_server(listener, Arc::new(Mutex::new("# EOF\n".into()))).unwrap();
        for _ in 0..20 {
            let mut conn = std::net::TcpStream::connect(addr).unwrap();
            conn.set_nodelay(true).unwrap();
            // Only a guard against hanging the suite.
            conn.set_read_timeout(Some(Duration::from_secs(60)))
                .unwrap();
            for piece in [
                "GET /metrics HTTP/1.0\r\n",
                "Host: x\r\n",
                "Accept: */*\r\n",
                "\r\n",
            ] {
                conn.write_all(piece.as_bytes()).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
            let mut answer = String::new();
            conn.read_to_string(&mut answer).unwrap();
            assert!(
                answer.starts_with("HTTP/1.1 200 OK") && answer.ends_with("# EOF\n"),
                "{answer}"
            );
        }
    }

    /// The bounds as Prometheus reads them back: 2^k ns exactly.
    #[test]
    fn exp2_bounds_read_back_as_powers_of_two() {
        for k in 0..=EXP2_TOP {
            let text = format!("{:e}", exp2_bound_s(k));
            let back: f64 = text.parse().unwrap();
            assert_eq!((back * 1e9).round() as u64, 1u64 << k, "{text}");
        }
    }
}

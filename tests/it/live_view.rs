//! Privileged: `record --live --metrics ADDR:PORT` on the example protocol
//! across the two-host stage. While it runs, the metrics endpoint serves
//! OpenMetrics histograms that grow; at the end, the live view's packet
//! count of the data kind is the sender's own count of data packets, and
//! its end-to-end median is the receiver's own latency median.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use xlap_stage::Stage;
use xlap_tests::example::{events, kind_code, ExampleOptions};
use xlap_tests::privileged;
use xlap_tests::trace::trace_example;

pub(crate) fn scrape(addr: &str) -> Option<String> {
    let mut conn = TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    conn.read_to_string(&mut text).ok()?;
    Some(text)
}

/// The value of one sample line, by its name and labels.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_live_view_and_metrics_follow_the_run() {
    let Some(_guard) = privileged("live_view") else {
        return;
    };
    let stage = Stage::two_hosts().expect("stage");
    let addr = format!("127.0.0.1:{}", 47_000 + std::process::id() % 1000);
    let data = kind_code("data");
    let e2e_count = format!("xlap_latency_seconds_count{{kind=\"{data}\",stage=\"e2e\"}}");
    // Scrapes while the run goes on (it starts within seconds, lasts 3 s).
    let scraper = {
        let addr = addr.clone();
        let series = e2e_count.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut seen = Vec::new();
            while start.elapsed() < Duration::from_secs(30) && seen.len() < 2 {
                if let Some(text) = scrape(&addr) {
                    if sample(&text, &series).is_some_and(|n| n > 0.0)
                        && seen
                            .last()
                            .is_none_or(|(_, t): &(Instant, String)| t != &text)
                    {
                        seen.push((Instant::now(), text));
                    }
                }
                std::thread::sleep(Duration::from_millis(300));
            }
            seen
        })
    };
    let t = trace_example(
        &stage,
        "live-view",
        &ExampleOptions {
            count: 3_000,
            period_us: 1_000,
            markers: true,
            ..Default::default()
        },
        &["--live", "--metrics", &addr],
    );
    let scrapes = scraper.join().unwrap();
    assert!(!scrapes.is_empty(), "no metrics while the run went on");
    let mut last_count = 0.0;
    for (_, text) in &scrapes {
        assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
        assert!(text.contains("application/openmetrics-text"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        let count = sample(text, &e2e_count).unwrap();
        assert!(count >= last_count, "a counter went back");
        last_count = count;
        // Cumulative buckets: non-decreasing, +Inf is the count.
        let prefix = format!("xlap_latency_seconds_bucket{{kind=\"{data}\",stage=\"e2e\",le=");
        let buckets: Vec<f64> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(
            buckets.len() > 2 && buckets.windows(2).all(|w| w[0] <= w[1]),
            "{text}"
        );
        assert_eq!(*buckets.last().unwrap(), count);
    }

    // The sender's and receiver's own accounts.
    let sent = events(&t.sent, "sent")
        .filter(|e| e["kind"] == "data" && e["dropped"] == false)
        .count() as u64;
    let mut latencies: Vec<f64> = events(&t.received, "delivered")
        .map(|e| e["latency_ns"].as_f64().unwrap())
        .collect();
    latencies.sort_by(f64::total_cmp);
    let own_p50_us = latencies[latencies.len() / 2] / 1e3;
    // The final block of the live view: "kind 1: N packets ..., e2e p50 X µs".
    let line = t
        .stdout
        .lines()
        .rev()
        .find(|l| l.starts_with(&format!("kind {data}: ")))
        .unwrap_or_else(|| panic!("no live view in: {}", t.stdout));
    let packets: u64 = line
        .split_whitespace()
        .nth(2)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert_eq!(packets, sent, "{line}");
    assert!(last_count <= sent as f64);
    let p50: f64 = line
        .split("e2e p50 ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        (p50 - own_p50_us).abs() < 10.0 + 0.3 * own_p50_us,
        "live e2e p50 {p50} µs, the receiver's own {own_p50_us} µs"
    );
}

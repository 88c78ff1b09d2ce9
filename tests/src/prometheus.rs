//! A real Prometheus server (Debian's `prometheus`), run by a test on
//! loopback: its own configuration, storage and port, scraping one target
//! every second, asked through its HTTP API. Never the system's service:
//! the instance is the test's child, killed and its directory removed when
//! the test lets go of it.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary, if the machine has it.
pub fn binary() -> Option<PathBuf> {
    which("prometheus")
}

/// `promtool`, shipped beside the server by Debian's package.
pub fn promtool() -> Option<PathBuf> {
    which("promtool")
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// A loopback port nobody listens on now (bound, then let go).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("its address").port()
}

/// One plain HTTP/1.0 GET (no chunked answer, the server closes): status
/// and body.
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut conn = TcpStream::connect(addr)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    // One write: the request in one segment.
    conn.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// A query string's value, percent-encoded (all but RFC 3986's unreserved).
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The running server.
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    pub addr: String,
}

impl Prometheus {
    /// Starts a server in `dir` (created; removed on drop) scraping
    /// `target` (`HOST:PORT`, any path) every second, and waits until it is
    /// ready. Its log goes to `log`.
    pub fn start(binary: &Path, dir: &Path, target: &str, log: &Path) -> Prometheus {
        std::fs::create_dir_all(dir).expect("create the Prometheus directory");
        let config = dir.join("prom.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: xlap\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prom.yml");
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(log).expect("create the Prometheus log");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawn prometheus");
        let mut prom = Prometheus {
            child,
            dir: dir.to_path_buf(),
            addr,
        };
        let start = Instant::now();
        while !matches!(http_get(&prom.addr, "/-/ready"), Ok((200, _))) {
            if let Ok(Some(status)) = prom.child.try_wait() {
                panic!("prometheus exited ({status}) before it was ready");
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "prometheus not ready after 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        prom
    }

    /// An API call (`/api/v1/...?...`): its JSON, which must say `status`
    /// `success`.
    pub fn api(&self, path_and_query: &str) -> Value {
        let (code, body) = http_get(&self.addr, path_and_query)
            .unwrap_or_else(|e| panic!("prometheus {path_and_query}: {e}"));
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("prometheus {path_and_query}: {e}: {body}"));
        assert!(
            code == 200 && v["status"] == "success",
            "prometheus {path_and_query}: HTTP {code}: {body}"
        );
        v
    }

    /// An instant query at `time` (Unix seconds; the server's now if
    /// `None`): the result vector.
    pub fn query(&self, promql: &str, time: Option<f64>) -> Vec<Value> {
        let at = time.map_or(String::new(), |t| format!("&time={t:.3}"));
        let v = self.api(&format!("/api/v1/query?query={}{at}", encode(promql)));
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// One instant value: the first sample's, if any.
    pub fn value(&self, promql: &str, time: Option<f64>) -> Option<f64> {
        let r = self.query(promql, time);
        r.first()?["value"][1].as_str()?.parse().ok()
    }

    /// A range query from `start` to `end` (Unix seconds) every `step_s`:
    /// the result matrix.
    pub fn query_range(&self, promql: &str, start: f64, end: f64, step_s: u32) -> Vec<Value> {
        let v = self.api(&format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step_s}s",
            encode(promql)
        ));
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // Only the server this test started, by its own child handle.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Now as Unix seconds (Prometheus' API time).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

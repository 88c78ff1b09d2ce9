//! The protocol's own record of what it did, as JSON lines (one object per
//! event, `"event"` names it). Tests read it as ground truth.

use anyhow::{Context, Result};
use serde_json::Value;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;

/// A shared JSON-lines sink; without a path it records nothing.
pub struct EventLog {
    out: Option<Mutex<BufWriter<File>>>,
    /// Only these events (all when empty): a long run's log keeps its
    /// `summary` without a line per datagram.
    only: Vec<String>,
}

impl EventLog {
    pub fn open(path: Option<&Path>) -> Result<EventLog> {
        Self::open_only(path, &[])
    }

    /// A log of the events named in `only` (every event when empty).
    pub fn open_only(path: Option<&Path>, only: &[String]) -> Result<EventLog> {
        let out = match path {
            Some(p) => Some(Mutex::new(BufWriter::new(
                File::create(p)
                    .with_context(|| format!("cannot create log file {}", p.display()))?,
            ))),
            None => None,
        };
        Ok(EventLog {
            out,
            only: only.to_vec(),
        })
    }

    /// Appends one event; `event` must be a JSON object with an `"event"` key.
    pub fn record(&self, event: Value) {
        if let Some(out) = &self.out {
            if !self.only.is_empty() && !self.only.iter().any(|e| event["event"] == e.as_str()) {
                return;
            }
            let mut out = out.lock().expect("log writer poisoned");
            // A full disk must not stop the protocol; the summary line reports
            // the run, and a short log is visible to whoever reads it.
            let _ = serde_json::to_writer(&mut *out, &event);
            let _ = out.write_all(b"\n");
        }
    }

    pub fn flush(&self) -> Result<()> {
        if let Some(out) = &self.out {
            out.lock().expect("log writer poisoned").flush()?;
        }
        Ok(())
    }
}

//! `record --to` and `record --collect` around a recording: the link
//! started before the run (a collector must be listening when its peers
//! start), ended after it, and what it came to written into the run's
//! run.json and said.

use crate::cli::RecordArgs;
use anyhow::Result;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use xlap_capture::peer::auth::Token;
use xlap_capture::peer::collector::{CollectOptions, Collector};
use xlap_capture::peer::live::PeerFeed;
use xlap_capture::peer::sender::{SendOptions, Sender};
use xlap_capture::peer::DEFAULT_MAX_BYTES_PER_PEER;
use xlap_exit::{failure, Code};
use xlap_records::run_meta::RunMeta;
use xlap_records::RunDir;

pub enum Link {
    None,
    Send(Sender),
    Collect(Collector),
}

impl Link {
    /// A collector's peers as the live view sees them (`--live`).
    pub fn feed(&self) -> Option<Arc<PeerFeed>> {
        match self {
            Link::Collect(c) => c.feed(),
            _ => None,
        }
    }
}

/// What the link came to, for the exit code.
pub struct Ended {
    /// The peers' run directories that hold a run.json (to correlate).
    pub peers: Vec<PathBuf>,
    /// A sender whose run did not all reach the collector.
    pub undelivered: Option<String>,
}

fn token(a: &RecordArgs) -> Result<Token> {
    match (&a.token_file, &a.token) {
        (Some(path), _) => Token::from_file(path),
        (None, Some(text)) => Token::from_text(text),
        (None, None) => Err(failure(
            Code::Usage,
            "--to and --collect need the shared token: --token-file PATH (or --token)",
        )),
    }
}

/// Refuses what the link does not support, then starts it.
pub fn start(a: &RecordArgs) -> Result<Link> {
    let option = match (&a.to, &a.collect) {
        (None, None) => {
            if a.token_file.is_some() || a.token.is_some() {
                return Err(failure(
                    Code::Usage,
                    "--token-file and --token are for --to or --collect",
                ));
            }
            return Ok(Link::None);
        }
        (Some(_), _) => "--to",
        (None, Some(_)) => "--collect",
    };
    if a.rotate.is_some() {
        return Err(failure(
            Code::Usage,
            format!("{option} does not work with --rotate (a rotated recording is many runs): record without --rotate, or copy the segments and `xlap-trace correlate` them"),
        ));
    }
    if !(a.peer_wait.is_finite() && a.peer_wait >= 0.0) {
        return Err(failure(Code::Usage, "--peer-wait takes seconds, 0 or more"));
    }
    let token = token(a)?;
    if let Some(to) = &a.to {
        if !to.contains(':') {
            return Err(failure(Code::Usage, format!("--to {to}: give HOST:PORT")));
        }
        let s = Sender::start(SendOptions {
            to: to.clone(),
            token,
            dir: a.output.clone(),
            quiet: a.quiet,
        })?;
        return Ok(Link::Send(s));
    }
    let c = Collector::start(CollectOptions {
        listen: a.collect.expect("--collect given"),
        token,
        dir: a.output.clone(),
        max_bytes_per_peer: a.max_size.unwrap_or(DEFAULT_MAX_BYTES_PER_PEER),
        quiet: a.quiet,
        // The live view (or metrics) shows the peers' stamps joined with ours.
        live: (a.live || a.metrics.is_some()).then(|| Arc::new(PeerFeed::default())),
    })?;
    Ok(Link::Collect(c))
}

/// Ends the link once the run is complete on disk; notes it in run.json.
pub fn end(link: Link, a: &RecordArgs) -> Result<Ended> {
    let wait = Duration::from_secs_f64(a.peer_wait);
    let run = RunDir::new(&a.output);
    let mut ended = Ended {
        peers: Vec::new(),
        undelivered: None,
    };
    match link {
        Link::None => {}
        Link::Send(s) => {
            let link = s.finish(wait);
            say_sent(&link, a.quiet);
            if link.state != "delivered" {
                ended.undelivered = Some(format!(
                    "the run did not all reach {} ({}: {} of {} stream bytes delivered{}{}); it is whole in {} (run.json: peer_link)",
                    link.to,
                    link.state,
                    link.bytes_delivered,
                    link.stream_bytes,
                    if link.final_delivered { "" } else { ", not the final run.json and stamps.parquet" },
                    link.error.as_deref().map(|e| format!("; {e}")).unwrap_or_default(),
                    a.output.display()
                ));
            }
            note(&run, |m| m.peer_link = Some(link))?;
        }
        Link::Collect(c) => {
            let (collected, dirs) = c.finish(wait);
            say_collected(&collected, a.quiet);
            ended.peers = dirs;
            note(&run, |m| m.peers = Some(collected))?;
        }
    }
    Ok(ended)
}

/// Rewrites this run's own run.json (ours: written by this process).
fn note(run: &RunDir, f: impl FnOnce(&mut RunMeta)) -> Result<()> {
    let text = xlap_records::run_file::read_json_text(&run.meta())?;
    let mut meta = RunMeta::from_json(&text)?;
    f(&mut meta);
    meta.write(&run.meta())?;
    Ok(())
}

/// A delivered run, said; one that was not is the command's error (exit
/// 1, [`Ended::undelivered`]).
fn say_sent(l: &xlap_records::run_meta::PeerLink, quiet: bool) {
    if l.state == "delivered" && !quiet {
        eprintln!(
            "xlap-trace: peer link to {}: the run arrived whole ({} stream bytes, {} sent, {} connection{})",
            l.to,
            l.bytes_delivered,
            l.bytes_sent,
            l.connections,
            if l.connections == 1 { "" } else { "s" }
        );
    }
}

fn say_collected(c: &xlap_records::run_meta::PeersCollected, quiet: bool) {
    if c.peers.is_empty() {
        eprintln!(
            "xlap-trace: warning: no peer recorder connected to {} during the run{}; the packets table is this host's alone",
            c.listen,
            if c.refused_total > 0 { format!(" (connections refused: {}, run.json peers.refused)", c.refused_total) } else { String::new() }
        );
        return;
    }
    for p in &c.peers {
        if p.complete {
            if !quiet {
                eprintln!(
                    "xlap-trace: peer {}: whole in {} ({} stream bytes)",
                    p.address, p.dir, p.stream_bytes
                );
            }
            continue;
        }
        eprintln!(
            "xlap-trace: warning: peer {}: its run is incomplete in {} ({} stream bytes{}{}; waited {:.1} s): the analysis takes what arrived, as a recorder's that died (run.json: peers)",
            p.address,
            p.dir,
            p.stream_bytes,
            p.stream_bytes_sent_total.map(|t| format!(" of {t}")).unwrap_or_default(),
            p.error.as_deref().map(|e| format!(", {e}")).unwrap_or_default(),
            c.waited_s
        );
    }
}

/// `peer-decode` (hidden): a collector's child that decodes one peer's
/// stamps stream as it grows (its stdin, the file the collector opened)
/// into records on stdout (xlap_records::peer_stamps). The bytes are the
/// network's: it confines itself first (no capability, no_new_privs, no
/// file to open or write; without Landlock, user nobody), and runs under
/// the memory ceiling its parent set. It ends when its parent stops
/// reading or is gone, or when the stream is not one.
pub fn decode() -> Result<()> {
    // Not PR_SET_PDEATHSIG: it fires when the thread that started the
    // child ends (the peer's connection), not the recorder. Its stdout
    // closing, or the parent gone at the stream's end, ends it.
    let parent = std::os::unix::process::parent_id();
    let mut policy = xlap_sandbox::Policy::new();
    if xlap_sandbox::landlock_abi().is_err() {
        policy = policy.as_user(65534, 65534);
    }
    policy
        .apply()
        .map_err(|e| anyhow::anyhow!("cannot confine the peer's decoder: {e}"))?;
    let input = xlap_records::peer_stamps::Tail {
        inner: std::io::stdin().lock(),
        done: move || std::os::unix::process::parent_id() != parent,
        poll: Duration::from_millis(100),
    };
    let out = std::io::BufWriter::new(std::io::stdout().lock());
    xlap_records::peer_stamps::decode_stream(std::io::BufReader::new(input), out)
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("{e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Cli;
    use clap::Parser;

    fn start_with(args: &[&str]) -> Result<Link> {
        let cli = Cli::parse_from(std::iter::once("xlap-trace").chain(args.iter().copied()));
        start(&cli.record)
    }

    fn usage_error(args: &[&str]) -> String {
        let e = start_with(args).err().expect("refused");
        let f = e.downcast_ref::<xlap_exit::Failure>().expect("a failure");
        assert_eq!(f.code, Code::Usage, "{}", f.message);
        f.message.clone()
    }

    #[test]
    fn what_the_link_does_not_support_is_refused() {
        let t = ["--token", "a long enough token"];
        let with =
            |extra: &[&'static str]| -> Vec<&str> { extra.iter().copied().chain(t).collect() };
        assert!(usage_error(&with(&["--to", "b:7700", "--rotate", "10s"])).contains("--rotate"));
        assert!(
            usage_error(&with(&["--collect", "127.0.0.1:0", "--rotate", "1GB"]))
                .contains("--rotate")
        );
        assert!(usage_error(&["--to", "b:7700"]).contains("--token-file"));
        assert!(usage_error(&t).contains("for --to or --collect"));
        assert!(usage_error(&with(&["--to", "b"])).contains("HOST:PORT"));
        assert!(usage_error(&["--to", "b:1", "--token", "short"]).contains("8 characters"));
        assert!(
            usage_error(&["--to", "b:1", "--token-file", "/nonexistent/t"]).contains("cannot read")
        );
        // A sender and a collector at once: clap refuses it.
        assert!(
            Cli::try_parse_from(["xlap-trace", "--to", "b:1", "--collect", "127.0.0.1:1"]).is_err()
        );
    }
}

//! `stage`: network-namespace test hosts joined by veth.

use crate::cli::{self, StageCommand};
use anyhow::Result;
use xlap_exit::{failure, Code};

pub fn stage(c: StageCommand) -> Result<()> {
    let stage_err = |e: xlap_stage::StageError| match e {
        xlap_stage::StageError::NotRoot => failure(Code::Privileges, e.to_string()),
        other => anyhow::Error::new(other),
    };
    match c {
        StageCommand::Up {
            hosts,
            qdisc,
            link,
            mtu,
            second_path,
        } => {
            let qdiscs = cli::parse_qdisc_args(&qdisc, hosts as usize)?;
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
                signal_hook::flag::register(sig, stop.clone())?;
            }
            let stage = xlap_stage::Stage::build(&xlap_stage::StageConfig {
                hosts: hosts as usize,
                qdiscs,
                link,
                mtu,
                second_path,
            })
            .map_err(stage_err)?;
            for h in &stage.hosts {
                println!(
                    "host {}: netns {} dev {} {} {}",
                    h.netns.rsplit('-').next().unwrap_or(""),
                    h.netns,
                    h.ifname,
                    h.ipv4,
                    h.ipv6
                );
                if let Some((v4, v6)) = h.second {
                    println!("  second path: dev xl1 {v4} {v6}");
                }
            }
            println!(
                "run commands in a host with: ip netns exec NETNS CMD; Ctrl-C removes the stage"
            );
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            drop(stage);
            println!("stage removed");
            Ok(())
        }
        StageCommand::Sweep { check } => {
            let mut removed = xlap_stage::sweep_orphans().map_err(stage_err)?;
            for ns in &removed {
                println!("removed {ns}");
            }
            // Leaks a stage swept before it was built (since the last sweep).
            for ns in xlap_stage::take_noted_leaks() {
                println!("removed earlier by a new stage: {ns}");
                removed.push(ns);
            }
            if check && !removed.is_empty() {
                return Err(failure(
                    Code::Runtime,
                    format!(
                        "{} stage namespaces were left behind by exited processes",
                        removed.len()
                    ),
                ));
            }
            Ok(())
        }
        StageCommand::List => {
            for ns in xlap_stage::list_namespaces().map_err(stage_err)? {
                if ns.starts_with("xlt") {
                    println!("{ns}");
                }
            }
            Ok(())
        }
    }
}

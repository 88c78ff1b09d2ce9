//! Loads the tracing programs of a run on every CPU at once, before they
//! are attached one by one.
//!
//! The kernel's verifier is most of the recorder's start: 4.3 s of 4.4 s on
//! our machines, `on_net_dev_queue` alone 1.6 s, one program after another.
//! A privileged load takes no verifier-wide lock, so loads in threads verify
//! side by side, one per CPU, the largest first: the start then lasts about
//! the longest program or the sum over the CPUs, whichever is more. The
//! threads run at the recorder's priority: with extra threads at the lowest
//! one, a loaded machine (two CPU hogs on two cores) left a large program
//! in a starved thread and the start took 26-32 s.

use anyhow::Result;
use aya::programs::{BtfTracePoint, Program};
use aya::{Btf, Ebpf};
use std::collections::HashMap;
use std::sync::Mutex;

/// Loads each program of `wanted` (program, tracepoint) that is not loaded
/// yet, for the tracepoint given; `elf`: the object, whose function sizes
/// order the loads. Returns the refusals by program: the caller reports
/// them where it would have attached the program.
pub fn load_tracing(
    bpf: &mut Ebpf,
    btf: &Btf,
    elf: &[u8],
    wanted: &[(&'static str, &'static str)],
) -> HashMap<&'static str, anyhow::Error> {
    let targets: HashMap<&str, (&'static str, &'static str)> =
        wanted.iter().map(|&(p, t)| (p, (p, t))).collect();
    let mut jobs: Vec<(&'static str, &'static str, &mut Program)> = bpf
        .programs_mut()
        .filter_map(|(name, program)| {
            let &(name, target) = targets.get(name)?;
            Some((name, target, program))
        })
        .collect();
    // Largest last (taken first): a long program started late would leave
    // the other CPUs idle at the end. The size of its code stands in for
    // the verifier's time (on_net_dev_queue: the largest and the slowest).
    let sizes = code_sizes(elf);
    jobs.sort_by_key(|(name, _, _)| sizes.get(*name).copied().unwrap_or(0));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = jobs.len().min(cpus);
    let queue = Mutex::new(jobs);
    let refused = Mutex::new(HashMap::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (queue, refused) = (&queue, &refused);
            scope.spawn(move || loop {
                let Some((name, target, program)) = queue.lock().expect("queue").pop() else {
                    break;
                };
                if let Err(e) = load_one(program, target, btf) {
                    refused.lock().expect("refusals").insert(name, e);
                }
            });
        }
    });
    refused.into_inner().expect("refusals")
}

/// The size in bytes of each function of the object (its symbol's size).
fn code_sizes(elf: &[u8]) -> HashMap<String, u64> {
    use object::{Object, ObjectSymbol, SymbolKind};
    let Ok(file) = object::File::parse(elf) else {
        return HashMap::new();
    };
    file.symbols()
        .filter(|s| s.kind() == SymbolKind::Text)
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.size())))
        .collect()
}

fn load_one(program: &mut Program, target: &str, btf: &Btf) -> Result<()> {
    let program: &mut BtfTracePoint = program.try_into()?;
    if program.fd().is_err() {
        program.load(target, btf)?;
    }
    Ok(())
}

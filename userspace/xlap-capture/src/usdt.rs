//! App points: the USDT markers of the traced processes, attached as
//! uprobes at their `nop`s (aya has no USDT support: we read the notes, keep
//! one argument spec per site in a BPF map and pass its index as the BPF
//! cookie).
//!
//! Default selection: every `xlap:NAME` marker becomes `app.NAME`, with seq
//! and kind its first two arguments. `--usdt PROVIDER:NAME=POINT[,seq=argN]
//! [,kind=argM]` picks any probe of any binary the process maps.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use xlap_abi::{
    xlap_arg_kind, xlap_point, xlap_usdt_arg, xlap_usdt_spec, XLAP_USDT_MAX_SPECS, XLAP_USDT_NO_REG,
};
use xlap_exit::{failure, Code};
use xlap_usdt::{Arg, ArgLocation, Probe};

/// The longest app point name (without `app.`).
pub const MAX_POINT_NAME: usize = 64;

/// Whether `name` can be an app point: names come from the traced
/// binaries' notes (untrusted) and end up as column names, so only
/// `[A-Za-z0-9_]`, 1 to [`MAX_POINT_NAME`] bytes (a `--usdt` point, the
/// user's, may also have dots).
pub fn valid_point_name(name: &str) -> bool {
    (1..=MAX_POINT_NAME).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A `--usdt` selection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub provider: String,
    pub name: String,
    pub point: String,
    pub seq_arg: usize,
    pub kind_arg: Option<usize>,
}

impl std::str::FromStr for Selection {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage =
            || format!("--usdt wants PROVIDER:NAME=POINT[,seq=argN][,kind=argM], got {s:?}");
        let (probe, rest) = s.split_once('=').ok_or_else(usage)?;
        let (provider, name) = probe.split_once(':').ok_or_else(usage)?;
        let mut parts = rest.split(',');
        let point = parts.next().filter(|p| !p.is_empty()).ok_or_else(usage)?;
        if !valid_point_name(&point.replace('.', "_")) {
            return Err(format!(
                "--usdt point {point:?}: a point name is 1 to {MAX_POINT_NAME} letters, digits, underscores and dots"
            ));
        }
        let mut sel = Selection {
            provider: provider.to_string(),
            name: name.to_string(),
            point: point.to_string(),
            seq_arg: 0,
            kind_arg: None,
        };
        for part in parts {
            let (key, arg) = part.split_once('=').ok_or_else(usage)?;
            let n: usize = arg
                .strip_prefix("arg")
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| format!("{part:?}: arguments are named arg0, arg1, ..."))?;
            match key {
                "seq" => sel.seq_arg = n,
                "kind" => sel.kind_arg = Some(n),
                _ => return Err(usage()),
            }
        }
        Ok(sel)
    }
}

/// One probe site of one process, ready to attach.
#[derive(Clone, Debug)]
pub struct Site {
    pub pid: u32,
    /// Path through /proc/PID/root, valid in the process's mount namespace
    /// (how run.json names the binary; attached through `file`).
    pub path: PathBuf,
    /// The binary the process maps, opened and checked against its
    /// mapping: the probe is attached to this file, whatever the path
    /// names by then.
    pub file: Arc<OwnedFd>,
    /// The file as mapped (device, inode): a uprobe is attached once per
    /// process, file and offset.
    pub file_id: FileId,
    pub probe: Probe,
    pub spec_id: u32,
    pub spec: xlap_usdt_spec,
    /// Run-time address of the semaphore in the process, if gated.
    pub semaphore_addr: Option<u64>,
    /// Run-time address of the probe's nop in the process (where the binary
    /// is mapped), if known: how the in-process ring names its site.
    pub runtime_addr: Option<u64>,
}

/// A file's identity and version: its probes are read once per version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct FileVersion {
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

/// Everything USDT of a run.
#[derive(Debug, Default)]
pub struct Plan {
    /// The files planned so far per process (each once).
    planned: std::collections::HashSet<(u32, FileId)>,
    /// Probes read per file version.
    probes_by_file: BTreeMap<FileVersion, Option<(Vec<Probe>, u64)>>,
    /// The `--usdt` selections some site matched (by index).
    matched: std::collections::BTreeSet<usize>,
    pub sites: Vec<Site>,
    /// `app_names[i]` names point `XLAP_POINT_APP_BASE + i` (without `app.`).
    pub app_names: Vec<String>,
    /// Processes whose binaries have no selected marker.
    pub without_markers: Vec<(u32, String)>,
    /// Markers not attached because their name cannot be a point name
    /// (pid, binary, the name as the note has it, escaped).
    pub refused_names: Vec<(u32, String, String)>,
    /// Files read since the last `take_scanned` that have no traced
    /// marker (loaders apart: `loaders`), by kernel identity and version.
    free: Vec<KnownCode>,
    /// Dynamic loaders first seen since the last `take_scanned`.
    loaders: Vec<Loader>,
    /// Loader files seen in the run (each hooked once).
    loaders_seen: std::collections::HashSet<FileId>,
    /// Files handed out as known code (each once).
    announced: std::collections::HashSet<(u32, u64, i64, u32)>,
    /// Run-time address of the in-process ring switch (the `xlap_ring:control`
    /// note the marker crate and header write) per process and binary: each
    /// binary (executable or shared object) has its own switch.
    pub ring_controls: BTreeMap<(u32, PathBuf), u64>,
}

/// A file as the BPF side knows it (KNOWN_CODE): its identity and version.
pub type KnownCode = (xlap_abi::xlap_code_key, xlap_abi::xlap_code_version);

/// A dynamic loader a traced process maps (glibc's `ld-linux*.so*`, musl's
/// `ld-musl-*.so*`), to hook once for every process that maps it.
#[derive(Debug)]
pub struct Loader {
    pub file: Arc<OwnedFd>,
    /// As run.json and messages name it.
    pub path: PathBuf,
    /// File offset of its debugger hook `_dl_debug_state`, which it calls
    /// once objects are mapped and before any of their code runs.
    pub offset: u64,
    /// From `_dl_debug_state` to its list of objects (`_r_debug`), in
    /// memory; 0 when it has none (then each event holds).
    pub to_r_debug: i64,
    /// Its identity, known code once hooked.
    pub code: KnownCode,
}

/// The provider and name of the note that holds the ring switch's address
/// (userspace/xlap-marker/src/ring.rs).
pub const RING_CONTROL: (&str, &str) = ("xlap_ring", "control");

/// A file mapping of a process, as /proc/PID/maps has it.
struct Mapping {
    path: String,
    start: u64,
    offset: u64,
    /// The file's device (major, minor) and inode.
    dev: (u32, u32),
    inode: u64,
}

/// The readable file mappings of a process.
fn exec_mappings(pid: u32) -> Vec<Mapping> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    maps.lines()
        .filter_map(|line| {
            let mut cols = line.split_whitespace();
            let range = cols.next()?;
            let perms = cols.next()?;
            let offset = u64::from_str_radix(cols.next()?, 16).ok()?;
            let (major, minor) = cols.next()?.split_once(':')?;
            let dev = (
                u32::from_str_radix(major, 16).ok()?,
                u32::from_str_radix(minor, 16).ok()?,
            );
            let inode = cols.next()?.parse().ok()?;
            let path = cols.next()?;
            let start = u64::from_str_radix(range.split('-').next()?, 16).ok()?;
            (path.starts_with('/') && perms.contains('r')).then(|| Mapping {
                path: path.to_string(),
                start,
                offset,
                dev,
                inode,
            })
        })
        .collect()
}

/// The file a process maps at `m`, opened inside the process's root
/// (`RESOLVE_IN_ROOT`: its symlinks, absolute ones included, resolve as the
/// process sees them) and refused unless it is the very file mapped (same
/// device and inode): a process cannot point the recorder at another file
/// by renaming or linking after it mapped one.
fn open_mapped(pid: u32, m: &Mapping) -> Option<OwnedFd> {
    use std::os::unix::fs::MetadataExt;
    let root = crate::proc_root::open_root(pid).ok()?;
    let fd = crate::proc_root::open_in_root(&root, &m.path, libc::O_RDONLY).ok()?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata().ok()?;
    let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
    (meta.file_type().is_file() && meta.ino() == m.inode && dev == m.dev).then(|| file.into())
}

/// A path that names an open file of ours (for readers and the kernel's
/// uprobe attach, which take paths).
pub fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Load bias of `path` in `pid`: run-time address minus link-time address,
/// from the mapping of the file's first page (offset 0), which ELF loaders
/// place at the bias plus the first segment's page-aligned vaddr (0 for PIE
/// and shared objects, the link address otherwise).
fn load_bias(pid: u32, path: &str, first_vaddr: u64) -> Option<u64> {
    exec_mappings(pid)
        .into_iter()
        .find(|m| m.path == path && m.offset == 0)
        .map(|m| m.start.wrapping_sub(first_vaddr & !0xfff))
}

/// The lowest address a PT_LOAD segment of the file asks for (its headers
/// only are read).
fn first_load_vaddr(path: &Path) -> u64 {
    use object::read::elf::{ElfFile64, ProgramHeader};
    let Ok(file) = std::fs::File::open(path) else {
        return 0;
    };
    let cache = object::read::ReadCache::new(file);
    let Ok(elf) = ElfFile64::<object::Endianness, _>::parse(&cache) else {
        return 0;
    };
    let endian = elf.endian();
    elf.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .map(|ph| ph.p_vaddr(endian))
        .min()
        .unwrap_or(0)
}

fn arg_spec(arg: &Arg) -> xlap_usdt_arg {
    let mut a = xlap_usdt_arg {
        size: arg.size,
        is_signed: arg.signed as u8,
        idx_reg_off: XLAP_USDT_NO_REG as u16,
        scale: 1,
        ..Default::default()
    };
    match &arg.location {
        ArgLocation::Immediate(v) => {
            a.kind = xlap_arg_kind::XLAP_ARG_CONST as u8;
            a.value = *v;
        }
        ArgLocation::Register(r) => {
            a.kind = xlap_arg_kind::XLAP_ARG_REG as u8;
            a.reg_off = r.pt_regs_offset();
        }
        ArgLocation::Memory {
            base,
            index,
            offset,
        } => {
            a.kind = xlap_arg_kind::XLAP_ARG_MEM as u8;
            a.reg_off = base.pt_regs_offset();
            a.value = *offset;
            if let Some((idx, scale)) = index {
                a.idx_reg_off = idx.pt_regs_offset();
                a.scale = *scale;
            }
        }
        ArgLocation::Global { address } => {
            a.kind = xlap_arg_kind::XLAP_ARG_GLOBAL as u8;
            a.value = *address as i64;
        }
        // The note reader resolves symbols; an unresolved one cannot be read.
        ArgLocation::Symbol { .. } => a.kind = xlap_arg_kind::XLAP_ARG_NONE as u8,
    }
    a
}

/// Finds the markers of every pid and builds the specs to attach; a
/// `--usdt` selection found in none of them is a usage error.
pub fn plan(pids: &[u32], selections: &[Selection]) -> Result<Plan> {
    let mut plan = Plan::default();
    for &pid in pids {
        if plan.add_process(pid, selections)?.is_empty() {
            plan.without_markers.push((pid, crate::targets::comm(pid)));
        }
    }
    if let Some(s) = plan.unmatched(selections).first() {
        return Err(failure(
            Code::Usage,
            format!(
                "no USDT probe {}:{} in the binaries of pid {} (list a binary's probes with: readelf -n BINARY)",
                s.provider,
                s.name,
                pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    Ok(plan)
}

/// A mapped file as the kernel knows it: device (major, minor) and inode.
pub type FileId = ((u32, u32), u64);

impl Plan {
    /// The selections no site of the plan matched so far.
    pub fn unmatched<'s>(&self, selections: &'s [Selection]) -> Vec<&'s Selection> {
        selections
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.matched.contains(i))
            .map(|(_, s)| s)
            .collect()
    }

    /// Forgets what was planned for `pid`'s files (it exec'd: a new image);
    /// its sites stay listed.
    pub fn forget_files(&mut self, pid: u32) {
        self.planned.retain(|(p, _)| *p != pid);
    }

    /// Plans the markers of the files `pid` maps that were not planned for
    /// it yet (a library the loader mapped since, a new image after its
    /// exec); returns the range of `sites` added.
    pub fn add_process(
        &mut self,
        pid: u32,
        selections: &[Selection],
    ) -> Result<std::ops::Range<usize>> {
        let first = self.sites.len();
        let mut mappings = exec_mappings(pid);
        mappings.sort_by(|a, b| a.path.cmp(&b.path));
        mappings.dedup_by(|a, b| a.path == b.path);
        for mapping in mappings {
            if !self.planned.insert((pid, (mapping.dev, mapping.inode))) {
                continue;
            }
            self.add_file(pid, &mapping, selections)?;
        }
        Ok(first..self.sites.len())
    }

    /// The probes of an opened file and its first load address, read once
    /// per file version (the libc every process of a shell script maps is
    /// parsed once, not at each exec: the process waits meanwhile).
    fn probes_of(&mut self, opened: &OwnedFd) -> Option<(Vec<Probe>, u64)> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::File::from(opened.try_clone().ok()?)
            .metadata()
            .ok()?;
        let version = FileVersion {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            // ctime, which a file's owner cannot set back: a binary the
            // target rewrote is read again.
            ctime: (meta.ctime(), meta.ctime_nsec()),
            mtime: (meta.mtime(), meta.mtime_nsec()),
        };
        if let Some(known) = self.probes_by_file.get(&version) {
            return known.clone();
        }
        let read = xlap_usdt::read_probes(&fd_path(opened))
            .ok()
            .map(|probes| (probes, first_load_vaddr(&fd_path(opened))));
        self.probes_by_file.insert(version, read.clone());
        read
    }

    /// What was read since the last call: the files without a traced
    /// marker, and the loaders first seen.
    pub fn take_scanned(&mut self) -> (Vec<KnownCode>, Vec<Loader>) {
        (
            std::mem::take(&mut self.free),
            std::mem::take(&mut self.loaders),
        )
    }

    /// Reads one mapped file's markers into sites; a file that gave none
    /// (nor a ring switch) is noted as known code, a loader as one to hook.
    fn add_file(&mut self, pid: u32, mapping: &Mapping, selections: &[Selection]) -> Result<()> {
        let sites_before = self.sites.len();
        let controls_before = self.ring_controls.len();
        // Files that are not ELF, vanished or were replaced since they
        // were mapped simply have no probes (and are not known: a process
        // mapping them is held again).
        let Some(opened) = open_mapped(pid, mapping).map(Arc::new) else {
            return Ok(());
        };
        let Some(code) = known_code(mapping, &opened) else {
            return Ok(());
        };
        self.add_probes(pid, mapping, &opened, selections)?;
        let name = mapping.path.rsplit('/').next().unwrap_or("");
        if name.starts_with("ld-") && name.contains(".so") {
            // A loader without a debugger hook is never known code: each
            // process mapping it is held at its exec.
            let first = self.loaders_seen.insert((mapping.dev, mapping.inode));
            if let (true, Some((offset, to_r_debug))) = (first, loader_symbols(&opened)) {
                self.loaders.push(Loader {
                    file: opened,
                    path: PathBuf::from(format!("/proc/{pid}/root{}", mapping.path)),
                    offset,
                    to_r_debug,
                    code,
                });
            }
        } else if self.sites.len() == sites_before
            && self.ring_controls.len() == controls_before
            && self
                .announced
                .insert((code.0.dev, code.0.ino, code.1.ctime_sec, code.1.ctime_nsec))
        {
            self.free.push(code);
        }
        Ok(())
    }

    fn add_probes(
        &mut self,
        pid: u32,
        mapping: &Mapping,
        opened: &Arc<OwnedFd>,
        selections: &[Selection],
    ) -> Result<()> {
        let file = mapping.path.clone();
        let path = PathBuf::from(format!("/proc/{pid}/root{file}"));
        let Some((probes, first_vaddr)) = self.probes_of(opened) else {
            return Ok(());
        };
        let bias = load_bias(pid, &file, first_vaddr);
        for probe in probes {
            if (probe.provider.as_str(), probe.name.as_str()) == RING_CONTROL {
                if let (Some(bias), true) = (bias, probe.semaphore != 0) {
                    self.ring_controls
                        .insert((pid, path.clone()), bias.wrapping_add(probe.semaphore));
                }
                continue;
            }
            let chosen = if selections.is_empty() {
                (probe.provider == "xlap").then(|| (probe.name.clone(), 0usize, Some(1usize)))
            } else {
                selections
                    .iter()
                    .enumerate()
                    .find(|(_, s)| s.provider == probe.provider && s.name == probe.name)
                    .map(|(i, s)| {
                        self.matched.insert(i);
                        (s.point.clone(), s.seq_arg, s.kind_arg)
                    })
            };
            let Some((point, seq_arg, kind_arg)) = chosen else {
                continue;
            };
            // A --usdt point was checked as it was parsed; a note's
            // name is the binary's.
            if selections.is_empty() && !valid_point_name(&point) {
                self.refused_names
                    .push((pid, file.clone(), format!("{:?}", probe.name)));
                continue;
            }
            let Some(seq) = probe.args.get(seq_arg) else {
                return Err(failure(
                    Code::Usage,
                    format!(
                        "{}:{} in {file} has {} arguments, no arg{seq_arg} for seq",
                        probe.provider,
                        probe.name,
                        probe.args.len()
                    ),
                ));
            };
            let index = match self.app_names.iter().position(|n| *n == point) {
                Some(i) => i as u16,
                None => {
                    self.app_names.push(point.clone());
                    (self.app_names.len() - 1) as u16
                }
            };
            // Spec ids are the run's: sites planned later (a process that
            // exec'd) take the next ones.
            let spec_id = self.sites.len() as u32;
            if spec_id >= XLAP_USDT_MAX_SPECS {
                return Err(failure(
                    Code::Usage,
                    format!("more than {XLAP_USDT_MAX_SPECS} USDT probe sites selected"),
                ));
            }
            let spec = xlap_usdt_spec {
                seq: arg_spec(seq),
                kind: kind_arg
                    .and_then(|k| probe.args.get(k))
                    .map(arg_spec)
                    .unwrap_or_default(),
                probe_addr: probe.address,
                point: xlap_point::XLAP_POINT_APP_BASE as u16 + index,
                ..Default::default()
            };
            let semaphore_addr = if probe.semaphore != 0 {
                Some(
                    bias.context("cannot find where the binary is mapped to set its semaphore")?
                        .wrapping_add(probe.semaphore),
                )
            } else {
                None
            };
            self.sites.push(Site {
                pid,
                path: path.clone(),
                file: opened.clone(),
                file_id: (mapping.dev, mapping.inode),
                spec_id,
                spec,
                semaphore_addr,
                runtime_addr: bias.map(|b| b.wrapping_add(probe.address)),
                probe,
            });
        }
        Ok(())
    }
}

/// A mapped file's identity as the kernel has it (the superblock's dev_t,
/// MAJOR << 20 | MINOR, as /proc/PID/maps prints it), with its ctime.
fn known_code(mapping: &Mapping, opened: &OwnedFd) -> Option<KnownCode> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::File::from(opened.try_clone().ok()?)
        .metadata()
        .ok()?;
    let (major, minor) = mapping.dev;
    Some((
        xlap_abi::xlap_code_key {
            dev: (major << 20) | (minor & 0xf_ffff),
            ino: mapping.inode,
            ..Default::default()
        },
        xlap_abi::xlap_code_version {
            ctime_sec: meta.ctime(),
            ctime_nsec: meta.ctime_nsec() as u32,
            ..Default::default()
        },
    ))
}

/// A dynamic loader's `_dl_debug_state` (file offset), and the distance in
/// memory from it to the loader's `_r_debug` (0 if it has none); `None`
/// when the file has no `_dl_debug_state`.
fn loader_symbols(opened: &OwnedFd) -> Option<(u64, i64)> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let cache = object::read::ReadCache::new(std::fs::File::open(fd_path(opened)).ok()?);
    let elf = object::File::parse(&cache).ok()?;
    let symbol = |name: &str| {
        elf.dynamic_symbols()
            .chain(elf.symbols())
            .find(|s| s.name() == Ok(name) && s.address() != 0)
            .map(|s| s.address())
    };
    let hook = symbol("_dl_debug_state")?;
    let offset = elf.segments().find_map(|seg| {
        let (file_start, file_len) = seg.file_range();
        (hook >= seg.address() && hook < seg.address() + file_len)
            .then(|| hook - seg.address() + file_start)
    })?;
    let to_r_debug = symbol("_r_debug")
        .map(|r| r.wrapping_sub(hook) as i64)
        .unwrap_or(0);
    Some((offset, to_r_debug))
}

/// Opens a live process's memory (`/proc/PID/mem`): the handle stays
/// bound to the image the process had then, not to the pid.
pub fn open_memory(pid: u32) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .with_context(|| format!("cannot open the memory of pid {pid} to set a USDT semaphore"))
}

/// Adds `delta` to a USDT semaphore (a u16 counter) in a process's memory
/// (`open_memory`): probes gated by it fire while it is non-zero.
pub fn adjust_semaphore(mem: &std::fs::File, addr: u64, delta: i16) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 2];
    mem.read_exact_at(&mut buf, addr)
        .with_context(|| format!("cannot read a USDT semaphore at {addr:#x}"))?;
    let value = u16::from_ne_bytes(buf).wrapping_add_signed(delta);
    mem.write_all_at(&value.to_ne_bytes(), addr)
        .with_context(|| format!("cannot write a USDT semaphore at {addr:#x}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_parse_with_argument_choices() {
        let s: Selection = "myproto:pkt_out=app.tx,seq=arg2,kind=arg0".parse().unwrap();
        assert_eq!(
            s,
            Selection {
                provider: "myproto".into(),
                name: "pkt_out".into(),
                point: "app.tx".into(),
                seq_arg: 2,
                kind_arg: Some(0)
            }
        );
        let s: Selection = "p:n=x".parse().unwrap();
        assert_eq!((s.seq_arg, s.kind_arg), (0, None));
        for bad in [
            "p:n",
            "pn=x",
            "p:n=",
            "p:n=x,seq=2",
            "p:n=x,len=arg1",
            "p:n=x'y",
            "p:n=x;y",
        ] {
            assert!(bad.parse::<Selection>().is_err(), "{bad}");
        }
    }

    #[test]
    fn argument_specs_map_to_the_abi() {
        let a = arg_spec(&xlap_usdt::parse_args("-4@8(%rdi,%rsi,4)").unwrap()[0]);
        assert_eq!(a.kind, xlap_arg_kind::XLAP_ARG_MEM as u8);
        assert_eq!((a.size, a.is_signed, a.value, a.scale), (4, 1, 8, 4));
        assert_eq!(a.reg_off, xlap_usdt::Register::Rdi.pt_regs_offset());
        assert_eq!(a.idx_reg_off, xlap_usdt::Register::Rsi.pt_regs_offset());
        let c = arg_spec(&xlap_usdt::parse_args("8@$42").unwrap()[0]);
        assert_eq!((c.kind, c.value), (xlap_arg_kind::XLAP_ARG_CONST as u8, 42));
    }

    #[test]
    fn this_test_binary_maps_executable_files() {
        let maps = exec_mappings(std::process::id());
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let own = maps
            .iter()
            .find(|m| Path::new(&m.path) == exe)
            .expect("the test binary's own mapping");
        assert!(open_mapped(std::process::id(), own).is_some());
    }

    /// A path that names another file than the one mapped (replaced after
    /// mapping, as a process can do with its own files) is not opened.
    #[test]
    fn a_mapping_whose_path_now_names_another_file_is_refused() {
        let maps = exec_mappings(std::process::id());
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        let mut own = maps
            .into_iter()
            .find(|m| Path::new(&m.path) == exe)
            .expect("the test binary's own mapping");
        own.inode += 1;
        assert!(open_mapped(std::process::id(), &own).is_none());
    }
}

//! The BPF stack check of the build (`build.rs`): every program's worst
//! chain of BPF-to-BPF calls must fit the verifier's combined stack limit
//! (512 bytes, `MAX_BPF_STACK`), counted as Linux 6.1's
//! `check_max_stack_depth` counts it: each frame is the deepest
//! `r10`-relative byte the function touches, at least 1, rounded up to 32;
//! a `bpf_loop` callback (a function whose address is loaded with
//! `ld_imm64`) is a frame below its caller. Newer kernels give tracing
//! programs a private stack and accept more; Debian 12's 6.1 and Debian's
//! 6.12 do not (issue 49).
//!
//! The object is read directly (ELF64 little-endian: sections, symbols,
//! relocations) and its instructions decoded by hand (8 bytes each:
//! opcode, dst/src registers, 16-bit offset, 32-bit immediate), so the
//! build script needs no dependency.

use std::collections::BTreeMap;

/// The verifier's limit on a call chain's combined stack.
pub const LIMIT: u32 = 512;

const SHT_SYMTAB: u32 = 2;
const SHT_REL: u32 = 9;
const SHF_EXECINSTR: u64 = 4;
const STT_FUNC: u8 = 2;
const STT_SECTION: u8 = 3;
/// Relocation of a 64-bit immediate (`ld_imm64`: a map, or a function's
/// address for `bpf_loop`).
const R_BPF_64_64: u32 = 1;
/// Relocation of a call's 32-bit immediate.
const R_BPF_64_32: u32 = 10;

/// One function of the object.
#[derive(Debug, Clone)]
struct Func {
    name: String,
    section: String,
    shndx: usize,
    /// First instruction (index into its section).
    start: usize,
    /// Deepest stack byte it touches.
    depth: u32,
    callees: Vec<String>,
}

/// A program's worst call chain.
#[derive(Debug, Clone)]
pub struct Chain {
    pub section: String,
    pub program: String,
    /// Combined stack as 6.1 counts it.
    pub total: u32,
    /// `function(depth)` from the program down.
    pub frames: Vec<(String, u32)>,
}

impl Chain {
    pub fn describe(&self) -> String {
        self.frames
            .iter()
            .map(|(f, d)| format!("{f}({d})"))
            .collect::<Vec<_>>()
            .join(" -> ")
    }
}

fn u16_at(b: &[u8], o: usize) -> Result<u16, String> {
    b.get(o..o + 2)
        .map(|s| u16::from_le_bytes([s[0], s[1]]))
        .ok_or_else(|| format!("ELF truncated at {o}"))
}

fn u32_at(b: &[u8], o: usize) -> Result<u32, String> {
    b.get(o..o + 4)
        .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| format!("ELF truncated at {o}"))
}

fn u64_at(b: &[u8], o: usize) -> Result<u64, String> {
    b.get(o..o + 8)
        .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
        .ok_or_else(|| format!("ELF truncated at {o}"))
}

fn cstr(b: &[u8], o: usize) -> String {
    let s = b.get(o..).unwrap_or_default();
    let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
    String::from_utf8_lossy(&s[..end]).into_owned()
}

struct Section {
    name: String,
    kind: u32,
    flags: u64,
    offset: usize,
    size: usize,
    link: usize,
    info: usize,
}

struct Symbol {
    name: String,
    kind: u8,
    shndx: usize,
    value: u64,
}

/// A decoded instruction.
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    dst: u8,
    src: u8,
    off: i16,
    imm: i32,
}

fn insn_at(text: &[u8], i: usize) -> Insn {
    let b = &text[i * 8..i * 8 + 8];
    Insn {
        code: b[0],
        dst: b[1] & 0x0f,
        src: b[1] >> 4,
        off: i16::from_le_bytes([b[2], b[3]]),
        imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
    }
}

/// Where a call or a callback address points before names are known.
enum Target {
    /// A function symbol.
    Named(String),
    /// An instruction index in a section.
    At(usize, usize),
}

/// The worst chain of every program (functions outside `.text`) of a BPF
/// object.
pub fn chains(elf: &[u8]) -> Result<Vec<Chain>, String> {
    let obj = Object::read(elf)?;
    let mut funcs = obj.functions();
    let mut targets = Vec::with_capacity(funcs.len());
    for f in funcs.iter_mut() {
        let scan = obj.scan(f)?;
        f.depth = scan.depth;
        targets.push(scan.calls);
    }
    obj.name_callees(&mut funcs, targets)?;
    program_chains(&funcs)
}

/// Relocations by (section, instruction index): (type, symbol).
type Relocs = BTreeMap<(usize, usize), (u32, usize)>;

/// What the check reads of a BPF object: its sections, symbols and
/// relocations.
struct Object<'a> {
    elf: &'a [u8],
    sections: Vec<Section>,
    symbols: Vec<Symbol>,
    relocs: Relocs,
}

/// The section headers of `elf`, named.
fn read_sections(elf: &[u8]) -> Result<Vec<Section>, String> {
    let shoff = u64_at(elf, 0x28)? as usize;
    let shentsize = u16_at(elf, 0x3a)? as usize;
    let shnum = u16_at(elf, 0x3c)? as usize;
    let shstrndx = u16_at(elf, 0x3e)? as usize;
    let mut sections = Vec::with_capacity(shnum);
    for i in 0..shnum {
        let h = shoff + i * shentsize;
        let mut section = Section {
            name: String::new(),
            kind: u32_at(elf, h + 4)?,
            flags: u64_at(elf, h + 8)?,
            offset: u64_at(elf, h + 24)? as usize,
            size: u64_at(elf, h + 32)? as usize,
            link: u32_at(elf, h + 40)? as usize,
            info: u32_at(elf, h + 44)? as usize,
        };
        let name_off = u32_at(elf, h)? as usize;
        let strtab = shoff + shstrndx * shentsize;
        let str_off = u64_at(elf, strtab + 24)? as usize;
        section.name = cstr(elf, str_off + name_off);
        sections.push(section);
    }
    Ok(sections)
}

impl<'a> Object<'a> {
    fn read(elf: &'a [u8]) -> Result<Object<'a>, String> {
        if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
            return Err("not a 64-bit little-endian ELF object".into());
        }
        let mut obj = Object {
            elf,
            sections: read_sections(elf)?,
            symbols: Vec::new(),
            relocs: BTreeMap::new(),
        };
        obj.symbols = obj.read_symbols()?;
        obj.relocs = obj.read_relocs()?;
        Ok(obj)
    }

    fn data(&self, s: &Section) -> Result<&'a [u8], String> {
        self.elf
            .get(s.offset..s.offset + s.size)
            .ok_or_else(|| format!("section {} out of the file", s.name))
    }

    fn read_symbols(&self) -> Result<Vec<Symbol>, String> {
        let symtab = self
            .sections
            .iter()
            .find(|s| s.kind == SHT_SYMTAB)
            .ok_or("no symbol table")?;
        let strtab = self.data(&self.sections[symtab.link])?;
        self.data(symtab)?
            .chunks_exact(24)
            .map(|e| {
                Ok(Symbol {
                    name: cstr(strtab, u32_at(e, 0)? as usize),
                    kind: e[4] & 0x0f,
                    shndx: u16_at(e, 6)? as usize,
                    value: u64_at(e, 8)?,
                })
            })
            .collect()
    }

    fn read_relocs(&self) -> Result<Relocs, String> {
        let mut relocs = BTreeMap::new();
        for s in self.sections.iter().filter(|s| s.kind == SHT_REL) {
            for e in self.data(s)?.chunks_exact(16) {
                let offset = u64_at(e, 0)? as usize;
                let info = u64_at(e, 8)?;
                relocs.insert((s.info, offset / 8), (info as u32, (info >> 32) as usize));
            }
        }
        Ok(relocs)
    }

    /// Whether section `i` holds instructions.
    fn exec(&self, i: usize) -> bool {
        self.sections
            .get(i)
            .is_some_and(|s| s.flags & SHF_EXECINSTR != 0)
    }

    /// The functions of the object's code, by section and start.
    fn functions(&self) -> Vec<Func> {
        let mut funcs: Vec<Func> = self
            .symbols
            .iter()
            .filter(|s| s.kind == STT_FUNC && self.exec(s.shndx))
            .map(|s| Func {
                name: s.name.clone(),
                section: self.sections[s.shndx].name.clone(),
                shndx: s.shndx,
                start: s.value as usize / 8,
                depth: 0,
                callees: Vec::new(),
            })
            .collect();
        funcs.sort_by_key(|f| (f.shndx, f.start));
        funcs
    }

    /// Where function `f` ends: where the next one of its section begins,
    /// else at the section's `count` instructions.
    fn end_of(&self, f: &Func, count: usize) -> usize {
        self.symbols
            .iter()
            .filter(|s| s.kind == STT_FUNC && s.shndx == f.shndx && s.value as usize / 8 > f.start)
            .map(|s| s.value as usize / 8)
            .min()
            .unwrap_or(count)
    }

    /// Function `f`'s instructions: its stack depth and its calls.
    fn scan(&self, f: &Func) -> Result<Scan, String> {
        let text = self.data(&self.sections[f.shndx])?;
        let end = self.end_of(f, text.len() / 8);
        let mut scan = Scan {
            depth: 0,
            calls: Vec::new(),
            frame_regs: [None; 11],
        };
        let mut i = f.start;
        while i < end {
            let insn = insn_at(text, i);
            scan.access(insn);
            let reloc = self.relocs.get(&(f.shndx, i)).copied();
            match insn.code {
                0x85 => scan.call(self.call_target(f, i, insn, reloc)?),
                0x18 => scan.ld_imm64(self.callback_target(f, i, insn, reloc), insn),
                _ => scan.other(insn),
            }
            i += if insn.code == 0x18 { 2 } else { 1 };
        }
        Ok(scan)
    }

    /// What `call` instruction `i` of `f` calls: a function when src is
    /// BPF_PSEUDO_CALL (BPF-to-BPF), else nothing (a helper).
    fn call_target(
        &self,
        f: &Func,
        i: usize,
        insn: Insn,
        reloc: Option<(u32, usize)>,
    ) -> Result<Option<Target>, String> {
        if insn.src != 1 {
            return Ok(None);
        }
        Ok(Some(match reloc {
            Some((R_BPF_64_32, sym)) => match self.symbols.get(sym) {
                Some(s) if s.kind == STT_SECTION => {
                    Target::At(s.shndx, (insn.imm as i64 + 1) as usize)
                }
                Some(s) => Target::Named(s.name.clone()),
                None => return Err(format!("bad symbol {sym} in {}", f.name)),
            },
            _ => Target::At(f.shndx, (i as i64 + insn.imm as i64 + 1) as usize),
        }))
    }

    /// The callback whose address `ld_imm64` instruction `i` of `f` loads,
    /// when relocated against code (or pc-relative, BPF_PSEUDO_FUNC).
    fn callback_target(
        &self,
        f: &Func,
        i: usize,
        insn: Insn,
        reloc: Option<(u32, usize)>,
    ) -> Option<Target> {
        if let Some((R_BPF_64_64, sym)) = reloc {
            let s = self.symbols.get(sym).filter(|s| self.exec(s.shndx))?;
            Some(if s.kind == STT_SECTION {
                Target::At(s.shndx, (s.value as i64 + insn.imm as i64) as usize / 8)
            } else {
                Target::Named(s.name.clone())
            })
        } else if insn.src == 4 {
            // BPF_PSEUDO_FUNC without relocation: pc-relative.
            Some(Target::At(
                f.shndx,
                (i as i64 + insn.imm as i64 + 1) as usize,
            ))
        } else {
            None
        }
    }

    /// Each function's callees, named (sorted, once each), from the
    /// targets its scan found (`targets`, one list per function).
    fn name_callees(&self, funcs: &mut [Func], targets: Vec<Vec<Target>>) -> Result<(), String> {
        let by_start: BTreeMap<(usize, usize), String> = funcs
            .iter()
            .map(|f| ((f.shndx, f.start), f.name.clone()))
            .collect();
        for (f, calls) in funcs.iter_mut().zip(targets) {
            let mut names = calls
                .into_iter()
                .map(|t| match t {
                    Target::Named(n) => Ok(n),
                    Target::At(sec, at) => by_start.get(&(sec, at)).cloned().ok_or_else(|| {
                        format!(
                            "{}: a call to instruction {at} of {} is no function's start",
                            f.name, self.sections[sec].name
                        )
                    }),
                })
                .collect::<Result<Vec<_>, String>>()?;
            names.sort();
            names.dedup();
            f.callees = names;
        }
        Ok(())
    }
}

/// What one function's instructions show, read in order.
struct Scan {
    /// Deepest stack byte touched.
    depth: u32,
    /// Calls and callback addresses.
    calls: Vec<Target>,
    /// Registers holding r10 + offset.
    frame_regs: [Option<i64>; 11],
}

impl Scan {
    /// Stack byte `at` (r10-relative) touched.
    fn touch(&mut self, at: i64) {
        if at < 0 {
            self.depth = self.depth.max((-at) as u32);
        }
    }

    /// A memory access through r10 or a register holding r10 + offset.
    fn access(&mut self, insn: Insn) {
        let base = match insn.code & 0x07 {
            0x01 => Some((insn.src, insn.off)),        // LDX
            0x02 | 0x03 => Some((insn.dst, insn.off)), // ST, STX
            _ => None,
        };
        let Some((reg, off)) = base else {
            return;
        };
        let at = if reg == 10 {
            Some(off as i64)
        } else {
            self.frame_regs
                .get(reg as usize)
                .copied()
                .flatten()
                .map(|b| b + off as i64)
        };
        if let Some(at) = at {
            self.touch(at);
        }
    }

    /// A call (`target` when BPF-to-BPF): r0-r5 are clobbered by any call.
    fn call(&mut self, target: Option<Target>) {
        self.calls.extend(target);
        self.frame_regs[..6].fill(None);
    }

    /// An `ld_imm64` (`target` when it loads a callback's address).
    fn ld_imm64(&mut self, target: Option<Target>, insn: Insn) {
        self.calls.extend(target);
        self.frame_regs[insn.dst as usize & 0x0f] = None;
    }

    /// Any other instruction: a copy of r10 followed through mov64 and
    /// add64; any other ALU or load writes dst.
    fn other(&mut self, insn: Insn) {
        let (dst, src) = (insn.dst as usize, insn.src as usize);
        match insn.code {
            // mov64 dst, src
            0xbf if insn.src == 10 || self.frame_regs[src].is_some() => {
                self.frame_regs[dst] = if insn.src == 10 {
                    Some(0)
                } else {
                    self.frame_regs[src]
                };
            }
            // add64 dst, imm on a frame pointer copy
            0x07 if self.frame_regs[dst].is_some() => {
                let at = self.frame_regs[dst].unwrap_or(0) + insn.imm as i64;
                self.frame_regs[dst] = Some(at);
                self.touch(at);
            }
            _ => {
                if matches!(insn.code & 0x07, 0x00 | 0x01 | 0x04 | 0x07) && dst < 11 {
                    self.frame_regs[dst] = None;
                }
            }
        }
    }
}

/// The worst chain of each program (each function outside `.text`).
fn program_chains(funcs: &[Func]) -> Result<Vec<Chain>, String> {
    let index: BTreeMap<String, usize> = funcs
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.clone(), i))
        .collect();
    let mut memo: BTreeMap<usize, Worst> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, f) in funcs.iter().enumerate() {
        if f.section == ".text" {
            continue;
        }
        let (total, frames) = worst(funcs, &index, i, &mut memo, &mut Vec::new())?;
        out.push(Chain {
            section: f.section.clone(),
            program: f.name.clone(),
            total,
            frames,
        });
    }
    Ok(out)
}

/// A function's deepest chain: its bytes (frames rounded up) and the frames
/// (name, the function's own stack depth), the function first.
type Worst = (u32, Vec<(String, u32)>);

fn worst(
    funcs: &[Func],
    index: &BTreeMap<String, usize>,
    i: usize,
    memo: &mut BTreeMap<usize, Worst>,
    path: &mut Vec<usize>,
) -> Result<Worst, String> {
    if let Some(m) = memo.get(&i) {
        return Ok(m.clone());
    }
    if path.contains(&i) {
        return Err(format!("recursion through {}", funcs[i].name));
    }
    path.push(i);
    let own = funcs[i].depth.max(1).div_ceil(32) * 32;
    let mut best = (0, Vec::new());
    for c in &funcs[i].callees {
        let j = *index
            .get(c)
            .ok_or_else(|| format!("{} calls {c}, which is not in the object", funcs[i].name))?;
        let sub = worst(funcs, index, j, memo, path)?;
        if sub.0 > best.0 {
            best = sub;
        }
    }
    path.pop();
    let mut frames = vec![(funcs[i].name.clone(), funcs[i].depth)];
    frames.extend(best.1);
    let result = (own + best.0, frames);
    memo.insert(i, result.clone());
    Ok(result)
}

/// The table written to OUT_DIR: one line per program.
pub fn table(chains: &[Chain]) -> String {
    let mut s = format!(
        "# combined BPF stack per program (frames rounded to 32 as Linux 6.1 counts; limit {LIMIT})\n# section program bytes chain\n"
    );
    for c in chains {
        s.push_str(&format!(
            "{:<34} {:<28} {:>4}  {}\n",
            c.section,
            c.program,
            c.total,
            c.describe()
        ));
    }
    s
}

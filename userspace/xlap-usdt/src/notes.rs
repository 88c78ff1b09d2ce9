//! `.note.stapsdt` parsing and address → file offset mapping.

use crate::{parse_args, Arg, UsdtError};
use object::elf::{PF_X, PT_LOAD};
use object::read::elf::{ElfFile64, ProgramHeader};
use object::read::{ReadCache, ReadRef};
use object::{Endian, Endianness, Object, ObjectSection, ObjectSymbol};
use std::path::Path;

/// One USDT probe site of an ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub provider: String,
    pub name: String,
    /// Virtual address of the probe's `nop` (after `.stapsdt.base` adjustment).
    pub address: u64,
    /// File offset of the `nop`: what a uprobe attaches to.
    pub file_offset: u64,
    /// Virtual address of the semaphore, 0 when the probe has none.
    pub semaphore: u64,
    /// File offset of the semaphore (the uprobe's `ref_ctr_offset`), 0 if none.
    pub semaphore_offset: u64,
    /// The raw argument spec, e.g. `-8@%rax -8@8(%rsp)`.
    pub args_spec: String,
    pub args: Vec<Arg>,
}

const NOTE_TYPE_STAPSDT: u32 = 3;

/// Every USDT probe in the ELF file at `path` (empty when it has none).
/// Only the parts of the file the notes need are read (headers, section
/// table, the notes, the symbols an argument names), not the whole file:
/// a process whose new image is read waits meanwhile (an interpreter's
/// 7 MB binary).
pub fn read_probes(path: &Path) -> Result<Vec<Probe>, UsdtError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| UsdtError::Io {
        path: shown.clone(),
        source,
    })?;
    let cache = ReadCache::new(file);
    parse_elf(&cache, &shown)
}

/// Every USDT probe in `data`, the bytes of an ELF file (untrusted: any
/// bytes give probes or an error); `path` only names the file in errors.
pub fn parse_probes(data: &[u8], path: &str) -> Result<Vec<Probe>, UsdtError> {
    parse_elf(data, path)
}

/// The loadable segments of an ELF file: (address, size in memory, file
/// offset, executable).
struct LoadSegments(Vec<(u64, u64, u64, bool)>);

impl LoadSegments {
    fn of<'data, R: ReadRef<'data>>(elf: &ElfFile64<'data, Endianness, R>) -> LoadSegments {
        let endian = elf.endian();
        LoadSegments(
            elf.elf_program_headers()
                .iter()
                .filter(|ph| ph.p_type(endian) == PT_LOAD)
                .map(|ph| {
                    (
                        ph.p_vaddr(endian),
                        ph.p_memsz(endian),
                        ph.p_offset(endian),
                        ph.p_flags(endian) & PF_X != 0,
                    )
                })
                .collect(),
        )
    }

    /// The file offset of address `addr` (in an executable segment when
    /// `executable`). Checked arithmetic: the headers are untrusted, and a
    /// segment whose end or file offset overflows u64 panicked here (found
    /// by fuzzing); such a segment maps nothing.
    fn offset(&self, addr: u64, executable: bool) -> Option<u64> {
        self.0
            .iter()
            .filter(|(_, _, _, x)| !executable || *x)
            .find_map(|&(vaddr, memsz, offset, _)| {
                let into = addr.checked_sub(vaddr).filter(|into| *into < memsz)?;
                into.checked_add(offset)
            })
    }
}

/// The address of symbol `name` (static or dynamic), if the file defines
/// it.
fn symbol_address<'data, R: ReadRef<'data>>(
    elf: &ElfFile64<'data, Endianness, R>,
    name: &str,
) -> Option<u64> {
    elf.symbols()
        .chain(elf.dynamic_symbols())
        .find(|s| s.name() == Ok(name))
        .map(|s| s.address())
}

/// `parse_probes` of an ELF file in memory or read on demand.
fn parse_elf<'data, R: ReadRef<'data>>(data: R, path: &str) -> Result<Vec<Probe>, UsdtError> {
    let shown = path.to_string();
    let elf = ElfFile64::<Endianness, R>::parse(data).map_err(|source| UsdtError::Elf {
        path: shown.clone(),
        source,
    })?;
    let endian = elf.endian();
    let Some(notes) = elf.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    let base_addr = elf.section_by_name(".stapsdt.base").map(|s| s.address());
    let note_err = |what: String| UsdtError::Note {
        path: shown.clone(),
        what,
    };
    let bytes = notes
        .data()
        .map_err(|e| note_err(format!("unreadable section: {e}")))?;
    let segments = LoadSegments::of(&elf);
    let to_offset = |addr: u64, executable: bool| segments.offset(addr, executable);

    let little = endian.is_little_endian();
    let word = |b: &[u8]| -> u64 {
        let b: [u8; 8] = b.try_into().expect("8 bytes");
        if little {
            u64::from_le_bytes(b)
        } else {
            u64::from_be_bytes(b)
        }
    };
    let mut probes = Vec::new();
    let mut pos = 0usize;
    while pos + 12 <= bytes.len() {
        let u32_at = |p: usize| {
            let b: [u8; 4] = bytes[p..p + 4].try_into().expect("4 bytes");
            if little {
                u32::from_le_bytes(b)
            } else {
                u32::from_be_bytes(b)
            }
        };
        let namesz = u32_at(pos) as usize;
        let descsz = u32_at(pos + 4) as usize;
        let ntype = u32_at(pos + 8);
        let name_start = pos + 12;
        let desc_start = name_start + namesz.next_multiple_of(4);
        let next = desc_start + descsz.next_multiple_of(4);
        if next > bytes.len() || desc_start > bytes.len() {
            return Err(note_err(format!(
                "note at byte {pos} runs past the section"
            )));
        }
        let owner = &bytes[name_start..name_start + namesz];
        if ntype == NOTE_TYPE_STAPSDT && owner.strip_suffix(&[0]) == Some(b"stapsdt") {
            let desc = &bytes[desc_start..desc_start + descsz];
            if desc.len() < 24 {
                return Err(note_err(format!(
                    "note at byte {pos} has a {}-byte descriptor",
                    desc.len()
                )));
            }
            let (pc, note_base, semaphore) =
                (word(&desc[0..8]), word(&desc[8..16]), word(&desc[16..24]));
            let mut strings = desc[24..].split(|b| *b == 0);
            let mut next_str = |what: &str| -> Result<String, UsdtError> {
                strings
                    .next()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .ok_or_else(|| note_err(format!("note at byte {pos} lacks its {what}")))
            };
            let provider = next_str("provider")?;
            let name = next_str("name")?;
            let args_spec = next_str("argument spec")?;
            // Prelink moved the file: shift by how far .stapsdt.base moved.
            let delta = base_addr.map_or(0, |b| b.wrapping_sub(note_base));
            let address = pc.wrapping_add(delta);
            let semaphore = if semaphore == 0 {
                0
            } else {
                semaphore.wrapping_add(delta)
            };
            let file_offset = to_offset(address, true).ok_or_else(|| {
                note_err(format!(
                    "probe {provider}:{name} at {address:#x} lies in no executable segment"
                ))
            })?;
            let semaphore_offset = if semaphore == 0 {
                0
            } else {
                to_offset(semaphore, false).ok_or_else(|| {
                    note_err(format!(
                        "semaphore of {provider}:{name} at {semaphore:#x} lies in no segment"
                    ))
                })?
            };
            let mut args = parse_args(&args_spec)?;
            for arg in &mut args {
                if let crate::ArgLocation::Symbol { name, addend } = &arg.location {
                    let address = symbol_address(&elf, name).ok_or_else(|| note_err(format!("{provider}:{name} argument names symbol {name:?}, which the file does not define")))?;
                    arg.location = crate::ArgLocation::Global {
                        address: address.wrapping_add(*addend as u64),
                    };
                }
            }
            probes.push(Probe {
                provider,
                name,
                address,
                file_offset,
                semaphore,
                semaphore_offset,
                args_spec,
                args,
            });
        }
        pos = next;
    }
    Ok(probes)
}

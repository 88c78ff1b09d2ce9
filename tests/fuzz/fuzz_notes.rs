//! Fuzz target: the `.note.stapsdt` reader (`parse_probes`, which
//! `read_probes` calls with a file's bytes).
//!
//! Inputs: ELF files built here around arbitrary note-section bytes, around
//! valid notes (with foreign notes between them, a prelink shift, either
//! byte order), the same with edits to the section or to the whole file,
//! and arbitrary bytes as the whole file. Properties: no panic and no hang
//! (each case runs under a time limit); valid notes give exactly the probes
//! they were written from; every probe returned satisfies the reader's
//! contract, checked against the file independently (its strings lie in the
//! section, its address in an executable load segment at the file offset it
//! reports, its semaphore in a load segment, its arguments are its spec's).
//! `PROPTEST_CASES` sets the number of cases (`just fuzz` runs many).

use crate::fuzz_grammar::{apply, config, edge_u64, edit, spec};
use object::elf::{PF_X, PT_LOAD};
use object::read::elf::{ElfFile64, ProgramHeader};
use object::Endianness;
use proptest::prelude::*;
use xlap_usdt::{parse_args, parse_probes, ArgLocation, Probe};

/// Where the built file is loaded: text (the whole file) and data.
const TEXT: u64 = 0x40_0000;
const TEXT_SIZE: u64 = 0x1_0000;
const DATA: u64 = 0x80_0000;
const DATA_SIZE: u64 = 0x1000;
/// The globals the built file defines (name, address).
const SYMBOLS: &[(&str, u64)] = &[("g_seq", DATA + 0x10), ("tbl", DATA + 0x100)];
/// `.stapsdt.base` sits right after the ELF and program headers.
const BASE_OFFSET: u64 = 64 + 2 * 56;
const BASE: u64 = TEXT + BASE_OFFSET;
/// The smallest note the reader can take a probe from: a 12-byte header,
/// "stapsdt\0", three words and three NUL-terminated strings, padded.
const MIN_PROBE_NOTE: usize = 12 + 8 + 28;

/// A minimal x86-64 ELF file: a text segment over the whole file (and
/// beyond, to TEXT_SIZE), a bss-like data segment, `.stapsdt.base`,
/// `.note.stapsdt` holding `notes`, a symbol table with SYMBOLS.
fn elf(notes: &[u8], big_endian: bool) -> Vec<u8> {
    let mut f = Vec::new();
    let u16_ = |f: &mut Vec<u8>, v: u16| {
        f.extend(if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    };
    let u32_ = |f: &mut Vec<u8>, v: u32| {
        f.extend(if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    };
    let u64_ = |f: &mut Vec<u8>, v: u64| {
        f.extend(if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        })
    };
    let align = |f: &mut Vec<u8>| f.resize(f.len().next_multiple_of(8), 0);

    // Section contents first (the headers need their offsets).
    let mut body = vec![0u8; 8]; // .stapsdt.base
    let notes_off = BASE_OFFSET + body.len() as u64;
    body.extend_from_slice(notes);
    body.resize(body.len().next_multiple_of(8), 0);
    let symtab_off = BASE_OFFSET + body.len() as u64;
    let strtab = b"\0g_seq\0tbl\0";
    {
        let mut syms = vec![0u8; 24]; // the null symbol
        for (name_off, (_, addr)) in [1u32, 7].into_iter().zip(SYMBOLS) {
            u32_(&mut syms, name_off);
            syms.push(0x11); // STB_GLOBAL, STT_OBJECT
            syms.push(0);
            u16_(&mut syms, 0xfff1); // SHN_ABS
            u64_(&mut syms, *addr);
            u64_(&mut syms, 8);
        }
        body.extend(syms);
    }
    let strtab_off = BASE_OFFSET + body.len() as u64;
    body.extend_from_slice(strtab);
    let shstrtab_off = BASE_OFFSET + body.len() as u64;
    let shstrtab = b"\0.note.stapsdt\0.stapsdt.base\0.symtab\0.strtab\0.shstrtab\0";
    body.extend_from_slice(shstrtab);
    body.resize(body.len().next_multiple_of(8), 0);
    let shoff = BASE_OFFSET + body.len() as u64;
    let file_len = shoff + 6 * 64;

    // ELF header.
    f.extend_from_slice(&[
        0x7f,
        b'E',
        b'L',
        b'F',
        2,
        if big_endian { 2 } else { 1 },
        1,
        0,
    ]);
    f.resize(16, 0);
    u16_(&mut f, 2); // ET_EXEC
    u16_(&mut f, 62); // EM_X86_64
    u32_(&mut f, 1);
    u64_(&mut f, TEXT);
    u64_(&mut f, 64); // e_phoff
    u64_(&mut f, shoff);
    u32_(&mut f, 0);
    u16_(&mut f, 64);
    u16_(&mut f, 56);
    u16_(&mut f, 2);
    u16_(&mut f, 64);
    u16_(&mut f, 6);
    u16_(&mut f, 5); // .shstrtab
                     // Program headers: text (R+X) and data (R+W).
    for (flags, vaddr, filesz, memsz) in [
        (5u32, TEXT, file_len, TEXT_SIZE.max(file_len)),
        (6, DATA, 0, DATA_SIZE),
    ] {
        u32_(&mut f, PT_LOAD);
        u32_(&mut f, flags);
        u64_(&mut f, 0); // p_offset
        u64_(&mut f, vaddr);
        u64_(&mut f, vaddr);
        u64_(&mut f, filesz);
        u64_(&mut f, memsz);
        u64_(&mut f, 0x1000);
    }
    assert_eq!(f.len() as u64, BASE_OFFSET);
    f.extend(body);
    align(&mut f);
    // Section headers: (name, type, flags, addr, offset, size, link, entsize).
    type SectionHeader = (u32, u32, u64, u64, u64, u64, u32, u64);
    let sections: [SectionHeader; 6] = [
        (0, 0, 0, 0, 0, 0, 0, 0),
        (1, 7, 0, 0, notes_off, notes.len() as u64, 0, 0), // SHT_NOTE
        (15, 1, 2, BASE, BASE_OFFSET, 8, 0, 0),            // SHT_PROGBITS, alloc
        (29, 2, 0, 0, symtab_off, 72, 4, 24),              // SHT_SYMTAB -> .strtab
        (37, 3, 0, 0, strtab_off, strtab.len() as u64, 0, 0),
        (45, 3, 0, 0, shstrtab_off, shstrtab.len() as u64, 0, 0),
    ];
    for (name, ty, flags, addr, offset, size, link, entsize) in sections {
        u32_(&mut f, name);
        u32_(&mut f, ty);
        u64_(&mut f, flags);
        u64_(&mut f, addr);
        u64_(&mut f, offset);
        u64_(&mut f, size);
        u32_(&mut f, link);
        u32_(&mut f, if ty == 2 { 1 } else { 0 }); // symtab: first global
        u64_(&mut f, 8);
        u64_(&mut f, entsize);
    }
    assert_eq!(f.len() as u64, file_len);
    f
}

/// One ELF note (header, owner, descriptor, each padded to 4 bytes).
fn note(owner: &[u8], ntype: u32, desc: &[u8], big_endian: bool) -> Vec<u8> {
    let w = |v: u32| {
        if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mut n = Vec::new();
    n.extend(w(owner.len() as u32));
    n.extend(w(desc.len() as u32));
    n.extend(w(ntype));
    n.extend_from_slice(owner);
    n.resize(n.len().next_multiple_of(4), 0);
    n.extend_from_slice(desc);
    n.resize(n.len().next_multiple_of(4), 0);
    n
}

/// A probe to write into a note, and the probe the reader must give back.
#[derive(Clone, Debug)]
struct Planned {
    provider: Vec<u8>,
    name: Vec<u8>,
    spec: String,
    /// Offset of the probe in the text segment, and of its semaphore in the
    /// data segment (none: 0 in the note).
    text_offset: u64,
    semaphore: Option<u64>,
    want_args: Vec<xlap_usdt::Arg>,
}

fn resolve_symbol(name: &str, addend: i64) -> ArgLocation {
    let (_, addr) = SYMBOLS.iter().find(|(n, _)| *n == name).unwrap();
    ArgLocation::Global {
        address: addr.wrapping_add(addend as u64),
    }
}

fn planned() -> impl Strategy<Value = Planned> {
    let defined = prop::sample::select(
        SYMBOLS
            .iter()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>(),
    );
    (
        prop::collection::vec(1u8..=255, 0..12),
        prop::collection::vec(1u8..=255, 0..12),
        spec(defined.boxed(), resolve_symbol),
        0..TEXT_SIZE,
        prop::option::of(0..DATA_SIZE),
    )
        .prop_map(
            |(provider, name, (spec, want_args), text_offset, semaphore)| Planned {
                provider,
                name,
                spec,
                text_offset,
                semaphore,
                want_args,
            },
        )
}

/// A note that is not a probe (owner, type, descriptor).
type Foreign = (Vec<u8>, u32, Vec<u8>);
/// A probe, after a foreign note or not.
type Item = (Planned, Option<Foreign>);

/// A note that is not a probe: another owner, or stapsdt's with another type.
fn foreign() -> impl Strategy<Value = Foreign> {
    (
        prop_oneof![
            Just(b"GNU\0".to_vec()),
            Just(b"stapsdt\0".to_vec()),
            Just(b"stapsdt".to_vec()),
            Just(Vec::new())
        ],
        prop_oneof![Just(3u32), Just(1), any::<u32>()],
        prop::collection::vec(any::<u8>(), 0..40),
    )
        .prop_filter("a probe note", |(owner, ty, _)| {
            !(owner == b"stapsdt\0" && *ty == 3)
        })
}

/// Valid notes (probes and foreign notes in any order) with the prelink
/// shift `delta` (the note's addresses are `delta` below the file's), and
/// the probes they hold.
fn valid_notes(items: &[Item], delta: u64, big_endian: bool) -> (Vec<u8>, Vec<Probe>) {
    let word = |v: u64| {
        if big_endian {
            v.to_be_bytes()
        } else {
            v.to_le_bytes()
        }
    };
    let mut bytes = Vec::new();
    let mut want = Vec::new();
    for (p, foreign) in items {
        if let Some((owner, ty, desc)) = foreign {
            bytes.extend(note(owner, *ty, desc, big_endian));
        }
        let address = TEXT + p.text_offset;
        let semaphore = p.semaphore.map_or(0, |o| DATA + o);
        let noted_semaphore = if semaphore == 0 {
            0
        } else {
            semaphore.wrapping_sub(delta)
        };
        let mut desc = Vec::new();
        desc.extend(word(address.wrapping_sub(delta)));
        desc.extend(word(BASE.wrapping_sub(delta)));
        desc.extend(word(noted_semaphore));
        for s in [&p.provider[..], &p.name[..], p.spec.as_bytes()] {
            desc.extend_from_slice(s);
            desc.push(0);
        }
        bytes.extend(note(b"stapsdt\0", 3, &desc, big_endian));
        // A semaphore whose shifted address is 0 reads as none.
        let semaphore = if noted_semaphore == 0 { 0 } else { semaphore };
        want.push(Probe {
            provider: String::from_utf8_lossy(&p.provider).into_owned(),
            name: String::from_utf8_lossy(&p.name).into_owned(),
            address,
            file_offset: p.text_offset,
            semaphore,
            semaphore_offset: if semaphore == 0 { 0 } else { semaphore - DATA },
            args_spec: p.spec.clone(),
            args: p.want_args.clone(),
        });
    }
    (bytes, want)
}

fn items() -> impl Strategy<Value = Vec<Item>> {
    prop::collection::vec((planned(), prop::option::of(foreign())), 0..5)
}

fn delta() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), edge_u64()]
}

/// The load segments of `data` as (vaddr, memsz, offset, executable), read
/// here with `object` directly (not through the reader).
fn load_segments(data: &[u8]) -> Vec<(u64, u64, u64, bool)> {
    let elf = ElfFile64::<Endianness>::parse(data).expect("the reader parsed it");
    let e = elf.endian();
    elf.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(e) == PT_LOAD)
        .map(|ph| {
            (
                ph.p_vaddr(e),
                ph.p_memsz(e),
                ph.p_offset(e),
                ph.p_flags(e) & PF_X != 0,
            )
        })
        .collect()
}

/// Whether some load segment (an executable one when asked) maps `addr` to
/// file offset `offset`.
fn mapped(segments: &[(u64, u64, u64, bool)], addr: u64, offset: u64, executable: bool) -> bool {
    segments.iter().any(|&(vaddr, memsz, seg_offset, x)| {
        (x || !executable)
            && addr
                .checked_sub(vaddr)
                .is_some_and(|into| into < memsz && into.checked_add(seg_offset) == Some(offset))
    })
}

/// The reader's contract for whatever it returned from `data`.
fn check(
    data: &[u8],
    result: &Result<Vec<Probe>, xlap_usdt::UsdtError>,
) -> Result<(), TestCaseError> {
    let Ok(probes) = result else {
        return Ok(());
    };
    if probes.is_empty() {
        return Ok(());
    }
    prop_assert!(
        probes.len() * MIN_PROBE_NOTE <= data.len(),
        "{} probes from {} bytes",
        probes.len(),
        data.len()
    );
    let segments = load_segments(data);
    for p in probes {
        for s in [&p.provider, &p.name, &p.args_spec] {
            prop_assert!(!s.contains('\0'), "{p:?}");
            // Replacement characters aside, a string is bytes of the section.
            prop_assert!(s.len() <= 3 * data.len(), "{p:?}");
        }
        prop_assert!(
            mapped(&segments, p.address, p.file_offset, true),
            "{p:?} in {segments:?}"
        );
        if p.semaphore == 0 {
            prop_assert_eq!(p.semaphore_offset, 0, "{:?}", p);
        } else {
            prop_assert!(
                mapped(&segments, p.semaphore, p.semaphore_offset, false),
                "{p:?} in {segments:?}"
            );
        }
        // The arguments are the spec's, with rip-relative symbols resolved.
        let spec_args = parse_args(&p.args_spec);
        prop_assert!(spec_args.is_ok(), "{p:?}");
        let spec_args = spec_args.unwrap();
        prop_assert_eq!(spec_args.len(), p.args.len());
        for (from_spec, arg) in spec_args.iter().zip(&p.args) {
            prop_assert_eq!((from_spec.size, from_spec.signed), (arg.size, arg.signed));
            match (&from_spec.location, &arg.location) {
                (ArgLocation::Symbol { .. }, ArgLocation::Global { .. }) => {}
                (a, b) => prop_assert_eq!(a, b),
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn valid_notes_give_the_probes_they_hold(items in items(), delta in delta(), big_endian in any::<bool>()) {
        let (notes, want) = valid_notes(&items, delta, big_endian);
        let file = elf(&notes, big_endian);
        let got = parse_probes(&file, "built.elf");
        check(&file, &got)?;
        prop_assert_eq!(got.unwrap(), want);
    }

    #[test]
    fn arbitrary_note_sections_are_read_or_refused(notes in prop::collection::vec(any::<u8>(), 0..512), big_endian in any::<bool>()) {
        let file = elf(&notes, big_endian);
        check(&file, &parse_probes(&file, "fuzz.elf"))?;
    }

    #[test]
    fn edited_note_sections_are_read_or_refused(
        items in items(),
        delta in delta(),
        big_endian in any::<bool>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let (notes, _) = valid_notes(&items, delta, big_endian);
        let file = elf(&apply(notes, &edits), big_endian);
        check(&file, &parse_probes(&file, "fuzz.elf"))?;
    }

    #[test]
    fn edited_elf_files_are_read_or_refused(
        items in items(),
        delta in delta(),
        big_endian in any::<bool>(),
        edits in prop::collection::vec(edit(), 1..6),
    ) {
        let (notes, _) = valid_notes(&items, delta, big_endian);
        let file = apply(elf(&notes, big_endian), &edits);
        check(&file, &parse_probes(&file, "fuzz.elf"))?;
    }

    /// The headers' fields (segments, section table) set to edge values:
    /// where address arithmetic overflows.
    #[test]
    fn edge_values_in_the_headers_are_read_or_refused(
        items in items(),
        big_endian in any::<bool>(),
        fields in prop::collection::vec((0usize..(BASE_OFFSET as usize / 8), edge_u64()), 1..4),
    ) {
        let (notes, _) = valid_notes(&items, 0, big_endian);
        let mut file = elf(&notes, big_endian);
        for (slot, v) in fields {
            let v = if big_endian { v.to_be_bytes() } else { v.to_le_bytes() };
            file[slot * 8..slot * 8 + 8].copy_from_slice(&v);
        }
        check(&file, &parse_probes(&file, "fuzz.elf"))?;
    }

    #[test]
    fn arbitrary_files_are_read_or_refused(data in prop::collection::vec(any::<u8>(), 0..1024)) {
        check(&data, &parse_probes(&data, "fuzz.elf"))?;
    }
}

/// Inputs the targets above found, kept as plain tests.
#[test]
fn fuzz_regressions() {
    let probe = Planned {
        provider: b"p".to_vec(),
        name: b"n".to_vec(),
        spec: String::new(),
        text_offset: 9,
        semaphore: Some(8),
        want_args: Vec::new(),
    };
    let (notes, _) = valid_notes(&[(probe, None)], 0, false);
    let patched = |at: usize, value: u64| {
        let mut file = elf(&notes, false);
        file[at..at + 8].copy_from_slice(&value.to_le_bytes());
        parse_probes(&file, "x.elf")
    };
    // Segments whose file offset (p_offset) or end (p_vaddr + p_memsz)
    // overflows u64: the address arithmetic panicked ("attempt to add with
    // overflow"). The text segment's p_offset is at byte 72, its p_memsz at
    // 104; the data segment's at 128 and 160. An offset that overflows maps
    // nothing; a segment that runs to the end of the address space maps
    // what it covers.
    let e = patched(72, u64::MAX - 8).unwrap_err().to_string();
    assert!(
        e.contains("p:n at 0x400009 lies in no executable segment"),
        "{e}"
    );
    assert_eq!(patched(104, u64::MAX).unwrap()[0].file_offset, 9);
    let e = patched(128, u64::MAX - 4).unwrap_err().to_string();
    assert!(
        e.contains("semaphore of p:n at 0x800008 lies in no segment"),
        "{e}"
    );
    assert_eq!(patched(160, u64::MAX).unwrap()[0].semaphore_offset, 8);
}

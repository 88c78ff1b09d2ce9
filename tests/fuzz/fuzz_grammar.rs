//! Shared by the USDT fuzz targets (fuzz_notes, fuzz_args): the argument-spec
//! grammar as generators of (spec text, the argument it means), byte/char
//! mutations, and the proptest settings.

use proptest::prelude::*;
use proptest::test_runner::Config;
use xlap_usdt::{Arg, ArgLocation, Register};

/// Settings of a fuzz target: `cases` unless `PROPTEST_CASES` says otherwise
/// (`just fuzz` runs long), a fixed seed unless `PROPTEST_RNG_SEED` gives
/// one (the normal test run is deterministic), and every case in a forked
/// child with a time limit, so a parser that loops forever fails as a
/// timeout with its input instead of hanging the suite. A failure prints
/// its shrunk input; it is kept as a plain #[test], not in a
/// proptest-regressions file.
pub fn config(cases: u32) -> Config {
    crate::config(cases, 0x5EED_1A90, 10_000)
}

/// Every register name the assembler writes, with the 64-bit register the
/// decoder must map it to.
pub const REGISTERS: &[(&str, Register)] = {
    use Register::*;
    &[
        ("rax", Rax),
        ("eax", Rax),
        ("ax", Rax),
        ("al", Rax),
        ("ah", Rax),
        ("rbx", Rbx),
        ("ebx", Rbx),
        ("bx", Rbx),
        ("bl", Rbx),
        ("bh", Rbx),
        ("rcx", Rcx),
        ("ecx", Rcx),
        ("cx", Rcx),
        ("cl", Rcx),
        ("ch", Rcx),
        ("rdx", Rdx),
        ("edx", Rdx),
        ("dx", Rdx),
        ("dl", Rdx),
        ("dh", Rdx),
        ("rsi", Rsi),
        ("esi", Rsi),
        ("si", Rsi),
        ("sil", Rsi),
        ("rdi", Rdi),
        ("edi", Rdi),
        ("di", Rdi),
        ("dil", Rdi),
        ("rbp", Rbp),
        ("ebp", Rbp),
        ("bp", Rbp),
        ("bpl", Rbp),
        ("rsp", Rsp),
        ("esp", Rsp),
        ("sp", Rsp),
        ("spl", Rsp),
        ("rip", Rip),
        ("r8", R8),
        ("r8d", R8),
        ("r8w", R8),
        ("r8b", R8),
        ("r9", R9),
        ("r9d", R9),
        ("r9w", R9),
        ("r9b", R9),
        ("r10", R10),
        ("r10d", R10),
        ("r10w", R10),
        ("r10b", R10),
        ("r11", R11),
        ("r11d", R11),
        ("r11w", R11),
        ("r11b", R11),
        ("r12", R12),
        ("r12d", R12),
        ("r12w", R12),
        ("r12b", R12),
        ("r13", R13),
        ("r13d", R13),
        ("r13w", R13),
        ("r13b", R13),
        ("r14", R14),
        ("r14d", R14),
        ("r14w", R14),
        ("r14b", R14),
        ("r15", R15),
        ("r15d", R15),
        ("r15w", R15),
        ("r15b", R15),
    ]
};

pub fn known_register(name: &str) -> Option<Register> {
    REGISTERS.iter().find(|(n, _)| *n == name).map(|(_, r)| *r)
}

/// A register: its `%name` and what it means.
pub fn register() -> impl Strategy<Value = (String, Register)> {
    prop::sample::select(REGISTERS).prop_map(|(n, r)| (format!("%{n}"), r))
}

/// An i64 with its edges likely.
pub fn int() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => any::<i64>(),
        3 => -4096i64..4096,
        1 => prop::sample::select(vec![0, 1, -1, i64::MAX, i64::MIN, i64::MIN + 1, i32::MAX as i64, i32::MIN as i64]),
    ]
}

/// How the assembler may write `v`: decimal or `0x` hex (either case), a
/// leading `-` for negatives.
pub fn int_text(v: i64) -> impl Strategy<Value = String> {
    let sign = if v < 0 { "-" } else { "" };
    let m = v.unsigned_abs();
    prop_oneof![
        Just(format!("{sign}{m}")),
        Just(format!("{sign}0x{m:x}")),
        Just(format!("{sign}0x{m:X}")),
    ]
}

/// A symbol name as compilers emit them (`counter.0` for a static local).
pub fn symbol_name() -> impl Strategy<Value = String> {
    "[A-Za-z_][A-Za-z0-9_.]{0,10}"
}

/// One argument in the x86-64 grammar, its text and the argument it means.
/// Symbols are drawn from `symbols` (the note target needs defined ones);
/// `resolve` maps a symbol and its addend to the location the decoder
/// should give (`Symbol` itself for the bare spec parser).
pub fn arg(
    symbols: BoxedStrategy<String>,
    resolve: fn(&str, i64) -> ArgLocation,
) -> impl Strategy<Value = (String, Arg)> {
    let size = (prop::sample::select(vec![1u8, 2, 4, 8]), any::<bool>());
    let operand = prop_oneof![
        register().prop_map(|(t, r)| (t, ArgLocation::Register(r))),
        int().prop_flat_map(
            |v| int_text(v).prop_map(move |t| (format!("${t}"), ArgLocation::Immediate(v)))
        ),
        (
            prop::option::of(int()),
            register(),
            prop::option::of((
                register(),
                prop::option::of(prop::sample::select(vec![1u8, 2, 4, 8]))
            )),
        )
            .prop_flat_map(|(off, (bt, base), index)| {
                let off_text = match off {
                    Some(v) => int_text(v).boxed(),
                    None => Just(String::new()).boxed(),
                };
                off_text.prop_map(move |ot| {
                    let (it, index) = match &index {
                        None => (String::new(), None),
                        Some(((it, r), None)) => (format!(",{it}"), Some((*r, 1))),
                        Some(((it, r), Some(s))) => (format!(",{it},{s}"), Some((*r, *s))),
                    };
                    (
                        format!("{ot}({bt}{it})"),
                        ArgLocation::Memory {
                            base,
                            index,
                            offset: off.unwrap_or(0),
                        },
                    )
                })
            }),
        (symbols, prop::option::of(int())).prop_flat_map(move |(name, addend)| {
            let addend_text = match addend {
                None => Just(String::new()).boxed(),
                Some(a) if a < 0 => int_text(a).boxed(),
                Some(a) => int_text(a).prop_map(|t| format!("+{t}")).boxed(),
            };
            addend_text.prop_map(move |at| {
                (
                    format!("{name}{at}(%rip)"),
                    resolve(&name, addend.unwrap_or(0)),
                )
            })
        }),
    ];
    (size, operand).prop_map(|((size, signed), (text, location))| {
        (
            format!("{}{size}@{text}", if signed { "-" } else { "" }),
            Arg {
                size,
                signed,
                location,
            },
        )
    })
}

/// A whole spec: arguments separated by runs of blanks (leading and
/// trailing ones too).
pub fn spec(
    symbols: BoxedStrategy<String>,
    resolve: fn(&str, i64) -> ArgLocation,
) -> impl Strategy<Value = (String, Vec<Arg>)> {
    let blank = "[ \t]{1,3}";
    (
        prop::collection::vec((arg(symbols, resolve), blank), 0..6),
        "[ \t]{0,2}",
    )
        .prop_map(|(args, lead)| {
            let mut text = lead;
            let mut want = Vec::new();
            for (i, ((t, a), sep)) in args.into_iter().enumerate() {
                if i > 0 {
                    text.push_str(&sep);
                }
                text.push_str(&t);
                want.push(a);
            }
            (text, want)
        })
}

/// An edit of a byte string: what a fuzzer does to a valid input.
#[derive(Clone, Debug)]
pub enum Edit {
    /// Overwrite one byte.
    Byte(prop::sample::Index, u8),
    /// Overwrite a little-endian u32/u64 (field-sized) with a value near an
    /// edge: lengths, offsets and addresses that overflow.
    Word(prop::sample::Index, u64, usize),
    Insert(prop::sample::Index, Vec<u8>),
    Remove(prop::sample::Index, usize),
    Truncate(prop::sample::Index),
}

pub fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        prop::sample::select(vec![
            0,
            1,
            3,
            4,
            7,
            8,
            0x7f,
            0x80,
            0xff,
            0xffff,
            0x7fff_ffff,
            0x8000_0000,
            0xffff_fff0,
            0xffff_fffc,
            0xffff_ffff,
            0x1_0000_0000,
            i64::MAX as u64,
            1 << 63,
            u64::MAX - 8,
            u64::MAX,
        ]),
        any::<u64>(),
    ]
}

pub fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        3 => (any::<prop::sample::Index>(), edge_u64(), prop::sample::select(vec![4usize, 8]))
            .prop_map(|(i, v, w)| Edit::Word(i, v, w)),
        1 => (any::<prop::sample::Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => (any::<prop::sample::Index>(), 1usize..32).prop_map(|(i, n)| Edit::Remove(i, n)),
        1 => any::<prop::sample::Index>().prop_map(Edit::Truncate),
    ]
}

/// `data` with `edits` applied in turn (each lands inside the current bytes).
pub fn apply(mut data: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        if data.is_empty() {
            break;
        }
        match e {
            Edit::Byte(i, b) => {
                let i = i.index(data.len());
                data[i] = *b;
            }
            Edit::Word(i, v, w) => {
                let i = i.index(data.len());
                let end = (i + w).min(data.len());
                data[i..end].copy_from_slice(&v.to_le_bytes()[..end - i]);
            }
            Edit::Insert(i, b) => {
                let i = i.index(data.len() + 1);
                data.splice(i..i, b.iter().copied());
            }
            Edit::Remove(i, n) => {
                let i = i.index(data.len());
                let end = (i + n).min(data.len());
                data.drain(i..end);
            }
            Edit::Truncate(i) => {
                let n = i.index(data.len());
                data.truncate(n);
            }
        }
    }
    data
}

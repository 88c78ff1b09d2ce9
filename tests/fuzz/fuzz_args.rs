//! Fuzz target: the x86-64 USDT argument-spec decoder (`parse_args`).
//!
//! Properties: it never panics (nor hangs: each case runs under a time limit)
//! on any string; what it accepts is well formed (one argument per token,
//! sizes 1/2/4/8 with the sign from a leading `-`, scales 1/2/4/8); a spec
//! written from the grammar decodes to the arguments it was written from;
//! register names and integers are accepted exactly when the assembler's
//! syntax allows them, with the value they mean. `PROPTEST_CASES` sets the
//! number of cases (`just fuzz` runs many).

use crate::fuzz_grammar::{self, config, known_register, spec, symbol_name};
use proptest::prelude::*;
use xlap_usdt::{parse_args, Arg, ArgLocation};

fn as_symbol(name: &str, addend: i64) -> ArgLocation {
    ArgLocation::Symbol {
        name: name.to_string(),
        addend,
    }
}

/// What any accepted spec must satisfy, whatever its text.
fn check_accepted(text: &str, args: &[Arg]) -> Result<(), TestCaseError> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    prop_assert_eq!(args.len(), tokens.len(), "one argument per token");
    for (arg, token) in args.iter().zip(&tokens) {
        prop_assert!([1, 2, 4, 8].contains(&arg.size), "{token}: {arg:?}");
        prop_assert_eq!(arg.signed, token.starts_with('-'), "{}: {:?}", token, arg);
        match &arg.location {
            ArgLocation::Memory {
                index: Some((_, scale)),
                ..
            } => prop_assert!([1, 2, 4, 8].contains(scale), "{token}: {arg:?}"),
            ArgLocation::Symbol { name, .. } => {
                prop_assert!(!name.is_empty(), "{token}: {arg:?}");
                prop_assert!(token.ends_with("(%rip)"), "{token}: {arg:?}");
            }
            ArgLocation::Global { .. } => {
                prop_assert!(false, "{token}: only the note reader resolves globals")
            }
            _ => {}
        }
    }
    Ok(())
}

/// The assembler's integers: an optional `-`, then decimal digits or `0x`
/// and hex digits; the value, when it fits an i64 (computed here without
/// the decoder).
fn reference_int(text: &str) -> Option<i64> {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    let (radix, digits) = match digits.strip_prefix("0x") {
        Some(h) => (16, h),
        None => (10, digits),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let mut v: i128 = 0;
    for c in digits.chars() {
        v = v * radix as i128 + c.to_digit(radix).unwrap() as i128;
        if v > 1 << 64 {
            return None;
        }
    }
    i64::try_from(if neg { -v } else { v }).ok()
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn any_string_is_decoded_or_refused(text in any::<String>()) {
        if let Ok(args) = parse_args(&text) {
            check_accepted(&text, &args)?;
        }
    }

    /// Printable ASCII near the grammar's alphabet hits deeper paths than
    /// arbitrary Unicode.
    #[test]
    fn spec_like_strings_are_decoded_or_refused(text in "[-+@%$(),:0-9a-fxrsipl \t]{0,40}") {
        if let Ok(args) = parse_args(&text) {
            check_accepted(&text, &args)?;
        }
    }

    #[test]
    fn a_spec_from_the_grammar_decodes_to_what_it_says(
        (text, want) in spec(symbol_name().boxed(), as_symbol)
    ) {
        let got = parse_args(&text);
        prop_assert!(got.is_ok(), "{:?}: {:?}", text, got);
        prop_assert_eq!(got.unwrap(), want, "{:?}", text);
    }

    #[test]
    fn edited_specs_are_decoded_or_refused(
        (text, _) in spec(symbol_name().boxed(), as_symbol),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<char>()), 1..4),
    ) {
        let mut chars: Vec<char> = text.chars().collect();
        for (i, c) in edits {
            if chars.is_empty() {
                chars.push(c);
            } else {
                let i = i.index(chars.len());
                chars[i] = c;
            }
        }
        let text: String = chars.into_iter().collect();
        if let Ok(args) = parse_args(&text) {
            check_accepted(&text, &args)?;
        }
    }

    #[test]
    fn register_names_are_known_or_refused(
        name in prop_oneof![
            prop::sample::select(fuzz_grammar::REGISTERS).prop_map(|(n, _)| n.to_string()),
            "r[-+0-9]{1,3}[dwbl]{0,2}",
            "[a-z0-9+]{0,5}",
        ],
        size in prop::sample::select(vec!["1", "-2", "4", "-8"]),
    ) {
        let known = known_register(&name);
        let as_register = parse_args(&format!("{size}@%{name}"));
        let as_base = parse_args(&format!("{size}@8(%{name})"));
        let as_index = parse_args(&format!("{size}@8(%rax,%{name},4)"));
        match known {
            Some(r) => {
                prop_assert_eq!(&as_register.unwrap()[0].location, &ArgLocation::Register(r));
                let base_ok = matches!(as_base.as_deref(), Ok([Arg { location: ArgLocation::Memory { base, .. }, .. }]) if *base == r);
                prop_assert!(base_ok, "8(%{}): {:?}", name, as_base);
                let index_ok = matches!(as_index.as_deref(), Ok([Arg { location: ArgLocation::Memory { index: Some((i, 4)), .. }, .. }]) if *i == r);
                prop_assert!(index_ok, "(%rax,%{},4): {:?}", name, as_index);
            }
            None => {
                prop_assert!(as_register.is_err(), "%{}: {:?}", name, as_register);
                prop_assert!(as_base.is_err(), "%{}: {:?}", name, as_base);
                prop_assert!(as_index.is_err(), "%{}: {:?}", name, as_index);
            }
        }
    }

    #[test]
    fn integers_are_read_as_the_assembler_writes_them(
        text in prop_oneof![
            "-?(0x)?[0-9a-fA-F]{0,18}",
            "[-+0-9a-fx]{0,22}",
            fuzz_grammar::int().prop_flat_map(fuzz_grammar::int_text),
            // Signs where the grammar has none (`--5`, `-0x-5`), edges likely.
            ("[-+]{0,2}", "(0x[-+]?)?", fuzz_grammar::int())
                .prop_map(|(sign, hex, v)| if hex.is_empty() {
                    format!("{sign}{}", v.unsigned_abs())
                } else {
                    format!("{sign}{hex}{:x}", v.unsigned_abs())
                }),
        ]
    ) {
        let want = reference_int(&text);
        let imm = parse_args(&format!("8@${text}"));
        match want {
            Some(v) => prop_assert_eq!(imm.unwrap(), vec![Arg { size: 8, signed: false, location: ArgLocation::Immediate(v) }]),
            None => prop_assert!(imm.is_err(), "${}: {:?}", text, imm),
        }
        // The same integer as a memory offset (empty text means 0 there).
        if !text.is_empty() {
            let mem = parse_args(&format!("-4@{text}(%rbp)"));
            match want {
                Some(v) => {
                    let ok = matches!(mem.as_deref(), Ok([Arg { location: ArgLocation::Memory { offset, .. }, .. }]) if *offset == v);
                    prop_assert!(ok, "{}(%rbp): {:?}", text, mem);
                }
                // Not a number: read as a symbol, which needs %rip.
                None => prop_assert!(mem.is_err(), "{}(%rbp): {:?}", text, mem),
            }
        }
    }
}

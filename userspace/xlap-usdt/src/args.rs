//! x86-64 USDT argument specs (`[-]SIZE@OPERAND`, AT&T syntax).
//!
//! Operands: `%reg` (register), `$imm` (constant), `OFF(%base)` and
//! `OFF(%base,%index,SCALE)` (memory). Sub-registers (`%eax`, `%di`, `%r8d`)
//! name their 64-bit register; the size says how many bytes to keep.

use crate::UsdtError;

/// A general-purpose x86-64 register, by its 64-bit name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Register {
    Rax,
    Rbx,
    Rcx,
    Rdx,
    Rsi,
    Rdi,
    Rbp,
    Rsp,
    R8,
    R9,
    R10,
    R11,
    R12,
    R13,
    R14,
    R15,
    Rip,
}

impl Register {
    /// Byte offset of the register in the kernel's x86-64 `struct pt_regs`,
    /// which is what a uprobe program reads.
    pub fn pt_regs_offset(self) -> u16 {
        use Register::*;
        match self {
            R15 => 0,
            R14 => 8,
            R13 => 16,
            R12 => 24,
            Rbp => 32,
            Rbx => 40,
            R11 => 48,
            R10 => 56,
            R9 => 64,
            R8 => 72,
            Rax => 80,
            Rcx => 88,
            Rdx => 96,
            Rsi => 104,
            Rdi => 112,
            Rip => 128,
            Rsp => 152,
        }
    }

    fn parse(name: &str) -> Option<Register> {
        use Register::*;
        let name = name.strip_prefix('%')?;
        Some(match name {
            "rax" | "eax" | "ax" | "al" | "ah" => Rax,
            "rbx" | "ebx" | "bx" | "bl" | "bh" => Rbx,
            "rcx" | "ecx" | "cx" | "cl" | "ch" => Rcx,
            "rdx" | "edx" | "dx" | "dl" | "dh" => Rdx,
            "rsi" | "esi" | "si" | "sil" => Rsi,
            "rdi" | "edi" | "di" | "dil" => Rdi,
            "rbp" | "ebp" | "bp" | "bpl" => Rbp,
            "rsp" | "esp" | "sp" | "spl" => Rsp,
            "rip" => Rip,
            _ => {
                // r8..r15 with at most one d/w/b suffix. The number is
                // matched as text: parsing it took `%r+8`, `%r08` and
                // `%r8dd` for r8 (found by fuzzing).
                let number = name.strip_prefix('r')?;
                let number = number.strip_suffix(['d', 'w', 'b']).unwrap_or(number);
                match number {
                    "8" => R8,
                    "9" => R9,
                    "10" => R10,
                    "11" => R11,
                    "12" => R12,
                    "13" => R13,
                    "14" => R14,
                    "15" => R15,
                    _ => return None,
                }
            }
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgLocation {
    /// The value is in a register.
    Register(Register),
    /// The value is a constant.
    Immediate(i64),
    /// The value is in memory at `base + index * scale + offset`.
    Memory {
        base: Register,
        index: Option<(Register, u8)>,
        offset: i64,
    },
    /// A rip-relative global as the spec names it (`sym+8(%rip)`); the note
    /// reader resolves it to [`ArgLocation::Global`].
    Symbol { name: String, addend: i64 },
    /// The value is in memory at this link-time virtual address (a global);
    /// at run time it sits at the address plus the module's load bias.
    Global { address: u64 },
}

/// One decoded argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// Bytes of the value: 1, 2, 4 or 8.
    pub size: u8,
    pub signed: bool,
    pub location: ArgLocation,
}

/// Parses a whole spec string such as `-8@%rax 4@-12(%rbp)`.
pub fn parse_args(spec: &str) -> Result<Vec<Arg>, UsdtError> {
    spec.split_whitespace().map(parse_arg).collect()
}

fn parse_arg(spec: &str) -> Result<Arg, UsdtError> {
    let err = |what: &str| UsdtError::Arg {
        spec: spec.to_string(),
        what: what.to_string(),
    };
    let (size, operand) = spec.split_once('@').ok_or_else(|| err("no SIZE@ prefix"))?;
    let size: i32 = size.parse().map_err(|_| err("size is not a number"))?;
    let signed = size < 0;
    let size = size.unsigned_abs();
    if ![1, 2, 4, 8].contains(&size) {
        return Err(err("size must be 1, 2, 4 or 8"));
    }
    let location = if let Some(imm) = operand.strip_prefix('$') {
        ArgLocation::Immediate(parse_int(imm).ok_or_else(|| err("bad immediate"))?)
    } else if operand.starts_with('%') {
        ArgLocation::Register(Register::parse(operand).ok_or_else(|| err("unknown register"))?)
    } else if let Some((off, inner)) = operand.split_once('(') {
        let inner = inner
            .strip_suffix(')')
            .ok_or_else(|| err("unclosed memory operand"))?;
        let numeric = off.is_empty() || parse_int(off).is_some();
        if !numeric {
            // `sym`, `sym+8` or `sym-8`, relative to %rip: a global.
            if inner.trim() != "%rip" {
                return Err(err("a symbolic offset needs %rip as base"));
            }
            let split = off.rfind(['+', '-']).filter(|&i| i > 0);
            let (name, addend) = match split {
                Some(i) => (
                    &off[..i],
                    parse_int(off[i..].trim_start_matches('+'))
                        .ok_or_else(|| err("bad symbol addend"))?,
                ),
                None => (off, 0),
            };
            return Ok(Arg {
                size: size as u8,
                signed,
                location: ArgLocation::Symbol {
                    name: name.to_string(),
                    addend,
                },
            });
        }
        let offset = if off.is_empty() {
            0
        } else {
            parse_int(off).ok_or_else(|| err("bad memory offset"))?
        };
        let mut parts = inner.split(',');
        let base = Register::parse(parts.next().unwrap_or_default().trim())
            .ok_or_else(|| err("unknown base register"))?;
        let index = match parts.next() {
            None => None,
            Some(idx) => {
                let idx =
                    Register::parse(idx.trim()).ok_or_else(|| err("unknown index register"))?;
                let scale = match parts.next() {
                    None => 1,
                    Some(s) => s.trim().parse().map_err(|_| err("bad scale"))?,
                };
                if ![1, 2, 4, 8].contains(&scale) {
                    return Err(err("scale must be 1, 2, 4 or 8"));
                }
                Some((idx, scale))
            }
        };
        if parts.next().is_some() {
            return Err(err("too many parts in memory operand"));
        }
        ArgLocation::Memory {
            base,
            index,
            offset,
        }
    } else {
        return Err(err("unsupported operand (segment-relative or symbolic)"));
    };
    Ok(Arg {
        size: size as u8,
        signed,
        location,
    })
}

/// An integer as the assembler writes it: an optional `-`, then decimal
/// digits or `0x` and hex digits; i64::MIN included. Only digits may follow
/// the sign: `str::parse` and `from_str_radix` take a sign of their own, so
/// `--5` and `0x-5` were accepted and `$--9223372036854775808` negated
/// i64::MIN (an overflow panic in debug builds); and the magnitude is read
/// unsigned, so `-9223372036854775808` is no longer refused (all found by
/// fuzzing).
fn parse_int(s: &str) -> Option<i64> {
    let (neg, digits) = match s.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, s),
    };
    let (radix, digits) = match digits.strip_prefix("0x") {
        Some(hex) => (16, hex),
        None => (10, digits),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = u64::from_str_radix(digits, radix).ok()?;
    if neg {
        0i64.checked_sub_unsigned(magnitude)
    } else {
        i64::try_from(magnitude).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ArgLocation::{Immediate, Memory, Symbol};
    use Register::{Rax, Rbp, Rdx, Rip, Rsp, R12, R9};

    #[test]
    fn registers_immediates_and_memory_operands() {
        let args = parse_args("-8@%rax 4@$-5 -4@-12(%rbp) 8@8(%rsp,%rdx,8) 1@(%r12) 2@%r9w 8@0x10(%rip) -8@g_seq(%rip) 1@tbl+16(%rip)").unwrap();
        assert_eq!(
            args,
            vec![
                Arg {
                    size: 8,
                    signed: true,
                    location: ArgLocation::Register(Rax)
                },
                Arg {
                    size: 4,
                    signed: false,
                    location: Immediate(-5)
                },
                Arg {
                    size: 4,
                    signed: true,
                    location: Memory {
                        base: Rbp,
                        index: None,
                        offset: -12
                    }
                },
                Arg {
                    size: 8,
                    signed: false,
                    location: Memory {
                        base: Rsp,
                        index: Some((Rdx, 8)),
                        offset: 8
                    }
                },
                Arg {
                    size: 1,
                    signed: false,
                    location: Memory {
                        base: R12,
                        index: None,
                        offset: 0
                    }
                },
                Arg {
                    size: 2,
                    signed: false,
                    location: ArgLocation::Register(R9)
                },
                Arg {
                    size: 8,
                    signed: false,
                    location: Memory {
                        base: Rip,
                        index: None,
                        offset: 16
                    }
                },
                Arg {
                    size: 8,
                    signed: true,
                    location: Symbol {
                        name: "g_seq".into(),
                        addend: 0
                    }
                },
                Arg {
                    size: 1,
                    signed: false,
                    location: Symbol {
                        name: "tbl".into(),
                        addend: 16
                    }
                },
            ]
        );
    }

    #[test]
    fn malformed_specs_are_rejected_with_the_spec_named() {
        for bad in [
            "8%rax",
            "3@%rax",
            "8@%xyz",
            "8@4(%rax",
            "8@%fs:0x28",
            "8@4(%rax,%rbx,3)",
            "8@sym(%rax)",
        ] {
            let e = parse_args(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{e}");
        }
    }

    /// Inputs the fuzz target (tests/fuzz/fuzz_args.rs) found.
    #[test]
    fn fuzz_regressions() {
        // Negating i64::MIN overflowed (a panic in debug builds).
        assert!(parse_args("8@$--9223372036854775808").is_err());
        assert!(parse_args("8@$-0x-8000000000000000").is_err());
        // A second sign was taken.
        for bad in ["8@$--5", "8@$0x-5", "8@$+5", "8@$0x+5", "8@--8(%rbp)"] {
            assert!(parse_args(bad).is_err(), "{bad}");
        }
        // i64::MIN, as the assembler writes it, was refused.
        for min in ["8@$-9223372036854775808", "8@$-0x8000000000000000"] {
            assert_eq!(
                parse_args(min).unwrap()[0].location,
                Immediate(i64::MIN),
                "{min}"
            );
        }
        assert!(parse_args("8@$9223372036854775808").is_err());
        // Register numbers were parsed as integers.
        for bad in [
            "1@%r+8",
            "1@%r08",
            "1@%r8dd",
            "8@8(%r+9)",
            "8@(%rax,%r010,2)",
        ] {
            assert!(parse_args(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_args("1@%r15b").unwrap()[0].location,
            ArgLocation::Register(Register::R15)
        );
    }

    #[test]
    fn empty_spec_has_no_arguments() {
        assert!(parse_args("").unwrap().is_empty());
    }
}

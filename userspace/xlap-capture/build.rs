//! Builds the BPF objects of `bpf/` with clang (CO-RE, BTF) and leaves them
//! in OUT_DIR for `include_bytes_aligned!`. `vmlinux.h` is generated from the
//! build machine's kernel BTF with bpftool; CO-RE relocations make the object
//! run on other kernels too.

use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "build_stack.rs"]
mod stack;

const OBJECTS: &[&str] = &["capture", "calibrate"];

fn main() {
    // Read when the script runs, not with env!(): a build script compiled
    // in another checkout sharing this target directory (CI's cache) would
    // otherwise compile that checkout's BPF sources.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let bpf_dir = PathBuf::from(manifest).join("../../bpf");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    // Relative to the package root: several checkouts can share one target
    // directory (artifacts of path packages are named alike), and an
    // absolute path would let a fresh checkout reuse another's objects.
    println!("cargo:rerun-if-changed=../../bpf");
    // The BPF side reads syscall arguments by x86-64's syscall numbers and
    // pt_regs (__TARGET_ARCH_x86), and the USDT argument decoder knows
    // x86-64's registers only: another target would build and trace wrong.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if arch != "x86_64" {
        fail(&format!(
            "xlap-trace supports x86-64 only (syscall numbers, registers of USDT arguments); this build targets {arch}"
        ));
    }

    let vmlinux = out.join("vmlinux.h");
    let btf = Path::new("/sys/kernel/btf/vmlinux");
    if !btf.exists() {
        fail("this kernel has no BTF (/sys/kernel/btf/vmlinux): xlap-trace needs CONFIG_DEBUG_INFO_BTF=y to build and run");
    }
    let dump = Command::new("bpftool")
        .args(["btf", "dump", "file"])
        .arg(btf)
        .args(["format", "c"])
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "cannot run bpftool ({e}): install it with ./run.sh setup"
            ))
        });
    if !dump.status.success() {
        fail(&format!(
            "bpftool btf dump failed: {}",
            String::from_utf8_lossy(&dump.stderr)
        ));
    }
    std::fs::write(&vmlinux, dump.stdout).expect("write vmlinux.h");

    let multiarch = Command::new("gcc")
        .arg("-dumpmachine")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "x86_64-linux-gnu".to_string());

    for name in OBJECTS {
        let src = bpf_dir.join(format!("{name}.bpf.c"));
        let obj = out.join(format!("{name}.bpf.o"));
        let status = Command::new("clang")
            .args([
                "-O2",
                "-g",
                "-target",
                "bpf",
                "-D__TARGET_ARCH_x86",
                "-Wall",
                "-Werror",
            ])
            .arg(format!("-I{}", out.display()))
            .arg(format!("-I{}", bpf_dir.display()))
            .arg(format!("-I/usr/include/{multiarch}"))
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status()
            .unwrap_or_else(|e| {
                fail(&format!(
                    "cannot run clang ({e}): install it with ./run.sh setup"
                ))
            });
        if !status.success() {
            fail(&format!("clang failed on {}", src.display()));
        }
        check_stack(name, &obj, &out);
    }
    check_hooks_stand_alone(&bpf_dir, &out, &multiarch);
}

/// Each `bpf/hooks/*.h` includes only `bpf/lib/*` and compiles on its own
/// (nothing it uses comes from another hook, or from the order in which
/// `capture.bpf.c` includes them): a hook is its C file and its entry of
/// the hook table, and nothing else.
fn check_hooks_stand_alone(bpf_dir: &Path, out: &Path, multiarch: &str) {
    let hooks = bpf_dir.join("hooks");
    let mut names: Vec<String> = std::fs::read_dir(&hooks)
        .expect("read bpf/hooks")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".h"))
        .collect();
    names.sort();
    for name in names {
        let text = std::fs::read_to_string(hooks.join(&name)).expect("read a hook");
        let foreign: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("#include \"") && !l.starts_with("#include \"lib/"))
            .collect();
        if !foreign.is_empty() {
            fail(&format!(
                "bpf/hooks/{name} includes {}: a hook includes only bpf/lib/*.h (move what hooks share into bpf/lib)",
                foreign.join(", ")
            ));
        }
        let unit = out.join(format!("alone-{name}.c"));
        std::fs::write(
            &unit,
            format!("#include \"hooks/{name}\"\nchar LICENSE[] SEC(\"license\") = \"GPL\";\n"),
        )
        .expect("write a hook's test unit");
        let result = Command::new("clang")
            .args([
                "-fsyntax-only",
                "-O2",
                "-target",
                "bpf",
                "-D__TARGET_ARCH_x86",
            ])
            .args(["-Wall", "-Werror", "-Wno-unused-function"])
            .arg(format!("-I{}", out.display()))
            .arg(format!("-I{}", bpf_dir.display()))
            .arg(format!("-I/usr/include/{multiarch}"))
            .arg(&unit)
            .output()
            .unwrap_or_else(|e| fail(&format!("cannot run clang ({e})")));
        if !result.status.success() {
            fail(&format!(
                "bpf/hooks/{name} does not compile on its own (it uses what another hook defines; move that into bpf/lib):\n{}",
                String::from_utf8_lossy(&result.stderr)
            ));
        }
    }
}

/// Every program's worst BPF-to-BPF call chain must fit the verifier's
/// combined stack limit of older kernels (`build_stack.rs`); the numbers
/// go to OUT_DIR/NAME.stack.txt (`capture::STACK_TABLE`).
fn check_stack(name: &str, obj: &Path, out: &Path) {
    let bytes = std::fs::read(obj).expect("read the BPF object just built");
    let chains = stack::chains(&bytes)
        .unwrap_or_else(|e| fail(&format!("stack check of {}: {e}", obj.display())));
    let table = out.join(format!("{name}.stack.txt"));
    std::fs::write(&table, stack::table(&chains)).expect("write the stack table");
    let over: Vec<String> = chains
        .iter()
        .filter(|c| c.total > stack::LIMIT)
        .map(|c| {
            format!(
                "{} ({}): {} bytes: {}",
                c.program,
                c.section,
                c.total,
                c.describe()
            )
        })
        .collect();
    if !over.is_empty() {
        fail(&format!(
            "{name}.bpf.o: the combined stack of a BPF-to-BPF call chain exceeds {} bytes, which Linux 6.1 and 6.12 refuse (frames rounded to 32; move large locals to the per-CPU ROOMS map, bpf/lib/packet.h):\n  {}",
            stack::LIMIT,
            over.join("\n  ")
        ));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: {msg}");
    panic!("{msg}");
}

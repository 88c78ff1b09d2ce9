//! Unprivileged: the example binaries' USDT notes, and the C marker header.

use std::collections::BTreeSet;
use std::path::Path;
use xlap_tests::{bin, Scratch};
use xlap_usdt::{read_probes, Arg, ArgLocation};

/// The markers the example protocol documents (prrt_lite::MARKER_NAMES), in
/// X-LAP's order: sender first, then receiver.
const MARKERS: &[&str] = &[
    "send_start",
    "encode_start",
    "encode_end",
    "submit",
    "link_transmit_start",
    "link_transmit_end",
    "link_receive",
    "handle_start",
    "handle_end",
    "decode_start",
    "decode_end",
    "feedback_send",
    "deliver",
];

fn check_two_eight_byte_args(args: &[Arg], what: &str) {
    assert_eq!(args.len(), 2, "{what}: (seq, kind)");
    for a in args {
        assert_eq!(a.size, 8, "{what}: 8-byte arguments");
        assert!(a.signed, "{what}: declared as i64");
        assert!(
            !matches!(a.location, ArgLocation::Immediate(_)) || what.contains("const"),
            "{what}: {a:?}"
        );
    }
}

#[test]
fn the_example_binary_has_every_documented_marker_with_seq_and_kind() {
    let probes = read_probes(&bin("xlap-example")).expect("read notes");
    for name in MARKERS {
        let sites: Vec<_> = probes
            .iter()
            .filter(|p| p.provider == "xlap" && p.name == *name)
            .collect();
        assert!(!sites.is_empty(), "marker xlap:{name} missing");
        for p in sites {
            check_two_eight_byte_args(&p.args, name);
            assert_eq!(
                p.semaphore, 0,
                "{name}: markers need no semaphore (a nop when untraced)"
            );
            assert!(
                p.file_offset > 0
                    && p.file_offset < std::fs::metadata(bin("xlap-example")).unwrap().len()
            );
        }
    }
    assert!(
        probes.iter().all(
            |p| (p.provider == "xlap" && MARKERS.contains(&p.name.as_str()))
                || (p.provider == "xlap_ring" && p.name == "control")
        ),
        "only documented markers"
    );
    // The ring switch: one address for the whole binary, in a writable
    // place (the tracer writes it), given as the note's semaphore.
    let controls: BTreeSet<u64> = probes
        .iter()
        .filter(|p| p.provider == "xlap_ring")
        .map(|p| p.semaphore)
        .collect();
    assert_eq!(controls.len(), 1, "{controls:?}");
    assert!(controls.iter().all(|&a| a != 0));
    let probes: Vec<_> = probes
        .into_iter()
        .filter(|p| p.provider == "xlap")
        .collect();
    let mut names: Vec<&str> = probes.iter().map(|p| p.name.as_str()).collect();
    names.sort();
    names.dedup();
    insta::assert_snapshot!("example_markers", names.join("\n"));
}

#[test]
fn the_plain_example_binary_has_no_markers() {
    assert!(read_probes(&bin("xlap-example-plain")).unwrap().is_empty());
}

/// The 5-byte nop the markers emit (`nopl 0x0(%rax,%rax,1)`): a uprobe on
/// it needs no single-stepping, and Linux 6.18 turns it into a call to the
/// process's uprobe trampoline after the first hit.
const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

/// The instruction bytes at every probe of `path`, by probe name.
fn probe_sites(path: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    read_probes(path)
        .unwrap()
        .into_iter()
        .map(|p| {
            let at = p.file_offset as usize;
            (p.name, bytes[at..at + 5].to_vec())
        })
        .collect()
}

#[test]
fn the_probe_nop_is_where_the_note_says() {
    // At each file offset of the example's markers: the 5-byte nop.
    let sites = probe_sites(&bin("xlap-example"));
    assert!(!sites.is_empty());
    for (name, code) in sites {
        assert_eq!(code, NOP5, "xlap:{name}");
    }
}

#[test]
fn the_c_marker_header_emits_the_same_notes() {
    let _guard = xlap_tests::unprivileged();
    let header_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/markers/c");
    let scratch = Scratch::new("cmarker");
    let src = scratch.path("marker_demo.c");
    std::fs::write(
        &src,
        "#include \"xlap_markers.h\"\n\
         volatile unsigned seqs[4] = {1, 2, 3, 4};\n\
         long long g_seq = 7; unsigned char g_kind = 2;\n\
         struct pkt { long kind; long seqs[4]; } g_pkt;\n\
         __attribute__((noinline)) void indexed(struct pkt *p, long i) {\n\
           DTRACE_PROBE2(xlap, indexed_args, p->seqs[i], p->kind);\n\
         }\n\
         int main(void) {\n\
           indexed(&g_pkt, 1);\n\
           for (int i = 0; i < 4; i++) {\n\
             XLAP_MARK(send_start, seqs[i], XLAP_KIND_DATA);\n\
             XLAP_MARK(deliver, seqs[i] * 2, i);\n\
             g_seq += i;\n\
             /* uncast globals: the compiler may pass them as memory operands */\n\
             DTRACE_PROBE2(xlap, mem_args, g_seq, g_kind);\n\
           }\n\
           return 0;\n\
         }\n",
    )
    .unwrap();
    for opt in ["-O0", "-O2"] {
        let exe = scratch.path(&format!("marker_demo{opt}"));
        let status = std::process::Command::new("cc")
            .arg(opt)
            .arg("-I")
            .arg(&header_dir)
            .arg(&src)
            .arg("-o")
            .arg(&exe)
            .status()
            .expect("cc runs (install build-essential and systemtap-sdt-dev: ./run.sh setup)");
        assert!(
            status.success(),
            "cc {opt} failed: is systemtap-sdt-dev installed?"
        );
        // XLAP_MARK sites, and sdt.h probes written after the header, are
        // the 5-byte nop; the note points at its first byte.
        for (name, code) in probe_sites(&exe) {
            assert_eq!(code, NOP5, "{opt}: xlap:{name}");
        }
        let probes = read_probes(&exe).unwrap();
        let names: Vec<&str> = probes.iter().map(|p| p.name.as_str()).collect();
        assert!(
            names.contains(&"send_start") && names.contains(&"deliver"),
            "{opt}: {names:?}"
        );
        for p in probes
            .iter()
            .filter(|p| p.name == "send_start" || p.name == "deliver")
        {
            assert_eq!(p.provider, "xlap");
            assert_eq!(p.args.len(), 2, "{opt}: {}", p.args_spec);
            assert!(p.args.iter().all(|a| a.size == 8), "{opt}: {}", p.args_spec);
        }
        // Uncast globals keep their own sizes (8 and 1 bytes); optimised code
        // passes them as rip-relative memory operands, resolved to addresses
        // of the globals, and struct fields as base+index*scale operands.
        if opt == "-O2" {
            let mem = probes
                .iter()
                .find(|p| p.name == "mem_args")
                .expect("mem_args");
            assert_eq!(
                mem.args.iter().map(|a| a.size).collect::<Vec<_>>(),
                vec![8, 1],
                "{}",
                mem.args_spec
            );
            assert!(
                mem.args
                    .iter()
                    .any(|a| matches!(a.location, ArgLocation::Global { address } if address > 0)),
                "{}",
                mem.args_spec
            );
            let idx = probes
                .iter()
                .find(|p| p.name == "indexed_args")
                .expect("indexed_args");
            assert!(
                idx.args.iter().any(|a| matches!(
                    a.location,
                    ArgLocation::Memory {
                        index: Some((_, 8)),
                        offset: 8,
                        ..
                    }
                )),
                "{}",
                idx.args_spec
            );
        }
    }
}

#[test]
fn a_file_that_is_not_elf_is_a_clear_error() {
    let scratch = Scratch::new("notelf");
    let f = scratch.path("x.txt");
    std::fs::write(&f, "hello").unwrap();
    let e = read_probes(&f).unwrap_err().to_string();
    assert!(e.contains("x.txt") && e.contains("not an ELF"), "{e}");
}

/// The ring's layout has one definition (the Rust crate, which xlap-trace
/// reads with); the C header's copy is checked against it field by field.
#[test]
fn the_c_ring_layout_is_the_rust_one() {
    let _guard = xlap_tests::unprivileged();
    use std::mem::offset_of;
    use xlap_marker::ring::{Control, Header, Record};
    let header_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/markers/c");
    let scratch = Scratch::new("ringlayout");
    let src = scratch.path("layout.c");
    let fields = [
        ("xlap_ring_control", "state", offset_of!(Control, state)),
        (
            "xlap_ring_control",
            "generation",
            offset_of!(Control, generation),
        ),
        ("xlap_ring_control", "path", offset_of!(Control, path)),
        ("xlap_ring_header", "magic", offset_of!(Header, magic)),
        ("xlap_ring_header", "capacity", offset_of!(Header, capacity)),
        ("xlap_ring_header", "head", offset_of!(Header, head)),
        ("xlap_ring_header", "tail", offset_of!(Header, tail)),
        ("xlap_ring_header", "dropped", offset_of!(Header, dropped)),
        ("xlap_ring_record", "commit", offset_of!(Record, commit)),
        ("xlap_ring_record", "ts_ns", offset_of!(Record, ts_ns)),
        ("xlap_ring_record", "site", offset_of!(Record, site)),
        ("xlap_ring_record", "seq", offset_of!(Record, seq)),
        ("xlap_ring_record", "kind", offset_of!(Record, kind)),
        ("xlap_ring_record", "pid", offset_of!(Record, pid)),
        ("xlap_ring_record", "tid", offset_of!(Record, tid)),
        ("xlap_ring_record", "cpu", offset_of!(Record, cpu)),
    ];
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"xlap_markers.h\"\nint main(void) {\n",
    );
    for (ty, field, _) in &fields {
        c += &format!("  printf(\"%zu\\n\", offsetof(struct {ty}, {field}));\n");
    }
    for ty in ["xlap_ring_control", "xlap_ring_header", "xlap_ring_record"] {
        c += &format!("  printf(\"%zu\\n\", sizeof(struct {ty}));\n");
    }
    c += "  printf(\"%llu %d %d\\n\", XLAP_RING_MAGIC, XLAP_RING_PATH_BYTES, XLAP_RING_RECORDS_OFFSET);\n  return 0;\n}\n";
    std::fs::write(&src, c).unwrap();
    let exe = scratch.path("layout");
    let status = std::process::Command::new("cc")
        .arg("-I")
        .arg(&header_dir)
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .status()
        .expect("cc runs");
    assert!(status.success());
    let out = std::process::Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut expected: Vec<String> = fields.iter().map(|f| f.2.to_string()).collect();
    for size in [
        std::mem::size_of::<Control>(),
        std::mem::size_of::<Header>(),
        std::mem::size_of::<Record>(),
    ] {
        expected.push(size.to_string());
    }
    expected.push(format!(
        "{} {} {}",
        xlap_marker::ring::MAGIC,
        xlap_marker::ring::PATH_BYTES,
        xlap_marker::ring::RECORDS_OFFSET
    ));
    assert_eq!(text.lines().collect::<Vec<_>>(), expected);
}

//! Generates the Rust side of the BPF ABI from the C header, the single
//! source of the wire layout.

use std::path::PathBuf;

fn main() {
    // The manifest directory of this build, read when the script runs: with
    // env!() it would be the checkout that compiled the script, and a
    // target directory shared by several checkouts (CI's cache) would
    // reuse that script, reading another checkout's files.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let header = PathBuf::from(manifest).join("../../bpf/xlap_abi.h");
    // Relative to the package root: several checkouts can share one target
    // directory (artifacts of path packages are named alike), and an
    // absolute path would let a fresh checkout reuse another's output.
    println!("cargo:rerun-if-changed=../../bpf/xlap_abi.h");
    let bindings = bindgen::Builder::default()
        .header(header.to_str().expect("utf-8 path"))
        .allowlist_type("xlap_.*")
        .allowlist_var("XLAP_.*")
        .constified_enum_module("xlap_point")
        .constified_enum_module("xlap_loss")
        .constified_enum_module("xlap_arg_kind")
        .constified_enum_module("xlap_hold_why")
        .constified_enum_module("xlap_hold_skip")
        .derive_default(true)
        .derive_eq(true)
        .layout_tests(true)
        .use_core()
        .generate()
        .unwrap_or_else(|e| {
            panic!(
                "bindgen failed on {}: {e} (is libclang-dev installed? run ./run.sh setup)",
                header.display()
            )
        });
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("abi.rs");
    bindings.write_to_file(out).expect("write bindings");
}

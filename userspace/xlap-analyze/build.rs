//! Rebuilds the crate when a bundled query changes.
//!
//! The queries (`queries/*.sql`, included with `include_str!`) lie outside
//! this package, and Cargo records such a file by its absolute path. A
//! checkout sharing the build cache (CI's clean clones, a worktree) would
//! find another checkout's unchanged copy there and reuse a build made with
//! other queries. A path relative to the package is looked up in each
//! checkout's own tree (as `xlap-capture` does for `bpf/`).
fn main() {
    println!("cargo:rerun-if-changed=../../queries");
}

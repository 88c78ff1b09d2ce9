//! The property-based fuzz targets (proptest), one binary: the USDT note
//! reader and argument-spec decoder (xlap-usdt), the ring-buffer record
//! decoder (xlap-abi, xlap-records), the correlator (xlap-analyze) and
//! the CLI's renderers (report, export, analyze, summary, compare, history)
//! and every command on a tampered run directory.
//! They use only the crates' public APIs. `just test` runs them briefly on
//! a fixed seed, `just fuzz` long (`PROPTEST_CASES`, `PROPTEST_RNG_SEED`);
//! one target: `cargo test -p xlap-tests --test fuzz -- fuzz_args::`.

mod fuzz_args;
mod fuzz_correlate;
mod fuzz_grammar;
mod fuzz_notes;
mod fuzz_records;
mod fuzz_render;
mod fuzz_run_dirs;

use proptest::test_runner::{Config, RngSeed};

/// A target's proptest settings: `cases` and a fixed `seed` unless
/// `PROPTEST_CASES` and `PROPTEST_RNG_SEED` say otherwise (`just fuzz`), a
/// case's time limit unless `PROPTEST_TIMEOUT` gives one (0: none), and
/// no files of failures left in the tree.
pub(crate) fn config(cases: u32, seed: u64, timeout_ms: u32) -> Config {
    // Config::default() reads the PROPTEST_* variables.
    let mut c = Config {
        failure_persistence: None,
        ..Config::default()
    };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(seed);
    }
    if c.timeout == 0 {
        c.timeout = timeout_ms;
    }
    c
}

//! The property-based fuzz targets (proptest), one binary: the USDT note
//! reader and argument-spec decoder (xlap-usdt), the ring-buffer record
//! decoder (xlap-abi, xlap-records), the correlator (xlap-analyze) and
//! the CLI's renderers (report, export, analyze, summary, compare, history).
//! They use only the crates' public APIs. `just test` runs them briefly on
//! a fixed seed, `just fuzz` long (`PROPTEST_CASES`, `PROPTEST_RNG_SEED`);
//! one target: `cargo test -p xlap-tests --test fuzz -- fuzz_args::`.

mod fuzz_args;
mod fuzz_correlate;
mod fuzz_grammar;
mod fuzz_notes;
mod fuzz_records;
mod fuzz_render;

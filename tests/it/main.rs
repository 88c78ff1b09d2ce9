//! xlap-trace's integration and privileged end-to-end tests, one module per
//! area. One binary rather than one per file: each test binary links DuckDB,
//! and linking ~45 of them dominated an incremental build (issue 30).
//! Pick an area with a name filter: `cargo test -p xlap-tests --test it --
//! analyze::` (a filter matches anywhere in the name, so `capture::` also
//! takes `usdt_capture::`; `--skip` or `--exact` when that matters).
//!
//! Privileged tests still run one at a time, and now also apart from the
//! unprivileged tests that run programs or DuckDB (`xlap_tests::privileged`
//! and `xlap_tests::unprivileged` say why).

mod analyze;
mod attribution;
mod boundary_auto;
mod bpf_stats;
mod c_markers;
mod capture;
mod cgroups;
mod ci_example;
mod cli;
mod compare;
mod compare_cli;
mod compare_short_runs;
mod conformance;
mod correlate_live;
mod correlate_synthetic;
mod crash_recovery;
mod dataset;
mod deadline_activation;
mod demo;
mod estimate;
mod event_loops;
mod example_protocol;
mod exchange;
mod faults;
mod foreign_runs;
mod hostile_targets;
mod io_uring;
mod iperf3;
mod kernel_features;
mod least_privilege;
mod live_view;
mod moved_senders;
mod path_matrix;
mod pcapng_export;
mod peer_link;
mod point_sets;
mod prometheus_scrape;
mod qdisc_classes;
mod readme_vocabulary;
mod receive_calls;
mod redundancy;
mod rotation;
mod rtp;
mod run_command;
mod run_end;
mod run_jobs;
mod sampling;
mod sandbox;
mod seams;
mod stage;
mod stage_partition;
mod timestamping;
mod two_kernels;
mod usdt_capture;
mod usdt_notes;
mod wire_gaps;

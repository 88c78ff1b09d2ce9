# Recipes of xlap-trace. `./run.sh RECIPE` installs what they need first.
set shell := ["bash", "-euo", "pipefail", "-c"]

target := env_var_or_default("CARGO_TARGET_DIR", justfile_directory() / "target")
xlap := target / "debug" / "xlap-trace"
python := env_var_or_default("XLAP_PYTHON", "python3")

# The main job: the example protocol on a two-host stage, traced, analysed.
default: demo

# Build everything (BPF objects included, by build.rs).
build:
    cargo build --workspace

# The main job end to end (options: --count N, --period-us N, --plain, -o DIR).
demo *ARGS: build
    {{xlap}} demo {{ARGS}}

# Every tier: lint, unit, integration, privileged end-to-end.
test: lint build
    @# A test that leaked a stage fails the suite (and the leak is removed),
    @# checked even when tests failed.
    {{xlap}} stage sweep >/dev/null
    @# Then the areas of the `it` binary that the kernel matrix cannot
    @# afford under emulation, run as on Debian 12's 6.1 (XLAP_KERNEL_AS:
    @# docs/stamp-points.md, minimum kernel per feature; a filter matches
    @# anywhere in a test's name, hence the skip: capture:: would also take
    @# usdt_capture::). Last, the kernel matrix: Debian's own 6.1 and 6.12
    @# in QEMU guests, and 5.10's refusal (docs/testing.md).
    @# A failing test's own words are repeated last (a CI log is often
    @# shown by its ends only).
    status=0; log={{target}}/test-output.log; : > "$log"; \
    cargo test --workspace --no-fail-fast 2>&1 | tee -a "$log" || status=$?; \
    XLAP_KERNEL_AS=6.1 cargo test -p xlap-tests --no-fail-fast --test it -- attribution:: \
        event_loops:: io_uring:: iperf3:: path_matrix:: capture:: least_privilege:: --skip usdt_capture:: \
        2>&1 | tee -a "$log" || status=$?; \
    {{xlap}} stage sweep --check || status=$?; \
    just vm-matrix || status=$?; \
    if [ $status -ne 0 ]; then tests/failures.sh "$log"; fi; exit $status

# The conformance matrix: programs we did not write (iperf3, sockperf, Go,
# tokio, C sendmmsg/recvmmsg, Python asyncio, ...) traced and checked
# against their own accounts; prints program x check as Markdown (also in
# target/debug/conformance.md). XLAP_CONFORMANCE=go,iperf3 picks rows.
conformance:
    cargo build --workspace --all-targets
    cargo test -p xlap-tests --test it -- conformance:: --nocapture

# The fuzz targets run long: CASES per property, a fresh seed (printed).
fuzz CASES="200000":
    @# The proptest targets, binary fuzz of tests/fuzz/ (USDT notes and
    @# argument specs, ring-buffer records, the correlator, the CLI's
    @# renderers), which `just test` runs briefly on a fixed seed; the
    @# correlator (DuckDB per case) gets a hundredth of the cases, the
    @# renderers (a dozen CLI runs per case) a thousandth;
    @# PROPTEST_RNG_SEED=N repeats a run. Dev profile and the usual target
    @# directory: a release build would rebuild DuckDB (~40 min).
    seed=${PROPTEST_RNG_SEED:-$RANDOM$RANDOM}; echo "fuzz: seed $seed, {{CASES}} cases"; \
    PROPTEST_RNG_SEED=$seed PROPTEST_CASES={{CASES}} cargo test -p xlap-tests --test fuzz -- --skip fuzz_correlate:: --skip fuzz_render::; \
    PROPTEST_RNG_SEED=$seed PROPTEST_CASES=$(( {{CASES}} / 100 > 16 ? {{CASES}} / 100 : 16 )) cargo test -p xlap-tests --test fuzz -- fuzz_correlate::; \
    PROPTEST_RNG_SEED=$seed PROPTEST_CASES=$(( {{CASES}} / 1000 > 8 ? {{CASES}} / 1000 : 8 )) cargo test -p xlap-tests --test fuzz -- fuzz_render::

# Formatting, clippy, clang-format, and the committed schemas.
lint:
    cargo fmt --all --check
    cargo clippy --workspace --all-targets -- -D warnings
    clang-format --dry-run --Werror bpf/*.c bpf/*.h bpf/lib/*.h bpf/hooks/*.h examples/markers/c/*.h examples/markers/c/*.c tests/c/*.c userspace/xlap-exit/src/*.cpp
    cargo run -q -p xlap-trace -- schema --check schemas
    @# The recorder (root) links no SQL engine: what it parses stays in Rust,
    @# the analysis runs in confined children (docs/threat-model.md).
    if cargo tree -q -p xlap-capture -e normal --prefix none | grep -E '^(duckdb|xlap-analyze) '; then \
        echo "lint: xlap-capture depends on the SQL engine again (above)" >&2; exit 1; fi

# Regenerate the committed schema files.
schemas:
    cargo run -q -p xlap-trace -- schema --write schemas

# A stage for experiments, until Ctrl-C (e.g. just stage --qdisc a=tbf).
stage *ARGS: build
    {{xlap}} stage up {{ARGS}}

# Benchmarks: BPF cost floor, capture throughput and losses, perturbation of
# the traced protocol's latency, side by side in one run (--quick: shorter).
bench *ARGS: build
    {{target}}/debug/xlap-bench {{ARGS}}
    {{target}}/debug/xlap-bench-perturb {{ARGS}}
    {{target}}/debug/xlap-bench-jobs {{ARGS}}

# The capture programs' own cost above the floor of their hooks, pinned
# sockperf ping-pong: every point at both boundaries, --points minimal and
# --sample 1/16 at the socket calls, each beside empty programs on the same
# hooks and the bpftrace anchor, and BPF ns per program and per stamp
# (--baseline OLD/xlap-trace: the build before too, interleaved; --rounds,
# --seconds); bench-results/programs.json. Where each program's time goes,
# by helper: bench/program_profile.sh XLAP_TRACE.
bench-programs *ARGS: build
    {{target}}/debug/xlap-bench-perturb --programs {{ARGS}}

# A long capture at a high rate, cut into segments within a disk budget:
# recorder RSS, CPU, disk, losses, bytes per stamp (--minutes N, default
# 30; --quick: 2; --period-us, --pairs, --rotate, --max-size).
bench-long *ARGS: build
    {{target}}/debug/xlap-bench-long {{ARGS}}

# How often compare is right on short single runs of the CI job
# (examples/ci/xlap-ci.sh): N unchanged and N injected pairs (--pairs N,
# default 10; --count PACKETS, default 3000; --inject STAGE=US, default
# decode=50); regressions and false alarms to bench-results/compare.json.
bench-compare *ARGS: build
    PATH="{{target}}/debug:$PATH" {{python}} bench/compare_verdicts.py {{ARGS}}

# The analysis benchmark on the same 10 M synthetic packets (--quick: 1 M),
# interleaved rounds: the default analysis (with and without the run's
# stored aggregates) against polars, every bundled query against a pandas
# re-implementation of X-LAP's notebook; ./run.sh installs both in a venv.
# Also history of 500 runs, and a dataset of 10 such runs (100 M packets,
# --big-runs N) analysed as one population. Built once in bench-results/.
bench-analysis *ARGS: build
    {{target}}/debug/xlap-bench-analysis --python {{python}} {{ARGS}}

# Peak memory (the child's ru_maxrss) and wall time of every command that
# reads a run (correlate, analyze -q all, report, export, summary, compare,
# history, sql), each a child under a timeout and RLIMIT_DATA, on synthetic
# runs of 10 000 and 10 M packets (--quick: 1 M), kept in bench-results/,
# and a recorded run (--run xlap-demo/run), against their bounds: 500 MB,
# and the engine limit + 2 GiB. Markdown; bench-results/memory.json.
bench-memory *ARGS: build
    {{target}}/debug/xlap-bench-memory {{ARGS}}

# The kernel matrix in QEMU guests booted with Debian's own kernels (6.1,
# 6.12, and 5.10 below the minimum): a real recording checked against the
# programs' own counts and areas of the `it` binary on 6.1 and 6.12, the
# refusal on 5.10; kernels fetched once into the build cache (tests/vm/,
# docs/testing.md). SUITES: bookworm bookworm-backports bullseye (default
# all). Part of `just test`.
vm-matrix *SUITES:
    cargo build --workspace
    @# The `it` binary of the workspace's build (the one `just test` ran).
    it=$(cargo test --workspace --no-run --message-format=json 2>/dev/null | \
        python3 -c 'import json,sys; print(next((m["executable"] for m in map(json.loads, sys.stdin) if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable")), ""))'); \
    CARGO_TARGET_DIR={{target}} XLAP_VM_IT_BIN="$it" tests/vm/matrix.sh {{SUITES}}

#!/bin/sh
# The steps of the example CI jobs (github-actions.yml and gitlab-ci.yml call
# exactly these; tests/tests/ci_example.rs runs them the same way).
#
#   xlap-ci.sh baseline DIR [RUNS]      record RUNS runs (default 5) of the
#                                       protocol and pool them: DIR/baseline.json
#   xlap-ci.sh check BASELINE DIR       record one run, compare it with the
#                                       baseline: DIR/compare.md, DIR/junit.xml;
#                                       exit 1 on a regression
#
# The protocol under test is the example (xlap-example on loopback); put your
# own processes in `record` below. XLAP_INJECT (e.g. decode=50) passes an
# injected delay to the example's receiver, to see a regression caught.
# Needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE) and xlap-trace and
# xlap-example on PATH.
set -eu

PORT=${XLAP_CI_PORT:-47600}
# 3 s per run at 10 k packets/s: a run shorter than the machine's noise lasts
# (seconds, on shared CI runners) sees one state of it, and compare cannot
# tell that from a change (it says so).
COUNT=${XLAP_CI_COUNT:-30000}

# One traced run of the protocol into DIR: receiver and sender started
# (the sender waits for a start file), both traced from before the first
# packet with their markers, then released.
record() { # record DIR
    out=$1
    inject=""
    if [ -n "${XLAP_INJECT:-}" ]; then inject="--inject $XLAP_INJECT"; fi
    rm -rf "$out" "$out.go" "$out.rready" "$out.ready"
    # shellcheck disable=SC2086
    xlap-example recv --bind "127.0.0.1:$PORT" --expect "$COUNT" --deadline-ms 1000 \
        --ready-file "$out.rready" $inject >/dev/null &
    recv=$!
    xlap-example send --dest "127.0.0.1:$PORT" --count "$COUNT" --period-us 100 \
        --start-file "$out.go" >/dev/null &
    send=$!
    # Whatever happens, nothing started here outlives the script.
    trap 'kill "$recv" "$send" ${tracer:-} 2>/dev/null || true' EXIT
    while [ ! -e "$out.rready" ]; do
        kill -0 "$recv" 2>/dev/null || fail "the receiver did not start"
        sleep 0.05
    done
    # Its report goes to stderr: stdout is the comparison's Markdown.
    xlap-trace record --quiet -o "$out" --pid "$recv" --pid "$send" --ready-file "$out.ready" >&2 &
    tracer=$!
    while [ ! -e "$out.ready" ]; do
        kill -0 "$tracer" 2>/dev/null || fail "xlap-trace did not start"
        sleep 0.05
    done
    touch "$out.go"
    wait "$send" || fail "the sender failed"
    wait "$recv" || fail "the receiver failed"
    wait "$tracer" || fail "xlap-trace failed"
    trap - EXIT
    tracer=""
    rm -f "$out.go" "$out.rready" "$out.ready"
}

fail() {
    echo "xlap-ci.sh: $1" >&2
    exit 1
}

case "${1:-}" in
baseline)
    dir=$2
    runs=${3:-5}
    mkdir -p "$dir"
    i=1
    set --
    while [ "$i" -le "$runs" ]; do
        record "$dir/run$i"
        set -- "$@" "$dir/run$i"
        i=$((i + 1))
    done
    xlap-trace summary "$@" -o "$dir/baseline.json"
    ;;
check)
    baseline=$2
    dir=$3
    mkdir -p "$dir"
    record "$dir/run"
    status=0
    xlap-trace compare "$baseline" "$dir/run" --markdown --junit "$dir/junit.xml" \
        >"$dir/compare.md" || status=$?
    cat "$dir/compare.md"
    exit "$status"
    ;;
*)
    sed -n "2,16p" "$0"
    exit 2
    ;;
esac

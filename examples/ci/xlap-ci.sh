#!/bin/sh
# The steps of the example CI jobs (github-actions.yml and gitlab-ci.yml call
# exactly these; tests/it/ci_example.rs runs them the same way).
#
#   xlap-ci.sh baseline DIR [RUNS]      record RUNS runs (default 5) of the
#                                       protocol and pool them: DIR/baseline.json
#   xlap-ci.sh check BASELINE DIR       record one run, compare it with the
#                                       baseline: DIR/compare.md, DIR/junit.xml;
#                                       exit 1 on a regression
#
# The protocol under test is the example (xlap-example on loopback); put your
# own processes in `protocol` below: `xlap-trace run` traces whatever it
# starts, each program from its exec, markers included. XLAP_INJECT (e.g. decode=50) passes an
# injected delay to the example's receiver, to see a regression caught.
# Needs root (or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_KILL) and
# xlap-trace and xlap-example on PATH.
set -eu

PORT=${XLAP_CI_PORT:-47600}
# 3 s per run at 10 k packets/s: a run shorter than the machine's noise lasts
# (seconds, on shared CI runners) sees one state of it, and compare cannot
# tell that from a change (it says so).
COUNT=${XLAP_CI_COUNT:-30000}

# One traced run of the protocol into DIR: `xlap-trace run` starts the job
# (this script's `protocol` step) and traces every program it starts, from
# each program's exec, markers included.
record() { # record DIR
    out=$1
    rm -rf "$out" "$out.rready"
    # Its report goes to stderr: stdout is the comparison's Markdown.
    xlap-trace run --quiet -o "$out" -- "$0" protocol "$out.rready" >&2 ||
        fail "the traced job failed (exit $?)"
    rm -f "$out.rready"
}

# The protocol under test, started as a CI job would: the receiver, then
# the sender once the receiver is ready. Put your own programs here.
protocol() { # protocol READY_FILE
    ready=$1
    inject=""
    if [ -n "${XLAP_INJECT:-}" ]; then inject="--inject $XLAP_INJECT"; fi
    # shellcheck disable=SC2086
    xlap-example recv --bind "127.0.0.1:$PORT" --expect "$COUNT" --deadline-ms 1000 \
        --ready-file "$ready" $inject >/dev/null &
    recv=$!
    trap 'kill "$recv" 2>/dev/null || true' EXIT
    while [ ! -e "$ready" ]; do
        kill -0 "$recv" 2>/dev/null || fail "the receiver did not start"
        sleep 0.05
    done
    xlap-example send --dest "127.0.0.1:$PORT" --count "$COUNT" --period-us 100 >/dev/null ||
        fail "the sender failed"
    wait "$recv" || fail "the receiver failed"
    trap - EXIT
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
protocol)
    protocol "$2"
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

#!/usr/bin/env bash
# Per-run cost of the capture's programs, two builds side by side: a
# sockperf ping-pong on loopback (64 B, 4 s) traced by each build in turn,
# interleaved for ROUNDS rounds, with the kernel's BPF statistics on
# (`--bpf-stats full`); prints ns per run of each program from run.json.
#
#   bench/program_cost.sh NEW_XLAP_TRACE OLD_XLAP_TRACE [BOUNDARY] [ROUNDS]
#
# BOUNDARY: syscalls, socket-calls or auto (default socket-calls); ROUNDS
# default 2. Runs as root (it loads BPF); port 12011 on loopback.
set -euo pipefail
new=${1:?usage: program_cost.sh NEW OLD [BOUNDARY] [ROUNDS]}
old=${2:?usage: program_cost.sh NEW OLD [BOUNDARY] [ROUNDS]}
boundary=${3:-socket-calls}
rounds=${4:-2}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for round in $(seq "$rounds"); do
	for build in new old; do
		bin=${!build}
		sockperf sr -i 127.0.0.1 -p 12011 >/dev/null 2>&1 &
		server=$!
		sleep 0.3
		run="$scratch/$build-$round"
		"$bin" record --pid "$server" --boundary "$boundary" --bpf-stats full \
			--proto sockperf --quiet --no-correlate -o "$run" >/dev/null 2>"$run.err" &
		recorder=$!
		# Until the recorder has attached (run.json appears).
		for _ in $(seq 300); do [ -e "$run/run.json" ] && break; sleep 0.1; done
		sockperf pp -i 127.0.0.1 -p 12011 -t 4 -m 64 >/dev/null 2>&1
		kill -INT "$recorder"
		wait "$recorder" || true
		kill "$server"
		wait "$server" 2>/dev/null || true
		python3 - "$run/run.json" "$build" "$round" <<'PY'
import json, sys
meta = json.load(open(sys.argv[1]))
for name, p in sorted(meta.get("bpf_programs", {}).items()):
    if p.get("run_count"):
        print(f"{sys.argv[2]}\tround {sys.argv[3]}\t{name}\t{p['run_time_ns'] / p['run_count']:.0f} ns/run\t{p['run_count']} runs")
PY
	done
done

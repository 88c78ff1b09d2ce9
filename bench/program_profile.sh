#!/usr/bin/env bash
# Where the capture programs' time goes, per program and per helper: a
# sockperf ping-pong (64 B, --mps=max) between two network namespaces on a
# veth pair, both ends pinned to CPU 0 and traced by XLAP_TRACE record;
# `perf record -g` samples CPU 0, and each sample inside a BPF program is
# credited to that program and to the kernel function it called (a helper,
# the clock, the ring buffer) or to the program's own code ("(self)").
# `bpftool prog profile` would count instructions per program, but it
# needs fentry, which these kernels refuse (docs/performance.md).
#
#   bench/program_profile.sh XLAP_TRACE [SECONDS] [RECORD_ARGS...]
#
# SECONDS default 6; RECORD_ARGS e.g. --boundary socket-calls. Runs as
# root (it loads BPF and makes namespaces xlp-a, xlp-b, removed at exit).
set -euo pipefail
bin=${1:?usage: program_profile.sh XLAP_TRACE [SECONDS] [RECORD_ARGS...]}
secs=${2:-6}
shift $(($# >= 2 ? 2 : 1))
for tool in perf sockperf taskset python3; do
	command -v "$tool" >/dev/null || {
		echo "program_profile.sh: $tool is missing (./run.sh setup installs it)" >&2
		exit 2
	}
done
scratch=$(mktemp -d)
cleanup() {
	kill "${pids[@]}" 2>/dev/null || true
	ip netns del xlp-a 2>/dev/null || true
	ip netns del xlp-b 2>/dev/null || true
	rm -rf "$scratch"
}
pids=()
trap cleanup EXIT
ip netns add xlp-a
ip netns add xlp-b
ip link add name xl0 netns xlp-a type veth peer name xl0 netns xlp-b
ip -n xlp-a addr add 10.97.0.1/24 dev xl0
ip -n xlp-b addr add 10.97.0.2/24 dev xl0
for ns in xlp-a xlp-b; do
	ip -n "$ns" link set xl0 up
	ip -n "$ns" link set lo up
done
ip netns exec xlp-b taskset -c 0 sockperf server -i 10.97.0.2 -p 12097 >/dev/null 2>&1 &
pids+=($!)
# The client waits for the recorder before it sends.
ip netns exec xlp-a taskset -c 0 bash -c "while [ ! -e $scratch/go ]; do sleep 0.01; done; exec sockperf ping-pong -i 10.97.0.2 -p 12097 -m 64 --mps=max -t $((secs + 2))" >"$scratch/pp" 2>&1 &
client=$!
pids+=("$client")
sleep 0.3
"$bin" record --pid "${pids[0]}" --pid "$client" --quiet --no-correlate --no-usdt \
	--proto sockperf -o "$scratch/run" "$@" >/dev/null 2>"$scratch/err" &
pids+=($!)
for _ in $(seq 300); do [ -e "$scratch/run/run.json" ] && break; sleep 0.1; done
[ -e "$scratch/run/run.json" ] || {
	cat "$scratch/err" >&2
	exit 1
}
touch "$scratch/go"
sleep 1
perf record -C 0 -g -o "$scratch/perf.data" -- sleep "$secs" 2>/dev/null >/dev/null
wait "$client" || true
perf script -i "$scratch/perf.data" -F ip,sym 2>/dev/null | python3 -c '
import collections, re, sys
credit = collections.Counter()
per_program = collections.Counter()
samples = 0
stack = []
def done():
    global samples
    if not stack:
        return
    samples += 1
    for i, frame in enumerate(stack):
        if frame.startswith("bpf_prog_"):
            program = re.sub(r"^bpf_prog_[0-9a-f]+_", "", frame)
            callee = stack[i - 1] if i > 0 else "(self)"
            credit[(program, callee)] += 1
            per_program[program] += 1
            return
for line in sys.stdin:
    fields = line.split()
    if not fields:
        done()
        stack = []
    elif len(fields) >= 2:
        stack.append(fields[1].split("+")[0])
done()
print(f"{samples} samples on CPU 0; share of them inside each BPF program, and what it called:")
for program, n in per_program.most_common():
    print(f"{program:32s} {100 * n / samples:5.2f} %")
    for (p, callee), m in sorted(credit.items(), key=lambda kv: -kv[1]):
        if p == program and 100 * m / samples >= 0.05:
            print(f"    {callee:36s} {100 * m / samples:5.2f} %")
'
grep -oE "avg-latency=[0-9.]+" "$scratch/pp" | head -1

#!/usr/bin/env bash
# Runs inside a guest booted by tests/vm/matrix.sh (all paths are the
# host's; OUT is a --rwdir). Each step writes OUT/STEP.status (ok, or what
# failed) and OUT/STEP.log; OUT/times has the guest's uptime at each step.
#
#   guest.sh OUT XLAP record             two UDP programs on loopback, recorded,
#                                        stamps per point against their own counts
#   guest.sh OUT XLAP refuse             `record` refuses this kernel: exit 4,
#                                        naming what is missing, no verifier dump
#   guest.sh OUT XLAP confine            an analysis as root without Landlock
#                                        runs as the owner of its run: a file
#                                        of root's in it is refused
#   guest.sh OUT XLAP it IT [FILTER...]  areas of the `it` test binary, by name
#
# Steps can be chained: guest.sh OUT XLAP record it IT FILTER... (`it` takes
# the rest of the arguments).
set -uo pipefail
out=$1 xlap=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
stamp() { echo "$1 $(cut -d' ' -f1 /proc/uptime)" >>"$out/times"; }
echo "kernel $(uname -r)" >"$out/times"
stamp start
ip link set lo up

record() {
	local d=$out/record n=${XLAP_VM_COUNT:-2000}
	rm -rf "$d" && mkdir -p "$d"
	python3 "$here/udp_pair.py" recv 7311 "$n" "$d/received" &
	local r=$!
	python3 "$here/udp_pair.py" send 7311 "$n" "$d/go" "$d/sent" &
	local s=$!
	"$xlap" record --pid "$s" --pid "$r" --seq-offset 0 --seq-size 4 --seq-endian big \
		--no-usdt --duration 120 --ready-file "$d/go" -o "$d/run" >"$d/stdout" 2>"$d/stderr"
	local rc=$?
	# A recorder that failed never signalled the sender: end both.
	[ "$rc" = 0 ] || kill "$s" "$r" 2>/dev/null
	wait "$s" "$r"
	cat "$d/stderr"
	python3 - "$d" "$rc" <<'PY'
import json, sys
d, rc = sys.argv[1], int(sys.argv[2])
sent = int(open(f"{d}/sent").read()) if rc == 0 else 0
received = int(open(f"{d}/received").read()) if rc == 0 else 0
problems = [] if rc == 0 else [f"xlap-trace record exited {rc}"]
meta = json.load(open(f"{d}/run/run.json")) if rc == 0 else {}
points = meta.get("points", {})
unavailable = meta.get("unavailable_points", {})
degraded = meta.get("degraded_points", {})
# Every datagram crosses these on loopback (no qdisc: noqueue; no GRO).
core = ["sock.send_enter", "sock.send_exit", "dev.queue", "dev.start_xmit", "dev.xmit",
        "dev.netif_rx", "dev.receive_skb", "sock.queue", "sock.recv_exit"]
if rc == 0 and received != sent:
    problems.append(f"the programs lost datagrams on loopback: sent {sent}, received {received}")
lines = [f"programs: sent {sent}, received {received}; boundary {meta.get('options', {}).get('boundary')}; "
         f"bpf_ns_per_stamp {meta.get('bpf_ns_per_stamp')}"]
for p in sorted(set(core) | set(points) | set(unavailable)):
    n = points.get(p, {}).get("stamps", 0)
    if p in unavailable:
        verdict = "unavailable (said)" if n == 0 else f"said unavailable but {n} stamps"
        if n:
            problems.append(f"{p}: {verdict}")
    elif p in core:
        verdict = "ok" if n == received else f"expected {received}"
        if n != received:
            problems.append(f"{p}: {n} stamps, the receiver got {received}")
        if p in degraded:
            verdict += " (degraded: said)"
    else:
        verdict = "-"
    lines.append(f"  {p:18} {n:6}  {verdict}")
for k, v in sorted(meta.get("unavailable_hooks", {}).items()):
    lines.append(f"  hook {k}: {v.splitlines()[0][:200] if v else ''}")
for k, v in sorted(degraded.items()):
    lines.append(f"  degraded {k}: {v[:200]}")
print("\n".join(lines))
open(f"{d}/../record.status", "w").write("ok\n" if not problems else "; ".join(problems) + "\n")
PY
}

refuse() {
	local d=$out/refuse
	rm -rf "$d" && mkdir -p "$d"
	sleep 30 &
	local pid=$!
	"$xlap" record --pid "$pid" --seq-offset 0 --seq-size 4 --no-usdt --duration 1 -o "$d/run" \
		>"$d/stdout" 2>"$d/stderr"
	local rc=$?
	kill "$pid" 2>/dev/null
	cat "$d/stderr"
	local why=""
	[ "$rc" = 4 ] || why="exit $rc, not 4"
	grep -q "$(uname -r)" "$d/stderr" && grep -q '5\.17' "$d/stderr" || why="$why; the message names neither this kernel nor 5.17"
	grep -qi 'verifier\|processed [0-9]* insns' "$d/stderr" && why="$why; a verifier dump"
	echo "${why:-ok}" | sed 's/^; //' >"$out/refuse.status"
}

# A kernel without Landlock (5.10): `analyze` as root on a run owned by
# nobody runs as nobody (said once); a file of root's in it (its packets
# table, mode 0600) is then refused by its mode (exit 6, permission
# denied); the same run in a directory of root's keeps uid 0 and reads it
# (exit 0, "keeps its uid"): the control that shows the switch is what
# refused it. (A link to a file outside the run proves nothing here: the
# engine's own allowed directories refuse it first.)
confine() {
	local d=$out/confine work
	rm -rf "$d" && mkdir -p "$d"
	# The guest's own tmpfs: ownership there is the guest's to give.
	work=$(mktemp -d /tmp/xlap-confine.XXXXXX)
	chmod 755 "$work"
	local why="" rc
	"$xlap" synth --packets 500 -o "$work/run" >"$d/synth.log" 2>&1 || why="synth failed: $(tail -n 3 "$d/synth.log")"
	chown -R 65534:65534 "$work/run"
	"$xlap" analyze "$work/run" >"$d/plain.out" 2>"$d/plain.err"
	rc=$?
	cat "$d/plain.err"
	[ "$rc" = 0 ] || why="$why; analyze of nobody's run exited $rc"
	[ "$(grep -c 'runs as uid 65534' "$d/plain.err")" = 1 ] || why="$why; the uid switch was not said once"
	chown 0:0 "$work/run/packets.parquet" && chmod 600 "$work/run/packets.parquet"
	"$xlap" analyze "$work/run" >"$d/rootfile.out" 2>"$d/rootfile.err"
	rc=$?
	cat "$d/rootfile.err"
	[ "$rc" = 6 ] || why="$why; a root-only file in nobody's run: exit $rc, not 6"
	grep -qi 'permission denied' "$d/rootfile.err" || why="$why; the refusal is not the file's mode"
	chown 0:0 "$work/run"
	"$xlap" analyze "$work/run" >"$d/root.out" 2>"$d/root.err"
	rc=$?
	cat "$d/root.err"
	[ "$rc" = 0 ] || why="$why; control: the run in root's directory exited $rc (the check above proves nothing)"
	grep -q 'keeps its uid' "$d/root.err" || why="$why; control: keeping uid 0 was not said"
	rm -rf "$work"
	echo "${why:-ok}" | sed 's/^; //' >"$out/confine.status"
}

# One test at a time, each timed (OUT/it.times: seconds, verdict, name).
it() {
	local bin=$1 failed=() t0 t1 rc
	shift
	: >"$out/it.times"
	while read -r name; do
		t0=$(cut -d' ' -f1 /proc/uptime)
		# Under TCG the verifier alone takes a minute or more for the
		# recorder's programs: tests wait 5 minutes for its start.
		# The scratch files in this guest's results: guests run side by
		# side and their pids repeat.
		XLAP_TEST_SCRATCH="$out/scratch" XLAP_TEST_START_SECS=${XLAP_TEST_START_SECS:-300} \
			XLAP_REQUIRE_PRIVILEGED=1 CI=true INSTA_UPDATE=no \
			"$bin" --test-threads=1 --exact "$name"
		rc=$?
		t1=$(cut -d' ' -f1 /proc/uptime)
		echo "$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }') $([ $rc = 0 ] && echo ok || echo FAILED) $name" >>"$out/it.times"
		[ "$rc" = 0 ] || failed+=("$name")
	done < <("$bin" --list "$@" 2>/dev/null | sed -n 's/: test$//p')
	if ((${#failed[@]})); then echo "failed: ${failed[*]}"; else echo ok; fi >"$out/it.status"
}

while (($#)); do
	step=$1
	shift
	case "$step" in
	record | refuse | confine) "$step" >"$out/$step.log" 2>&1 ;;
	it) it "$@" >"$out/it.log" 2>&1
		set --
		;;
	*) echo "guest.sh: unknown step $step" >&2 && exit 2 ;;
	esac
	stamp "$step"
done

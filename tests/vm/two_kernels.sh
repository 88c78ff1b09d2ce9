#!/usr/bin/env bash
# The guest's half of the two-kernel stage (tests/it/two_kernels.rs boots the
# guest with it): the guest is host b, 10.77.0.2/24 on the virtio NIC whose
# MAC is MAC, linked by a TAP device to the host's stage namespace (host a,
# 10.77.0.1). Runs on the guest's own kernel and clock; records on its own
# tmpfs (a run directory on the host's shared file system is not the
# guest's to give to the confined analysis) and copies each run to OUT.
#
#   two_kernels.sh OUT XLAP EXAMPLE MAC COUNT PERIOD_US
#
# The host drives the steps over tests/vm/clock_echo.py's control channel
# (a file written by the host on the shared file system may not show in
# the guest at once): for step NAME it asks "go NAME" and this script runs
# the guest's side of it:
#   recv  the example protocol's receiver, recorded; the host sends
#   send  the example protocol's sender, recorded; the host receives
#   stream  as send, the guest's recorder streaming its run to the host's
#         collecting recorder over the link (record --to / --collect),
#         after garbage sent to the collector from the guest's address
#   killed  as stream, the guest's recorder killed halfway through
#   end   power off
# Each step writes OUT/NAME/: ready (once the guest's recorder is attached),
# the protocol's log, record's stdout/stderr/exit, run/ (the copy) and, last,
# done.
set -uo pipefail
out=$1 xlap=$2 example=$3 mac=$4 count=$5 period=$6
here=$(cd "$(dirname "$0")" && pwd)
ctl=/tmp/xlap-ctl
mkdir -p "$out" "$ctl"
exec >"$out/guest.log" 2>&1
echo "kernel $(uname -r) boot_id $(cat /proc/sys/kernel/random/boot_id)"
ip link set lo up
modprobe virtio_net 2>/dev/null
# The NIC by its MAC: its name depends on the slot QEMU gave it.
dev=""
for _ in $(seq 100); do
	dev=$(ip -o link | awk -v m="$mac" 'index($0, "link/ether " m) { sub(":$", "", $2); print $2 }')
	[ -n "$dev" ] && break
	sleep 0.1
done
[ -n "$dev" ] || { echo "no NIC with MAC $mac"; ip -o link; echo "no NIC" >"$out/failed"; exit 1; }
ip addr add 10.77.0.2/24 dev "$dev"
ip link set "$dev" up
echo "nic $dev"
python3 "$here/clock_echo.py" serve 9123 "$ctl" &
echo ok >"$out/net.ready"

await() {
	while [ ! -e "$ctl/go.$1" ]; do sleep 0.05; done
}

# record_step NAME PID [OPTION...]: records PID into the guest's /tmp until
# it exits, then copies the run to OUT/NAME/run.
record_step() {
	local name=$1 pid=$2 d=$out/$1
	shift 2
	"$xlap" record --pid "$pid" --duration 300 --ready-file "$d/ready" -o "/tmp/$name/run" "$@" \
		>"$d/record.stdout" 2>"$d/record.stderr"
	echo $? >"$d/record.exit"
}

step_recv() {
	local d=$out/recv
	mkdir -p "$d" /tmp/recv
	"$example" recv --bind 10.77.0.2:9000 --expect "$count" --first-packet-timeout-s 120 \
		--ready-file /tmp/recv/receiver.ready --log "$d/receiver.jsonl" &
	local r=$!
	while [ ! -e /tmp/recv/receiver.ready ]; do sleep 0.05; done
	record_step recv "$r"
	wait "$r"
	echo $? >"$d/protocol.exit"
	cp -r /tmp/recv/run "$d/run"
	echo ok >"$d/done"
}

# step_send NAME [OPTION...]: the example's sender, recorded with OPTIONs.
step_send() {
	local name=$1 d=$out/$1
	shift
	mkdir -p "$d" "/tmp/$name"
	"$example" send --dest 10.77.0.1:9000 --bind 10.77.0.2:9001 --count "$count" \
		--period-us "$period" --start-file "/tmp/$name/start" --start-timeout-s 120 \
		--log "$d/sender.jsonl" &
	local s=$!
	(while [ ! -e "$d/ready" ]; do sleep 0.05; done; touch "/tmp/$name/start") &
	record_step "$name" "$s" "$@"
	wait "$s"
	echo $? >"$d/protocol.exit"
	cp -r "/tmp/$name/run" "$d/run"
	echo ok >"$d/done"
}

# stream: as send, the guest's recorder streaming its run to the host's,
# which collects it (record --to / --collect, the token in OUT/token).
step_stream() {
	# Garbage first, from this host's address: the collector must name it
	# and go on.
	python3 -c 'import os, socket; s = socket.create_connection(("10.77.0.1", 7700)); s.sendall(os.urandom(4096)); s.close()' \
		2>"$out/garbage.err"
	step_send stream --to 10.77.0.1:7700 --token-file "$out/token" --peer-wait 120
}

# killed: as stream, the guest's recorder killed (SIGKILL) halfway through
# the protocol's sending: the collector keeps what arrived.
step_killed() {
	local d=$out/killed
	mkdir -p "$d" /tmp/killed
	"$example" send --dest 10.77.0.1:9000 --bind 10.77.0.2:9001 --count "$count" \
		--period-us "$period" --start-file /tmp/killed/start --start-timeout-s 120 \
		--log "$d/sender.jsonl" &
	local s=$!
	"$xlap" record --pid "$s" --duration 300 --ready-file "$d/ready" -o /tmp/killed/run \
		--to 10.77.0.1:7700 --token-file "$out/token" >"$d/record.stdout" 2>"$d/record.stderr" &
	local r=$!
	while [ ! -e "$d/ready" ]; do sleep 0.05; done
	touch /tmp/killed/start
	# Half of the sending time, then the recorder dies.
	sleep "$(awk -v n="$count" -v p="$period" 'BEGIN { print n * p / 2e6 }')"
	kill -9 "$r"
	wait "$r"
	echo $? >"$d/record.exit"
	wait "$s"
	echo $? >"$d/protocol.exit"
	echo ok >"$d/done"
}

for step in recv send stream killed; do
	await "$step"
	case $step in
	send) step_send send ;;
	*) "step_$step" ;;
	esac
done
await end
echo "guest done"

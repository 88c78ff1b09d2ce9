#!/usr/bin/env bash
# Boots one of the kernels tests/vm/setup.sh unpacked and runs a command in
# the guest; the guest sees the host's root file system read-only (virtme-ng
# shares it over 9p, with its own tmpfs /tmp), and each --rwdir DIR
# writable at the same path.
#
#   tests/vm/boot.sh SUITE [--rwdir DIR]... -- CMD [ARG...]
#
# QEMU's TCG (no KVM: Debian's kernels stop in early boot under nested KVM
# on the project's machines); XLAP_VM_KVM=1 tries KVM; XLAP_VM_QEMU_OPTS:
# QEMU options instead of the TCG ones below. XLAP_VM_MEMORY
# (default 2G) and XLAP_VM_CPUS (2); XLAP_VM_VERBOSE=1 shows the guest's
# console. The guest's exit status is not
# reliably passed back: commands write their results into a --rwdir.
set -euo pipefail
VM_DIR="${XLAP_CACHE_DIR:-$HOME/.cache/xlap-trace}/vm"
suite="${1:?usage: boot.sh SUITE [--rwdir DIR]... -- CMD}"
shift
opts=(--memory "${XLAP_VM_MEMORY:-2G}" --cpus "${XLAP_VM_CPUS:-2}")
while (($#)); do
	case "$1" in
	--rwdir) mkdir -p "$2" && opts+=(--rwdir "$2") && shift 2 ;;
	--) shift && break ;;
	*) echo "boot.sh: unknown option $1" >&2 && exit 2 ;;
	esac
done
kdir="$VM_DIR/kernels/$suite"
[ -d "$kdir/boot" ] || { echo "boot.sh: no kernel for $suite: run tests/vm/setup.sh $suite" >&2; exit 1; }
kver=$(ls "$kdir/lib/modules" | head -n1)
# TCG on one host thread for all vCPUs (thread=single): with a thread per
# vCPU, 3 of 5 guests of Debian's 6.1 hung in the `it` selection (both
# vCPUs in "soft lockup" at the same instruction of bpf_trace_run2, the
# bpf_stats_enabled_key jump label, which `record --bpf-stats sampled`
# patches twice a second); on one thread none of 4 guests (26 tests) did,
# in the same time per test (docs/testing.md). XLAP_VM_QEMU_OPTS replaces
# these options.
if [ "${XLAP_VM_KVM:-0}" = 1 ]; then
	[ -n "${XLAP_VM_QEMU_OPTS:-}" ] && opts+=("--qemu-opts=$XLAP_VM_QEMU_OPTS")
else
	opts+=(--disable-kvm "--qemu-opts=${XLAP_VM_QEMU_OPTS:--accel tcg,thread=single}")
fi
# XLAP_VM_VERBOSE=1: the guest kernel's console too (a panic, the OOM killer).
[ "${XLAP_VM_VERBOSE:-0}" = 1 ] && opts+=(--verbose)
export PATH="$VM_DIR/venv/bin:$PATH"
exec vng -r "$kdir/boot/vmlinuz-$kver" "${opts[@]}" -- "$@"

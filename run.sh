#!/usr/bin/env bash
# xlap-trace's single entry point. On a fresh Debian 12 machine with Rust, as
# root, it installs what is missing (idempotently) and runs a just recipe:
#
#   ./run.sh demo     the main job: example protocol on a two-host stage, traced
#   ./run.sh test     the whole test suite (lint, unit, integration, privileged)
#   ./run.sh setup    only install the system packages and `just`
#   ./run.sh RECIPE   any other recipe of the justfile (bench, stage, ...)
#
# Exit codes: those of the recipe; 3 not root; 4 kernel without BTF or
# older than 5.17.
set -euo pipefail
cd "$(dirname "$0")"

die() {
	echo "run.sh: $1" >&2
	exit "$2"
}

[ "$(id -u)" -eq 0 ] ||
	die "needs root (it loads BPF and builds network namespaces): run it as root, e.g. sudo -E ./run.sh ${1:-demo}" 3
[ -e /sys/kernel/btf/vmlinux ] ||
	die "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): xlap-trace needs a kernel built with CONFIG_DEBUG_INFO_BTF=y" 4
# bpf_loop: the capture loads on Linux 5.17 and later (docs/stamp-points.md:
# minimum kernel per feature).
IFS=. read -r kmajor kminor _ <<<"$(uname -r)"
kminor=${kminor%%[!0-9]*}
((kmajor > 5 || (kmajor == 5 && kminor >= 17))) ||
	die "this kernel is Linux $(uname -r); xlap-trace needs 5.17 or later (6.12+ for every point)" 4
export PATH="$HOME/.cargo/bin:$PATH"
command -v cargo >/dev/null || die "cargo not found: install Rust (rustup, stable) first" 1

# System packages: the BPF toolchain, USDT headers, network tools (ethtool sets
# the stage's GRO/NAPI modes), test peers.
# chromium renders the HTML report in its test; python3-venv hosts the
# pandas baseline of bench-analysis; bpftrace is the perturbation bench's
# anchor (a hand-written script); capsh (libcap2-bin) runs the least-privilege
# test, python3 its third-party-style senders; ping the stage tests; tcpdump
# is the outside account of the link in the run-end test, strace of the
# finishing step's confinement (tests/it/sandbox.rs);
# dnsperf and dnsmasq are a request/response pair we did not write
# (tests/it/exchange.rs); golang-go builds the conformance matrix's Go program (tests/go); Spark
# (pyspark, the dataset's reader test) runs on the JVM; QEMU, kmod,
# busybox, zstd and Debian's archive keys run the kernel matrix (tests/vm:
# Debian's kernels unpacked, booted with virtme-ng from PyPI).
# tshark (with capinfos): the outside reader of `export --pcapng`
# (tests/it/pcapng_export.rs); installed non-interactively, so debconf
# keeps its default and non-root capture stays off. prometheus
# (with promtool) scrapes `record --metrics` and runs the Grafana
# dashboard's queries (tests/it/prometheus_scrape.rs: the test starts its
# own server on loopback, never the package's service).
PACKAGES=(clang llvm libbpf-dev bpftool libclang-dev clang-format systemtap-sdt-dev
	build-essential pkg-config iproute2 iperf3 sockperf ethtool chromium python3-venv bpftrace
	libcap2-bin python3 iputils-ping golang-go openjdk-17-jre-headless
	qemu-system-x86 kmod busybox-static zstd debian-archive-keyring tcpdump strace tshark
	dnsperf dnsmasq-base prometheus)
missing=()
for p in "${PACKAGES[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "run.sh: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# just is not in Debian 12: build it from crates.io once.
if ! command -v just >/dev/null; then
	echo "run.sh: installing just from crates.io"
	env -u CARGO_TARGET_DIR cargo install --locked --quiet just
fi

recipe="${1:-demo}"
[ "$recipe" = setup ] && exit 0
# Python packages from PyPI, outside the system Python: Spark for the
# dataset's reader test (test), the pandas and polars baselines of
# bench-analysis.
case "$recipe" in
test) wheels=(pyspark) ;;
bench-analysis) wheels=(pandas pyarrow polars) ;;
*) wheels=() ;;
esac
if ((${#wheels[@]})); then
	venv="${XLAP_CACHE_DIR:-$HOME/.cache/xlap-trace}/venv"
	imports=$(IFS=,; echo "${wheels[*]}")
	if ! "$venv/bin/python" -c "import $imports" 2>/dev/null; then
		echo "run.sh: installing ${wheels[*]} into $venv"
		python3 -m venv "$venv"
		"$venv/bin/pip" install --quiet "${wheels[@]}"
	fi
	export XLAP_PYTHON="$venv/bin/python"
fi
shift || true
exec just "$recipe" "$@"

#!/usr/bin/env bash
# What the kernel matrix (tests/vm/matrix.sh, `just vm-matrix`) needs, fetched
# once and idempotently: QEMU and friends from Debian, virtme-ng (PyPI) in
# its own venv, and Debian's kernel packages unpacked (never installed)
# under the build cache.
#
#   tests/vm/setup.sh [SUITE...]    default: bookworm bookworm-backports bullseye
#
# Cache: ${XLAP_CACHE_DIR:-$HOME/.cache/xlap-trace}/vm: venv/, apt/SUITE/ (a
# private apt state per suite: the system's sources are left alone),
# kernels/SUITE/{boot,lib/modules} (depmod run on the unpacked tree; the
# guest finds the modules next to vmlinuz, the host's /lib/modules is not
# touched). A suite's kernel package is chosen once (apt/SUITE/kernel) and
# kept: delete that file to take the suite's newest.
set -euo pipefail

VM_DIR="${XLAP_CACHE_DIR:-$HOME/.cache/xlap-trace}/vm"
VNG_VERSION="${VNG_VERSION:-1.42}"
MIRROR="${XLAP_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
suites=("$@")
((${#suites[@]})) || suites=(bookworm bookworm-backports bullseye)
mkdir -p "$VM_DIR"

missing=()
for p in qemu-system-x86 kmod busybox-static python3-venv zstd debian-archive-keyring; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
	echo "vm: installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$VM_DIR/venv/bin/vng" ]; then
	echo "vm: installing virtme-ng $VNG_VERSION into $VM_DIR/venv"
	python3 -m venv "$VM_DIR/venv"
	"$VM_DIR/venv/bin/pip" install -q "virtme-ng==$VNG_VERSION"
fi

for suite in "${suites[@]}"; do
	kdir="$VM_DIR/kernels/$suite"
	if [ ! -d "$kdir/boot" ]; then
		adir="$VM_DIR/apt/$suite"
		mkdir -p "$adir/lists/partial" "$adir/archives/partial"
		echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $MIRROR $suite main" >"$adir/sources.list"
		aopts=(-o "Dir::Etc::sourcelist=$adir/sources.list" -o "Dir::Etc::sourceparts=-"
			-o "Dir::State::Lists=$adir/lists" -o "Dir::Cache::archives=$adir/archives"
			-o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=" -o "APT::Get::List-Cleanup=0"
			-o "APT::Sandbox::User=root")
		if [ ! -s "$adir/kernel" ]; then
			apt-get "${aopts[@]}" -qq update
			# The flavour's meta package names the suite's current ABI (in a
			# -backports suite, the backport).
			pkg=$(apt-cache "${aopts[@]}" depends linux-image-amd64 2>/dev/null |
				sed -n 's/^ *Depends: \(linux-image-[0-9][^ ]*-amd64\)$/\1/p' | sort -V | tail -n1)
			[ -n "$pkg" ] || { echo "vm: no linux-image-*-amd64 in $suite" >&2; exit 1; }
			echo "$pkg" >"$adir/kernel"
		fi
		pkg=$(cat "$adir/kernel")
		if ! ls "$adir/archives/${pkg}"_*.deb >/dev/null 2>&1; then
			echo "vm: fetching $pkg ($suite)"
			(cd "$adir/archives" && apt-get "${aopts[@]}" -qq download "$pkg")
		fi
		rm -rf "$kdir.tmp" && mkdir -p "$kdir.tmp"
		dpkg -x "$(ls "$adir/archives/${pkg}"_*.deb | head -n1)" "$kdir.tmp"
		kver=$(ls "$kdir.tmp/lib/modules" | head -n1)
		depmod -b "$kdir.tmp" "$kver"
		rm -rf "$kdir" && mv "$kdir.tmp" "$kdir"
	fi
	kver=$(ls "$kdir/lib/modules" | head -n1)
	echo "vm: $suite: $kver"
done

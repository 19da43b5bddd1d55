#!/usr/bin/env bash
# arm64.sh: build vmarena for linux/arm64 (Ascend hosts are often aarch64) and
# run the device bindings' tests there (acl/ascend, acl/cuda, and the HCCL
# and NCCL bindings, acl/hccl and acl/nccl), under
# qemu-user emulation: each test binary is cross-compiled with GOARCH=arm64,
# and the tests build their C test doubles with the aarch64 cross compiler.
# Their results go through go run ./internal/skipcheck, as .ci/run's tests
# do: only the tests that need a real device may skip.
#
# Self-contained: it installs qemu-user and gcc-aarch64-linux-gnu with apt-get
# when they are missing (as root, as in CI; Debian or Ubuntu). From anywhere:
#
#	.ci/arm64.sh
#
# Environment:
#	ARM64_CGO       CGO_ENABLED values to test with (default "0 1")
#	ARM64_PKGS      packages to build and vet for arm64 (default ./...)
#	ARM64_TESTFLAGS flags for the test binary (default -test.count=1)
#	ARM64_TIMEOUT   seconds each test binary may run under qemu (default 600)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$SECONDS

need=()
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if ((${#need[@]})); then
	echo "== installing ${need[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	echo "   ($((SECONDS - start)) s)"
fi
qemu=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)
sysroot=/usr/aarch64-linux-gnu
pkgs=${ARM64_PKGS:-./...}

echo "== build and vet for linux/arm64, CGO_ENABLED=0"
GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build $pkgs
GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go vet $pkgs

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The skip check of .ci/run, built for this machine: each run below must skip
# only what needs a device (a double that does not build fails).
go build -o "$work/skipcheck" ./internal/skipcheck
for cgo in ${ARM64_CGO:-0 1}; do
	for pkg in ascend cuda hccl nccl; do
		echo "== acl/$pkg tests on linux/arm64 under $(basename "$qemu"), CGO_ENABLED=$cgo"
		t0=$SECONDS
		GOOS=linux GOARCH=arm64 CGO_ENABLED=$cgo CC=aarch64-linux-gnu-gcc \
			go test -c -o "$work/$pkg-cgo$cgo.test" ./acl/$pkg
		# The tests run in their package directory (they read testdata/) and
		# build their double with $CC: qemu-user runs that x86 compiler natively.
		# timeout signals its whole process group, so that a fork that hangs
		# under qemu-user (a child deadlocked before its exec) fails the run
		# instead of holding it forever.
		(cd acl/$pkg && CC=aarch64-linux-gnu-gcc timeout -k 30 "${ARM64_TIMEOUT:-600}" "$qemu" -L "$sysroot" \
			"$work/$pkg-cgo$cgo.test" -test.v=test2json ${ARM64_TESTFLAGS:--test.count=1}) |
			go tool test2json -t -p "acl/$pkg (linux/arm64, CGO_ENABLED=$cgo)" | "$work/skipcheck"
		echo "   ($((SECONDS - t0)) s)"
	done
done
echo "== arm64 done in $((SECONDS - start)) s"

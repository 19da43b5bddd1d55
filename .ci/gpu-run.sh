#!/usr/bin/env bash
# gpu-run.sh: the one prepared check of a real NVIDIA GPU, in about five
# minutes, with the binaries .ci/gpu-build.sh made. It writes everything to
# $OUT (default gpu/out):
#
#   hardware.txt, hardware.md   TestHardware: the driver contract, streams and
#                               events, foreign streams and the arena suite on
#                               the GPU, fresh memory across processes, and
#                               every call's cost per chunk, with an access
#                               call over 1, 8, 32 and 64 adjacent mappings
#                               (docs/cuda.md)
#   hardware-launch.txt         kernel-launch latency, eager and a captured
#                               graph, idle and while another thread maps,
#                               sets access and unmaps (docs/model.md)
#   bench-*.txt, bench-*/       the benchmark suite on the GPU: kv with all
#                               strategies, and the whole suite once
#                               (docs/benchmarks.md)
#   profile-cuda.json           a device-model profile calibrated on the GPU
#                               (docs/model.md)
#   model-kv.txt, model-kv/     the kv rows again on the device model with
#                               that profile, under both readings
#
# Each step has its own time limit, so one that hangs cannot take the rest
# with it; a step that fails is reported and the script goes on. The limits
# add up to under five minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=gpu/bin
out=${OUT:-gpu/out}
mkdir -p "$out"
status=0
step() { # step NAME SECONDS CMD...: run CMD with a limit, output to $out/NAME.txt
	local name=$1 limit=$2
	shift 2
	echo "== $name (limit ${limit}s)"
	timeout "$limit" "$@" >"$out/$name.txt" 2>&1
	local rc=$?
	tail -n 5 "$out/$name.txt"
	if [ $rc -ne 0 ]; then
		echo "   $name failed: exit $rc"
		status=1
	fi
}
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
step hardware 140 env VMARENA_REQUIRE_GPU=1 VMARENA_HW_FRESH_GIB=16 \
	"$bin/cuda.test" -test.run Hardware -test.v -cuda.hwout="$out/hardware.md"
step bench-kv-2mib 45 "$bin/bench" -device cuda -workloads kv -strategies all -micro=false -progress off -out "$out/bench-kv-2mib"
step bench-suite 45 "$bin/bench" -device cuda -progress off -out "$out/bench-suite"
step calibrate 30 "$bin/bench" -calibrate -device cuda -quick -profile-out "$out/profile-cuda.json"
if [ -s "$out/profile-cuda.json" ]; then
	step model-kv 35 "$bin/bench" -device "model:$out/profile-cuda.json" -workloads kv -strategies arena,paged,realloc,caching \
		-readings both -micro=false -progress off -out "$out/model-kv"
fi
echo "== done: results in $out"
exit $status

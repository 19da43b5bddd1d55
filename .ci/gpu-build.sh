#!/usr/bin/env bash
# gpu-build.sh: build, on any Linux machine with Go, the binaries that
# .ci/gpu-run.sh runs on a machine with an NVIDIA GPU and no Go: the CUDA
# binding's test binary (TestHardware) and the benchmark suite, both static
# enough to copy (CGO_ENABLED=0; they load libcuda.so.1 at run time).
#
#	.ci/gpu-build.sh            # writes gpu/bin/ (git-ignored)
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu/bin
mkdir -p "$out"
CGO_ENABLED=0 go test -c -o "$out/cuda.test" ./acl/cuda
CGO_ENABLED=0 go build -o "$out/bench" ./bench
echo "built $out/cuda.test and $out/bench; run .ci/gpu-run.sh on the GPU machine"

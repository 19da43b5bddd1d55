package main

// how says how CI runs a command the docs show.
type how int

const (
	// asWritten: this program runs it as the docs show it, and it must
	// succeed (a go test that runs no test fails).
	asWritten how = iota
	// scaledDown: this program runs it with flags added at the end (later
	// flags win), flags the docs or go test document; it must succeed.
	scaledDown
	// needsDevice: it needs an NPU or GPU (or what a run on one wrote). This
	// program runs it as written; without the device it must fail with
	// want, a message the docs show, and not, say, with a compile error.
	needsDevice
	// byCI: another step of .ci/run runs it, or a superset of it, at the
	// same or a smaller documented scale; line is that step's command, as
	// .ci/run spells it.
	byCI
	// inNewModule: a command a user runs in a module of their own (go get).
	// This program makes one (go mod init, in a directory of its own) whose
	// go.mod replaces this module with the copy of the tree and whose go.sum
	// is the tree's, and runs the command there as written, with no module
	// proxy: the proxy may hold no release of this commit, and the
	// replacement makes the command resolve to this tree as it would to one.
	// Dependencies come from the module cache (CI's setup step downloads
	// them), checked against the tree's go.sum. Then it builds and runs a
	// program that imports arena in that module, which must allocate: the
	// module the command got works.
	inNewModule
)

// An entry says how one command is run in CI.
type entry struct {
	cmd   string // the command, as extract returns it
	how   how
	flags string // scaledDown: what is added
	want  string // needsDevice: the documented failure
	line  string // byCI: the command of .ci/run
}

// The lines of .ci/run that run documented commands, or supersets of them.
const (
	ciTests     = "go test -race -count=1 -timeout 30m -json ./..."
	ciRepeat    = "go test -count=2 -cpu 1,4 -timeout 30m ./..."
	ciBench     = "go test -run '^$' -bench . -benchtime=1x ./..."
	ciModel     = "VMARENA_MODEL_SEEDS=8 VMARENA_FAULT_OPS=200 VMARENA_RANDOM_SEEDS=32 go test -count=1 -timeout 30m -run '^TestModel' -v ./arena"
	ciFuzz      = "go test -run '^$' -fuzz '^FuzzModel$' -fuzztime=4000x -fuzzminimizetime=100x ./arena"
	ciStress    = "VMARENA_STRESS_ROUNDS=2000 go test -race -count=1 -run '^TestStress$' -v ./arena"
	ciBadInput  = "go test -count=1 -run '^(TestBadInput|TestZeroConfig|TestRegression.*|TestTrapStale|TestTenantIsolation|TestFreshChunksScrubbed|TestScrubFailureKeepsChunkDirty|TestBudgetIsolation|TestScrubOn.*|TestGetForPrefersOwnChunk|TestMapErrMapped)$' -v ./arena ./chunk"
	ciPressure  = "VMARENA_PRESSURE_ROUNDS=100000 VMARENA_KERNEL_MS=3000 go test -race -count=1 -v"
	ciShareFuzz = `go test -run '^$' -fuzz "^$f\$" -fuzztime=200x -fuzzminimizetime=20x ./arena`
	ciProfFuzz  = "go test -run '^$' -fuzz '^FuzzParseProfile$' -fuzztime=20000x -fuzzminimizetime=100x ./acl/model # a profile file (model:PATH)"
	ciArm64     = "bash .ci/arm64.sh"
	ciThisCheck = "go run ./internal/doccmds"

	noNPU      = "no ACL runtime (libascendcl.so) could be loaded"
	noGPU      = "libcuda.so.1: cannot open shared object file"
	quickBench = "-quick -count 1"
	// quickOne is quickBench under one reading of the model, for the
	// commands behind benchmarks.md's current figures: their other reading
	// is the same code, which the commands above run.
	quickOne = quickBench + " -readings profile"
	// quickServer scales the server-size runs down past their own sizes.
	quickServer = quickOne + " -kv-slots 4 -kv-layers 4 -kv-hidden 512 -kv-requests 8"
	// quickTRT scales the fixed-length (1024/1024) runs down to two sequences.
	quickTRT = quickOne + " -kv-slots 2 -kv-requests 2"
)

// table maps every command of README.md and docs/ to how CI runs it.
var table = []entry{
	// Set up, and the examples.
	{cmd: "go get github.com/vmarena/vmarena@latest", how: inNewModule},
	{cmd: "go run ./examples/kvcache", how: asWritten},
	{cmd: "go run ./examples/tour", how: asWritten},
	{cmd: "go run ./examples/handoff", how: asWritten},
	{cmd: "go run ./examples/serve", how: asWritten},
	{cmd: "go run ./examples/serve -device model:h200", how: asWritten},
	{cmd: "go test ./internal/doclinks", how: byCI, line: "go test -count=1 ./internal/doclinks"},
	{cmd: "go test ./examples/serve", how: byCI, line: ciTests},
	{cmd: "go test ./...", how: byCI, line: ciTests},
	{cmd: "go test -race ./...", how: byCI, line: ciTests},
	{cmd: "go test -count=2 -cpu 1,4 ./...", how: byCI, line: ciRepeat},
	{cmd: ".ci/run", how: byCI, line: ciThisCheck}, // this check is a step of it
	{cmd: ".ci/arm64.sh", how: byCI, line: ciArm64},
	{cmd: "go run ./internal/doccmds", how: byCI, line: ciThisCheck},
	{cmd: "go run ./internal/doccmds -list", how: asWritten},
	{cmd: "go test -race -json ./...", how: byCI, line: ciTests},
	{cmd: "go run ./internal/skipcheck", how: byCI, line: ciTests + " | go run ./internal/skipcheck"},
	{cmd: "go test -json ./acl/ascend | go run ./internal/skipcheck -v", how: asWritten},
	{cmd: "go test ./internal/boundary", how: byCI, line: ciTests},
	{cmd: "go test ./internal/leakgate", how: byCI, line: ciTests},
	{cmd: "go test ./internal/apicheck -update", how: asWritten},

	// The benchmark suite.
	// The full suite takes minutes (2.5–3 on the host driver, 1.7–2.6 on the
	// model, on a 2-core machine): CI runs it in quick mode, which does what
	// the full run does at small sizes (bench's TestQuick checks that).
	{cmd: "go run ./bench", how: scaledDown, flags: "-quick"},
	{cmd: "go run ./bench -device model:h200", how: scaledDown, flags: "-quick"},
	{cmd: "go run ./bench -quick", how: asWritten},
	{cmd: "go run ./bench -h", how: asWritten},
	{cmd: "go run ./bench -calibrate", how: asWritten}, // the host driver here: seconds
	{cmd: "go run ./bench -device model:h200 -strategies all -count 3 -img docs/img/model", how: scaledDown, flags: quickBench},
	{cmd: "go run ./bench -count 3 -img docs/img/host", how: scaledDown, flags: quickBench},
	{cmd: "go run ./bench -device model:h200 -strategies all -count 3", how: scaledDown, flags: quickBench},
	{cmd: "go run ./bench -device model:h200 -workloads kv -count 3 -micro=false -strategies arena,realloc", how: scaledDown, flags: quickBench},
	{cmd: "go run ./bench -device model:h200 -workloads kv -strategies arena -readings profile -micro=false -register run -chunk 64MiB", how: scaledDown, flags: quickBench + " -chunk 16MiB"},
	{cmd: "go run ./bench -device model:h200 -strategies all -readings profile -img docs/img/model", how: scaledDown, flags: quickBench},
	{cmd: "go run ./bench -device model:h200 -workloads kv -strategies arena,realloc -chunk 16MiB", how: scaledDown, flags: quickBench},
	{cmd: "go run ./bench -device model:h200 -strategies arena-eager,realloc -kv-budget-factor 0", how: scaledDown, flags: quickBench},
	// The current figures of benchmarks.md: the server-size and fixed-length
	// runs are scaled down past their own sizes too (later flags win).
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 15 -strategies arena,paged -kv-compute 1ms", how: scaledDown, flags: quickOne},
	{cmd: "taskset -c 0 go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms", how: scaledDown, flags: quickOne},
	{cmd: "taskset -c 0 go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 128 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -chunk 16MiB", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256 -chunk 4MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256 -kv-tail 2MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 256 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256 -chunk 16MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 128 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 9 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 256 -kv-prompt 64:1024 -kv-gen 32:256 -kv-tail 16MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 9 -strategies arena,paged,caching,realloc -kv-compute 1ms -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 128 -kv-prompt 64:1024 -kv-gen 32:256", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 128 -kv-prompt 64:1024 -kv-gen 32:256 -chunk 16MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads models -micro=false -count 3 -strategies arena,paged,caching", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 64 -kv-prompt 64:1024 -kv-gen 32:256 -kv-tail 4MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms -kv-slots 64 -kv-layers 80 -kv-hidden 8192 -kv-requests 128 -kv-prompt 64:1024 -kv-gen 32:256 -kv-tail 4MiB", how: scaledDown, flags: quickServer},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-tail 2MiB", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged,caching,realloc -kv-compute 1ms -kv-tail 2MiB", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads models -micro=false -count 3 -strategies arena,paged,caching -kv-tail 2MiB", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads models -micro=false -count 3 -strategies arena,paged,caching -kv-tail 8MiB", how: scaledDown, flags: quickOne},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged -kv-prompt 1024:1024 -kv-gen 1024:1024 -kv-slots 16 -kv-requests 32", how: scaledDown, flags: quickTRT},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged -kv-prompt 1024:1024 -kv-gen 1024:1024 -kv-slots 16 -kv-requests 32 -chunk 2MiB", how: scaledDown, flags: quickTRT},
	{cmd: "go run ./bench -device model:h200 -workloads kv -micro=false -count 3 -strategies arena,paged -kv-prompt 1024:1024 -kv-gen 1024:1024 -kv-slots 16 -kv-requests 32 -chunk 16MiB", how: scaledDown, flags: quickTRT},
	{cmd: "go run ./bench -workloads swap -micro=false -swap-size 1GiB -swap-reps 5", how: scaledDown, flags: "-swap-size 128MiB -swap-reps 3"},
	{cmd: "go test ./bench", how: byCI, line: ciTests},
	{cmd: "VMARENA_OFFLOAD_MIB=1024 go test ./arena -run '^$' -bench OffloadVsCopy -benchtime 1x", how: scaledDown, flags: "-short"},
	{cmd: "go run ./bench -calibrate -device cuda", how: needsDevice, want: noGPU},
	{cmd: "go run ./bench -calibrate -device cuda -profile-out h200-mine.json", how: needsDevice, want: noGPU},
	{cmd: "VMARENA_DEVICE=model:h200-mine.json go run ./bench", how: needsDevice, want: "model: profile h200-mine.json: open h200-mine.json: no such file or directory"},
	{cmd: "VMARENA_DEVICE=cuda go run ./bench", how: needsDevice, want: noGPU},
	{cmd: "VMARENA_DEVICE=ascend go run ./bench", how: needsDevice, want: noNPU},
	{cmd: "go run ./bench -device ascend:1 -count 3 -out npu/", how: needsDevice, want: noNPU},
	{cmd: "go run ./bench -calibrate -device ascend -profile-out ascend-910b.json", how: needsDevice, want: noNPU},
	{cmd: "go run ./bench -calibrate -device ascend -quick", how: needsDevice, want: noNPU},
	{cmd: ".ci/gpu-build.sh", how: asWritten},
	{cmd: ".ci/gpu-run.sh", how: needsDevice, want: noGPU},

	// Ascend.
	{cmd: "VMARENA_REQUIRE_NPU=1 go test -run NPU -v ./acl/ascend", how: needsDevice, want: noNPU},
	{cmd: "mkdir -p /tmp/fakeacl && gcc -shared -fPIC -pthread -o /tmp/fakeacl/libascendcl.so acl/ascend/testdata/fakeacl.c", how: asWritten},
	{cmd: "VMARENA_ASCEND_LIBRARY=/tmp/fakeacl VMARENA_REQUIRE_NPU=1 go test -run NPU -v ./acl/ascend", how: asWritten},
	{cmd: "go test -run NPU ./acl/ascend", how: asWritten},
	{cmd: "go test -run NPUShareAcrossProcesses ./acl/ascend", how: asWritten},
	{cmd: "go test ./acl/ascend", how: byCI, line: ciTests},
	{cmd: "go test -run '^$' -bench . ./acl/ascend", how: byCI, line: ciBench},

	// CUDA.
	{cmd: "go test ./acl/cuda/...", how: asWritten},
	{cmd: "CGO_ENABLED=1 go test -race ./acl/cuda/...", how: byCI, line: ciTests},
	{cmd: "CGO_ENABLED=0 go test ./acl/cuda/...", how: asWritten},
	{cmd: "CGO_ENABLED=0 GOARCH=arm64 go test -c -o /dev/null ./acl/cuda", how: asWritten},
	{cmd: "go test -c -o cuda.test ./acl/cuda", how: asWritten},
	{cmd: "CGO_ENABLED=0 go test -c -o cuda.test ./acl/cuda", how: asWritten},
	{cmd: "VMARENA_REQUIRE_GPU=1 go test ./acl/cuda -run 'Hardware$' -v", how: needsDevice, want: noGPU},
	{cmd: "VMARENA_REQUIRE_GPU=1 ./cuda.test -test.run 'Hardware$' -test.v", how: needsDevice, want: noGPU},
	{cmd: "VMARENA_REQUIRE_GPU=1 ./cuda.test -test.run Hardware -test.v -cuda.hwout=results.md", how: needsDevice, want: noGPU},
	{cmd: "go test -run Hardware/ShareAcrossProcesses ./acl/cuda", how: asWritten},
	{cmd: "go test ./acl/cuda -run '^$' -bench CallOverhead", how: byCI, line: ciBench},

	// The device model.
	{cmd: "go test ./acl/model -run Conformance", how: asWritten},
	{cmd: "go test ./acl/model", how: byCI, line: ciTests},

	// Reliability: the table's commands run in the tests of .ci/run (every
	// test of those packages, under -race) or its reliability steps.
	{cmd: "go test -run '^TestModel$' -v ./arena", how: byCI, line: ciTests},
	{cmd: "VMARENA_FAULT_OPS=200 go test -run '^TestModelFaultEveryCall$' -v ./arena", how: byCI, line: ciModel},
	{cmd: "go test -run '^TestModelRandomFaults$' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run '^$' -fuzz '^FuzzModel$' -fuzztime=4000x -fuzzminimizetime=100x ./arena", how: byCI, line: ciFuzz},
	{cmd: "go test -race -run '^TestStress$' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'Stream|Waiting|Ordered|Event' -v ./arena ./chunk", how: byCI, line: ciTests},
	{cmd: "go test -run 'TestPressure.*EverySchedule' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'Relief|FailedGrowth|LockFree|CopiesRace' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'RefillYields|WakeRefill' -v ./arena", how: byCI, line: ciTests},
	{cmd: "VMARENA_PRESSURE_ROUNDS=100000 go test -race -run '^TestPressureStress$' -v ./arena", how: byCI, line: ciPressure},
	{cmd: "VMARENA_KERNEL_MS=3000 go test -race -run '^TestPressureKernelStress$' -v ./arena", how: byCI, line: ciPressure},
	{cmd: "go test -run 'NotWait|HoldsNothing|NeverWait|Honours|WokenByAnother|EndsThe|InFlight|AllHolders' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'Stale' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'HandedOn' ./arena ./acl/ipc", how: byCI, line: ciTests},
	{cmd: "go test -run '^$' -fuzz '^FuzzShareHandOn$' -fuzztime=200x ./arena", how: byCI, line: ciShareFuzz},
	{cmd: "go test -run '^$' -fuzz '^FuzzParseProfile$' -fuzztime=20000x ./acl/model", how: byCI, line: ciProfFuzz},
	{cmd: "go test -run 'GrowContext|Wait' -v ./arena ./chunk", how: byCI, line: ciTests},
	{cmd: "go test -run 'FirstComeFirstServed|WaitsForItsStreamOnly|ShrinkOrderedByStream|CountsSettledChunks|WaitsOutAReliefsUnmap|WaitsForASharedFree|AttachRacesPoolUnmap|IdleWorkerParks' -v ./arena ./chunk", how: byCI, line: ciTests},
	{cmd: "go test -run 'Share|Import' -v ./arena ./chunk ./acl/host", how: byCI, line: ciTests},
	{cmd: "go test -run '^TestBadInput$' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'TrapStale' -v ./arena; go test -run 'ShrunkTail' -v ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run 'Isolation|Fresh|Tenant' -v ./arena ./chunk; go test -run 'Scrub' -v ./arena ./chunk", how: byCI, line: ciTests},
	{cmd: "go test -run 'Regression' -v ./arena ./chunk", how: byCI, line: ciTests},
	{cmd: "go test -run '^$' -bench BenchmarkScrub -benchtime=100x ./chunk", how: asWritten},
	// A soak: the reliability step runs it at CI's scale.
	{cmd: "VMARENA_FAULT_OPS=500 VMARENA_RANDOM_SEEDS=1000 go test -run '^TestModel' -v ./arena", how: byCI, line: ciModel},
	{cmd: ciModel, how: byCI, line: ciModel},
	{cmd: ciStress, how: byCI, line: ciStress},
	{cmd: ciBadInput, how: byCI, line: ciBadInput},

	// Sharing.
	{cmd: "go test -run Hostile ./arena", how: byCI, line: ciTests},
	{cmd: "go test -run '^$' -bench 'Handoff|ImportChunk' ./arena", how: byCI, line: ciBench},
	{cmd: "go test -run '^$' -bench . ./arena", how: byCI, line: ciBench},
}

#!/bin/bash
# Calls on a lent GPU machine (the device tool's run, `carry: [".whl"]` from
# tests/gpu/wheels.sh): `bash tests/gpu/lease.sh STEP...`, each step with its own limit so
# that one that hangs leaves time for the rest; logs under $OUT, a summary printed last.
#   test     make test-gpu (16 workers; 185-215 s on an H200 at 3,824 tests, ~280 s expected at 5,072)
#   figures  tests/gpu/device_figures.py: the figures of docs/benchmarks.md, "On a GPU"
#   ncu      the rotation kernels' Nsight Compute sections, source counters included, beside
#            torch.compile's Triton kernel of the formula (tests/gpu/profile_rotation.py)
#   probe    tests/gpu/probe_bounds.py: the rotation's memory pattern without its arithmetic
#   bench    posenc bench --gpu
#   variants tests/gpu/kernel_variants.py: the rotation kernel against its variants (an A/B)
# Default: test figures (at most 500 s: one run within the device's 600 s a command); then probe,
# ncu, bench. A step past its limit gets SIGINT first (pytest prints the failures so far, a script
# its traceback), then SIGKILL 20 s later.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:/tmp/site
summary="$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv; git log --oneline -1; } > "$summary" 2>&1
limit() { timeout -s INT -k 20 "$@"; }
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(test figures)
for step in "${steps[@]}"; do
	case $step in
	test) limit 330 make test-gpu GPU_PYTHON=python3 GPU_WORKERS=16 > "$OUT/test-gpu.txt" 2>&1 ;;
	figures) limit 170 python3 -u tests/gpu/device_figures.py > "$OUT/figures.txt" 2>&1 ;;
	ncu) limit 200 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
		--section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats --section SchedulerStats \
		--section LaunchStats --section InstructionStats --section SourceCounters \
		python3 tests/gpu/profile_rotation.py > "$OUT/ncu.txt" 2>&1 ;;
	probe) limit 100 python3 -u tests/gpu/probe_bounds.py > "$OUT/probe.txt" 2>&1 ;;
	bench) limit 250 python3 -u -m posenc.cli bench --gpu > "$OUT/bench.txt" 2>&1 ;;
	variants) limit 200 python3 -u tests/gpu/kernel_variants.py > "$OUT/variants.txt" 2>&1 ;;
	*) echo "unknown step $step" ;;
	esac
	echo "$step: exit $?" >> "$summary"
done
cat "$summary"
[ -f "$OUT/test-gpu.txt" ] && grep -E "^(FAILED|ERROR) |^=+ .*[0-9]+ (passed|failed|errors?)|^make.*(Error|Interrupt)" "$OUT/test-gpu.txt" | cut -c1-250 | tail -60
[ -f "$OUT/figures.txt" ] && cut -c1-250 "$OUT/figures.txt"
[ -f "$OUT/probe.txt" ] && cut -c1-200 "$OUT/probe.txt"
[ -f "$OUT/ncu.txt" ] && grep -E "Context [0-9]+, Stream|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per Thread|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Executed Instructions  |Warp Cycles Per Issued|spends [0-9.]+ cycles" "$OUT/ncu.txt" | cut -c1-160 | head -80
[ -f "$OUT/variants.txt" ] && grep -E "^bits|in place|compiled|Error" "$OUT/variants.txt" | cut -c1-400
[ -f "$OUT/bench.txt" ] && grep -E "GPU" "$OUT/bench.txt" | cut -c1-200 | head -60
exit 0

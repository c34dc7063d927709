#!/usr/bin/env bash
# Runs the shim's C tests against the fake libcuda with the shim preloaded, counts the
# PASS/FAIL lines (a test program that dies counts as one failure) and ends with
# "N passed, M failed"; exits non-zero when anything failed.
set -u
BUILD=${1:?usage: run_tests.sh BUILD_DIR}
BUILD=$(cd "$BUILD" && pwd)
SHIM=$BUILD/libalnair-intercept.so
WORK=$(mktemp -d /tmp/alnair-intercept-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
passed=0
failed=0

run() { # name env... -- program args...
    local name=$1
    shift
    local out=$WORK/$name.out
    env -i PATH="$PATH" LD_LIBRARY_PATH="$BUILD/fake" LD_PRELOAD="$SHIM" "$@" >"$out" 2>&1
    local rc=$?
    cat "$out"
    local p f
    p=$(grep -c '^PASS ' "$out")
    f=$(grep -c '^FAIL ' "$out")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $name: exited with status $rc"
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
}

run paths ALNAIR_GPU_MEMORY_LIMIT_MIB=64 ALNAIR_VGPU_REGION="$WORK/paths.region" \
    FAKE_CUDA_DEVICES=2 "$BUILD/tests/test_paths"
run dynamic ALNAIR_GPU_MEMORY_LIMIT_MIB=64 ALNAIR_VGPU_REGION="$WORK/dynamic.region" \
    CUDA_VISIBLE_DEVICES=0 FAKE_CUDA_DEVICES=1 "$BUILD/tests/test_dynamic"
run concurrency ALNAIR_GPU_MEMORY_LIMIT_BYTES=67108864 ALNAIR_VGPU_REGION="$WORK/conc.region" \
    FAKE_CUDA_STATS="$WORK/conc.stats" CUDA_VISIBLE_DEVICES=0 FAKE_CUDA_DEVICES=1 \
    "$BUILD/tests/test_concurrency"
run next "$BUILD/tests/test_next"
for pct in 30 60; do
    # the 30% run also drops the shim's registry connection midway (TEST_REGISTRY_RESTART)
    restart=$([ "$pct" = 30 ] && echo TEST_REGISTRY_RESTART=1 || echo TEST_REGISTRY_RESTART_OFF=1)
    run "compute$pct" "$restart" ALNAIR_GPU_COMPUTE_PCT=$pct ALNAIR_REGISTRY_SOCKET="$WORK/reg$pct.sock" \
        ALNAIR_VGPU_REGION="$WORK/compute$pct.region" CUDA_VISIBLE_DEVICES=0 \
        FAKE_CUDA_KERNEL_US=100 "$BUILD/tests/test_compute"
done
run compute_ex ALNAIR_GPU_COMPUTE_PCT=40 ALNAIR_REGISTRY_SOCKET="$WORK/regex.sock" \
    ALNAIR_VGPU_REGION="$WORK/computeex.region" CUDA_VISIBLE_DEVICES=0 \
    FAKE_CUDA_KERNEL_US=100 "$BUILD/tests/test_compute" ex
run compute_graph ALNAIR_GPU_COMPUTE_PCT=50 ALNAIR_REGISTRY_SOCKET="$WORK/reggraph.sock" \
    ALNAIR_VGPU_REGION="$WORK/computegraph.region" CUDA_VISIBLE_DEVICES=0 \
    FAKE_CUDA_KERNEL_US=100 "$BUILD/tests/test_compute" graph
run compute_unlimited CUDA_VISIBLE_DEVICES=0 FAKE_CUDA_KERNEL_US=100 \
    ALNAIR_GPU_MEMORY_LIMIT_MIB=64 ALNAIR_VGPU_REGION="$WORK/unlimited.region" "$BUILD/tests/test_compute"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Prints JSON: nanoseconds per call against the fake driver bare ("*_bare_ns_per_call")
# and the nanoseconds the shim adds per hooked call ("*_added_ns"), with no compute limit.
# cuMemAlloc/cuMemFree are measured twice: with no limit (pass-through) and with a memory
# limit (accounting on every call).
set -eu
BUILD=$(cd "${1:?usage: bench.sh BUILD_DIR}" && pwd)
B=$BUILD/tests/bench
base=(env -i PATH="$PATH" LD_LIBRARY_PATH="$BUILD/fake" CUDA_VISIBLE_DEVICES=0)
region=$(mktemp /tmp/alnair-bench.XXXXXX)
trap 'rm -f "$region"' EXIT
read -r l0 a0 f0 < <("${base[@]}" "$B")
read -r l1 a1 f1 < <("${base[@]}" LD_PRELOAD="$BUILD/libalnair-intercept.so" "$B")
read -r l2 a2 f2 < <("${base[@]}" LD_PRELOAD="$BUILD/libalnair-intercept.so" \
    ALNAIR_GPU_MEMORY_LIMIT_MIB=65536 ALNAIR_VGPU_REGION="$region" "$B")
awk -v l0="$l0" -v a0="$a0" -v f0="$f0" -v l1="$l1" -v a1="$a1" -v f1="$f1" \
    -v l2="$l2" -v a2="$a2" -v f2="$f2" 'BEGIN {
    printf "{\"cuLaunchKernel_bare_ns_per_call\": %.2f, \"cuMemAlloc_bare_ns_per_call\": %.2f, ", l0, a0
    printf "\"cuMemFree_bare_ns_per_call\": %.2f, ", f0
    printf "\"cuLaunchKernel_added_ns\": %.2f, ", l1 - l0
    printf "\"cuMemAlloc_nolimit_added_ns\": %.2f, \"cuMemFree_nolimit_added_ns\": %.2f, ", a1 - a0, f1 - f0
    printf "\"cuMemAlloc_added_ns\": %.2f, \"cuMemFree_added_ns\": %.2f}\n", a2 - a0, f2 - f0
}'

#!/usr/bin/env bash
# Prints JSON: nanoseconds per call against the fake driver bare ("*_bare_ns_per_call")
# and the nanoseconds the shim adds per hooked call ("*_added_ns"), with no compute limit.
# cuMemAlloc/cuMemFree are measured twice: with no limit (pass-through) and with a memory
# limit (accounting on every call).
set -eu
BUILD=$(cd "${1:?usage: bench.sh BUILD_DIR}" && pwd)
B=$BUILD/tests/bench
# the fake hands out addresses without allocating, so only the shim's work is left to see
base=(env -i PATH="$PATH" LD_LIBRARY_PATH="$BUILD/fake" CUDA_VISIBLE_DEVICES=0 FAKE_CUDA_NO_MEMORY=1)
region=$(mktemp /tmp/alnair-bench.XXXXXX)
trap 'rm -f "$region"' EXIT
shim=(LD_PRELOAD="$BUILD/libalnair-intercept.so")
limited=(LD_PRELOAD="$BUILD/libalnair-intercept.so" ALNAIR_GPU_MEMORY_LIMIT_MIB=1048576
    ALNAIR_VGPU_REGION="$region")
# interleaved rounds, best of each: a shared machine's noise only ever adds time
best() { awk '{ for (i = 1; i <= NF; i++) if (NR == 1 || $i < m[i]) m[i] = $i }
    END { printf "%s %s %s\n", m[1], m[2], m[3] }'; }
: >"$region.0"; : >"$region.1"; : >"$region.2"
for _ in 1 2 3; do
    "${base[@]}" "$B" >>"$region.0"
    "${base[@]}" "${shim[@]}" "$B" >>"$region.1"
    "${base[@]}" "${limited[@]}" "$B" >>"$region.2"
done
read -r l0 a0 f0 < <(best <"$region.0")
read -r l1 a1 f1 < <(best <"$region.1")
read -r l2 a2 f2 < <(best <"$region.2")
rm -f "$region.0" "$region.1" "$region.2"
awk -v l0="$l0" -v a0="$a0" -v f0="$f0" -v l1="$l1" -v a1="$a1" -v f1="$f1" \
    -v l2="$l2" -v a2="$a2" -v f2="$f2" 'BEGIN {
    printf "{\"cuLaunchKernel_bare_ns_per_call\": %.2f, \"cuMemAlloc_bare_ns_per_call\": %.2f, ", l0, a0
    printf "\"cuMemFree_bare_ns_per_call\": %.2f, ", f0
    printf "\"cuLaunchKernel_added_ns\": %.2f, ", l1 - l0
    printf "\"cuMemAlloc_nolimit_added_ns\": %.2f, \"cuMemFree_nolimit_added_ns\": %.2f, ", a1 - a0, f1 - f0
    printf "\"cuMemAlloc_added_ns\": %.2f, \"cuMemFree_added_ns\": %.2f}\n", a2 - a0, f2 - f0
}'

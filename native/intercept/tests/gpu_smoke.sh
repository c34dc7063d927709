#!/usr/bin/env bash
# The shim under a real CUDA driver (make gpu-test on a machine with an NVIDIA GPU; needs the
# driver, not the toolkit). Prints PASS/FAIL lines, a JSON line of measurements, and
# "N passed, M failed"; exits non-zero on failure or when no GPU driver is present.
set -u
BUILD=$(cd "${1:?usage: gpu_smoke.sh BUILD_DIR}" && pwd)
SHIM=$BUILD/libalnair-intercept.so
LIBCUDA=$(ldconfig -p 2>/dev/null | awk '/libcuda.so.1 /{print $NF; exit}')
if [ -z "$LIBCUDA" ]; then
    echo "FAIL no libcuda.so.1: this machine has no NVIDIA driver"
    echo "0 passed, 1 failed"
    exit 1
fi
WORK=$(mktemp -d /tmp/alnair-gpu-smoke.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/lib"
ln -s "$LIBCUDA" "$WORK/lib/libcuda.so"
cc -std=gnu11 -O2 -o "$WORK/gpu_smoke" "$(dirname "$0")/gpu_smoke.c" -L"$WORK/lib" -lcuda -ldl -lpthread \
    || { echo "FAIL build of gpu_smoke"; echo "0 passed, 1 failed"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/INFO gpu: /'

out=$WORK/out.txt
: >"$out"
env LD_PRELOAD="$SHIM" ALNAIR_GPU_MEMORY_LIMIT_MIB=1024 ALNAIR_VGPU_REGION="$WORK/mem.region" \
    CUDA_VISIBLE_DEVICES=0 "$WORK/gpu_smoke" memory | tee -a "$out"

rate() { "$@" | awk '/^RATE/{print $2}'; }
base=$(rate env CUDA_VISIBLE_DEVICES=0 "$WORK/gpu_smoke" compute 6)
shim_free=$(rate env LD_PRELOAD="$SHIM" CUDA_VISIBLE_DEVICES=0 "$WORK/gpu_smoke" compute 6)
limited=$(rate env LD_PRELOAD="$SHIM" CUDA_VISIBLE_DEVICES=0 ALNAIR_GPU_COMPUTE_PCT=30 \
    ALNAIR_REGISTRY_SOCKET="$WORK/reg.sock" ALNAIR_VGPU_REGION="$WORK/cpu.region" \
    "$WORK/gpu_smoke" compute 8)
share=$(awk -v b="${base:-0}" -v l="${limited:-0}" 'BEGIN { if (b > 0) printf "%.3f", l / b; else print "nan" }')
awk -v s="$share" 'BEGIN { ok = (s != "nan" && s >= 0.27 && s <= 0.33);
    printf "%s real GPU: compute limit 30%% holds the kernel rate to %s of unlimited\n", ok ? "PASS" : "FAIL", s }' | tee -a "$out"

read -r l0 a0 < <("$WORK/gpu_smoke" bench | awk '/^BENCH/{print $2, $3}')
read -r l1 a1 < <(env LD_PRELOAD="$SHIM" ALNAIR_GPU_MEMORY_LIMIT_MIB=4096 ALNAIR_VGPU_REGION="$WORK/b.region" \
    CUDA_VISIBLE_DEVICES=0 "$WORK/gpu_smoke" bench | awk '/^BENCH/{print $2, $3}')
echo "{\"rate_unlimited_per_s\": ${base:-null}, \"rate_shim_no_limit_per_s\": ${shim_free:-null}," \
    "\"rate_limited_30pct_per_s\": ${limited:-null}, \"limited_share\": \"$share\"," \
    "\"cuLaunchKernel_bare_ns_per_call\": ${l0:-null}, \"cuLaunchKernel_shim_ns_per_call\": ${l1:-null}," \
    "\"cuMemAlloc_free_pair_bare_ns\": ${a0:-null}, \"cuMemAlloc_free_pair_shim_ns\": ${a1:-null}}"

passed=$(grep -c '^PASS' "$out")
failed=$(grep -c '^FAIL' "$out")
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]

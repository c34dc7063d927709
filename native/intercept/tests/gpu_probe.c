/*
 * gpu_probe: what a container sees through the CUDA driver API, as one JSON line on stdout.
 * The real node's e2e tests run it inside a pod (over the fake libcuda, with the shim the
 * device plugin's Allocate preloads): it reports the devices and memory the driver shows,
 * allocates 64 MiB blocks until the driver (or the shim) refuses or PROBE_MAX_MIB is
 * reached, launches kernels back to back for PROBE_WARMUP_S then PROBE_KERNEL_S seconds and
 * reports the device time they took in the second part as a share of its wall time (the
 * shim's compute throttle calibrates during the first), and echoes the Alnair variables it
 * was given.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_types.h"

CUresult cuInit(unsigned);
CUresult cuDeviceGetCount(int *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);
CUresult cuCtxSynchronize(void);
uint64_t fake_cuda_busy_ns(void);

#define BLOCK_MIB 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v ? v : "";
}

int main(void) {
    int devices = 0;
    size_t free_b = 0, total_b = 0;
    CUresult init = cuInit(0);
    cuDeviceGetCount(&devices);
    cuMemGetInfo_v2(&free_b, &total_b);
    long max_mib = atol(env("PROBE_MAX_MIB"));
    if (max_mib <= 0) max_mib = 1 << 20;
    long allocated = 0;
    CUresult refused = CUDA_SUCCESS;
    while (allocated + BLOCK_MIB <= max_mib) {
        CUdeviceptr p;
        refused = cuMemAlloc_v2(&p, (size_t)BLOCK_MIB << 20);
        if (refused != CUDA_SUCCESS) break;
        allocated += BLOCK_MIB;
    }
    double kernel_s = atof(env("PROBE_KERNEL_S")), warmup_s = atof(env("PROBE_WARMUP_S"));
    uint64_t launches = 0, busy0 = 0;
    double start = now_s(), t0 = start + warmup_s, t1;
    int measuring = warmup_s <= 0;
    if (measuring) busy0 = fake_cuda_busy_ns();
    while (kernel_s > 0 && (t1 = now_s()) - t0 < kernel_s) {
        if (!measuring && t1 >= t0) {
            cuCtxSynchronize();
            busy0 = fake_cuda_busy_ns();
            t0 = now_s();
            measuring = 1;
        }
        if (cuLaunchKernel((CUfunction)0x1, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL) != CUDA_SUCCESS) break;
        launches++;
    }
    cuCtxSynchronize();
    double wall = now_s() - t0;
    double busy = (double)(fake_cuda_busy_ns() - busy0) / 1e9;
    printf("{\"init\":%d,\"devices\":%d,\"total_mib\":%zu,\"free_mib\":%zu,\"allocated_mib\":%ld,"
           "\"refused\":%d,\"launches\":%lu,\"kernel_wall_s\":%.3f,\"busy_share\":%.4f,"
           "\"ld_preload\":\"%s\",\"memory_limit_mib\":\"%s\",\"compute_pct\":\"%s\","
           "\"registry_socket\":\"%s\",\"visible\":\"%s\"}\n",
           (int)init, devices, total_b >> 20, free_b >> 20, allocated, (int)refused,
           (unsigned long)launches, wall, wall > 0 ? busy / wall : 0.0, env("LD_PRELOAD"),
           env("ALNAIR_GPU_MEMORY_LIMIT_MIB"), env("ALNAIR_GPU_COMPUTE_PCT"), env("ALNAIR_REGISTRY_SOCKET"),
           env("NVIDIA_VISIBLE_DEVICES"));
    fflush(stdout);
    return 0;
}

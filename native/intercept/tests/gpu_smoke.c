/*
 * The shim on a real GPU (run by gpu_smoke.sh, which needs only the NVIDIA driver: the
 * kernel is PTX text, JIT-compiled by the driver, so no CUDA toolkit is involved).
 *   gpu_smoke memory    cuMemGetInfo / cuDeviceTotalMem report the limit; cuMemAlloc stops
 *                       at the limit, also when reached through cuGetProcAddress
 *   gpu_smoke compute S launches a spinning kernel back to back for S seconds while playing
 *                       the vGPU registry (utilisation from NVML every 200 ms); prints the
 *                       kernels completed per second, for the script to compare runs
 *   gpu_smoke bench     CPU nanoseconds per cuLaunchKernel of an empty kernel
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_types.h"
#include "check.h"

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuModuleLoadData(void **, const void *);
CUresult cuModuleGetFunction(CUfunction *, void *, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);

static const char PTX[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    ".visible .entry spin(.param .u64 cycles)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b64 %rd<5>;\n"
    "  ld.param.u64 %rd1, [cycles];\n"
    "  mov.u64 %rd2, %clock64;\n"
    "LOOP:\n"
    "  mov.u64 %rd3, %clock64;\n"
    "  sub.s64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1;\n"
    "  @%p bra LOOP;\n"
    "  ret;\n"
    "}\n"
    ".visible .entry empty()\n"
    "{\n"
    "  ret;\n"
    "}\n";

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUcontext setup(void) {
    CUdevice dev;
    CUcontext ctx = NULL;
    if (cuInit(0) != CUDA_SUCCESS || cuDeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cuDevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS || cuCtxSetCurrent(ctx) != CUDA_SUCCESS) {
        printf("FAIL cuda setup: no usable GPU\n");
        exit(1);
    }
    return ctx;
}

static int memory(void) {
    setup();
    uint64_t limit = strtoull(getenv("ALNAIR_GPU_MEMORY_LIMIT_MIB"), NULL, 10) * MIB;
    size_t free_b = 0, total_b = 0, dev_total = 0;
    cuMemGetInfo_v2(&free_b, &total_b);
    cuDeviceTotalMem_v2(&dev_total, 0);
    CHECK("real GPU: cuMemGetInfo total is the limit", total_b == limit, "total %zu", total_b);
    CHECK("real GPU: cuMemGetInfo free is within the limit", free_b <= limit, "free %zu", free_b);
    CHECK("real GPU: cuDeviceTotalMem is the limit", dev_total == limit, "total %zu", dev_total);

    CUdeviceptr ptrs[4096];
    int n = 0;
    uint64_t got = 0;
    while (n < 4096 && cuMemAlloc_v2(&ptrs[n], 64 * MIB) == CUDA_SUCCESS) {
        got += 64 * MIB;
        n++;
    }
    CHECK("real GPU: cuMemAlloc stops at the limit", got <= limit && got + 64 * MIB > limit,
          "allocated %llu of %llu", (unsigned long long)got, (unsigned long long)limit);
    for (int i = 0; i < n; i++) cuMemFree_v2(ptrs[i]);

    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    CUresult (*proc)(const char *, void **, int, cuuint64_t, void *) =
        (CUresult(*)(const char *, void **, int, cuuint64_t, void *))dlsym(lib, "cuGetProcAddress_v2");
    CUresult (*alloc)(CUdeviceptr *, size_t) = NULL;
    if (proc) proc("cuMemAlloc", (void **)&alloc, 12000, 0, NULL);
    CUdeviceptr big = 0;
    CUresult r = alloc ? alloc(&big, limit + MIB) : CUDA_ERROR_NOT_FOUND;
    CHECK("real GPU: cuMemAlloc through cuGetProcAddress_v2 is limited", r == CUDA_ERROR_OUT_OF_MEMORY,
          "over-limit allocation -> %d", r);
    if (r == CUDA_SUCCESS) cuMemFree_v2(big);
    CUdeviceptr whole = 0;
    r = cuMemAlloc_v2(&whole, limit);
    CHECK("real GPU: the whole limit is allocatable after freeing", r == CUDA_SUCCESS, "-> %d", r);
    if (r == CUDA_SUCCESS) cuMemFree_v2(whole);
    return g_failed ? 1 : 0;
}

/* ---- compute: play the registry, with utilisation from NVML ---- */
typedef struct {
    unsigned gpu;
    unsigned memory;
} nvml_util;
static int (*nvml_init)(void);
static int (*nvml_handle)(unsigned, void **);
static int (*nvml_utilization)(void *, nvml_util *);
static volatile int g_stop;
static int g_listen = -1;

static void *registry(void *arg) {
    (void)arg;
    int fd = accept(g_listen, NULL, NULL);
    if (fd < 0) return NULL;
    char buf[512];
    if (read(fd, buf, sizeof buf) <= 0) return NULL;
    void *dev = NULL;
    nvml_handle(0, &dev);
    while (!g_stop) {
        struct timespec ts = {0, 200 * 1000000L};
        nanosleep(&ts, NULL);
        nvml_util u = {0, 0};
        if (nvml_utilization(dev, &u) != 0) continue;
        char line[64];
        int len = snprintf(line, sizeof line, "UTIL 0 %u\n", u.gpu);
        if (write(fd, line, (size_t)len) != len) break;
    }
    close(fd);
    return NULL;
}

static int compute(double seconds) {
    void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!nvml) {
        printf("FAIL compute: libnvidia-ml.so.1 not found\n");
        return 1;
    }
    nvml_init = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
    nvml_handle = (int (*)(unsigned, void **))dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2");
    nvml_utilization = (int (*)(void *, nvml_util *))dlsym(nvml, "nvmlDeviceGetUtilizationRates");
    nvml_init();
    const char *path = getenv("ALNAIR_REGISTRY_SOCKET");
    pthread_t t;
    if (path && *path) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
        unlink(path);
        g_listen = socket(AF_UNIX, SOCK_STREAM, 0);
        if (bind(g_listen, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(g_listen, 4) == 0)
            pthread_create(&t, NULL, registry, NULL);
    }
    setup();
    void *mod = NULL;
    CUfunction spin = NULL;
    if (cuModuleLoadData(&mod, PTX) != CUDA_SUCCESS || cuModuleGetFunction(&spin, mod, "spin") != CUDA_SUCCESS) {
        printf("FAIL compute: PTX did not load\n");
        return 1;
    }
    unsigned long long cycles = 200000; /* about 0.1 ms at 2 GHz */
    void *params[] = {&cycles};
    double start = now_s(), warm = start + 1.0, end = start + seconds;
    long done = 0;
    while (now_s() < end) {
        if (cuLaunchKernel(spin, 132, 1, 1, 32, 1, 1, 0, NULL, params, NULL) != CUDA_SUCCESS) {
            printf("FAIL compute: launch failed\n");
            return 1;
        }
        if (now_s() >= warm) done++;
    }
    cuCtxSynchronize();
    double rate = (double)done / (now_s() - warm);
    g_stop = 1;
    printf("RATE %.1f\n", rate);
    return 0;
}

static int bench(void) {
    setup();
    void *mod = NULL;
    CUfunction empty = NULL;
    if (cuModuleLoadData(&mod, PTX) != CUDA_SUCCESS || cuModuleGetFunction(&empty, mod, "empty") != CUDA_SUCCESS)
        return 1;
    double best = 1e30;
    for (int round = 0; round < 5; round++) {
        double t0 = now_s();
        for (int i = 0; i < 20000; i++) cuLaunchKernel(empty, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        double t1 = now_s();
        cuCtxSynchronize();
        if ((t1 - t0) / 20000 < best) best = (t1 - t0) / 20000;
    }
    double a0 = now_s();
    CUdeviceptr p;
    for (int i = 0; i < 2000; i++) {
        cuMemAlloc_v2(&p, 1 << 20);
        cuMemFree_v2(p);
    }
    double a1 = now_s();
    printf("BENCH %.1f %.1f\n", best * 1e9, (a1 - a0) / 2000 * 1e9);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "memory") == 0) return memory();
    if (argc > 2 && strcmp(argv[1], "compute") == 0) return compute(atof(argv[2]));
    if (argc > 1 && strcmp(argv[1], "bench") == 0) return bench();
    fprintf(stderr, "usage: gpu_smoke memory|compute SECONDS|bench\n");
    return 2;
}

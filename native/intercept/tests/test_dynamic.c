/*
 * The paths frameworks take to the driver without linking it: dlopen + dlsym, and
 * cuGetProcAddress (CUDA 11.3+ signature and the CUDA 12 _v2 one), including the
 * per-thread-stream variants, an entry the driver hands out through an internal alias,
 * and cuGetProcAddress fetched through itself, as the CUDA runtime does. Also checks that
 * interposing dlsym leaves RTLD_NEXT meaning "after the caller".
 * Run with ALNAIR_GPU_MEMORY_LIMIT_MIB=64.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../src/cuda_types.h"
#include "check.h"

typedef CUresult (*alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*alloc_managed_t)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*alloc_async_t)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*free_t)(CUdeviceptr);
typedef CUresult (*info_t)(size_t *, size_t *);
typedef CUresult (*proc_t)(const char *, void **, int, cuuint64_t);
typedef CUresult (*proc2_t)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult (*init_t)(unsigned);

#define LIMIT (64 * MIB)

static int enforced(alloc_t alloc, free_t release) {
    CUdeviceptr a = 0, b = 0;
    CUresult r1 = alloc(&a, LIMIT);
    CUresult r2 = alloc(&b, 1);
    if (r1 == CUDA_SUCCESS) release(a);
    if (r2 == CUDA_SUCCESS) release(b);
    return r1 == CUDA_SUCCESS && r2 == CUDA_ERROR_OUT_OF_MEMORY;
}

static alloc_managed_t g_managed;
static CUresult managed_as_alloc(CUdeviceptr *p, size_t n) { return g_managed(p, n, 1); }
static alloc_async_t g_async;
static CUresult async_as_alloc(CUdeviceptr *p, size_t n) { return g_async(p, n, NULL); }

int main(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    CHECK("libcuda opens", lib != NULL, "%s", dlerror());
    if (!lib) return 1;
    ((init_t)dlsym(lib, "cuInit"))(0);

    alloc_t alloc = (alloc_t)dlsym(lib, "cuMemAlloc_v2");
    free_t release = (free_t)dlsym(lib, "cuMemFree_v2");
    CHECK("dlsym(libcuda, cuMemAlloc_v2) is hooked", alloc && release && enforced(alloc, release),
          "the limit did not hold through dlsym");

    info_t info = (info_t)dlsym(lib, "cuMemGetInfo_v2");
    size_t fb = 0, tb = 0;
    info(&fb, &tb);
    CHECK("dlsym(libcuda, cuMemGetInfo_v2) reports the limit", tb == LIMIT && fb == LIMIT,
          "total %zu free %zu", tb, fb);

    proc_t proc = (proc_t)dlsym(lib, "cuGetProcAddress");
    alloc_t via_proc = NULL;
    free_t free_proc = NULL;
    proc("cuMemAlloc", (void **)&via_proc, 11030, CU_GET_PROC_ADDRESS_DEFAULT);
    proc("cuMemFree", (void **)&free_proc, 11030, CU_GET_PROC_ADDRESS_DEFAULT);
    CHECK("cuGetProcAddress(cuMemAlloc, 11.3) is hooked",
          via_proc && free_proc && enforced(via_proc, free_proc), "the limit did not hold");
    CHECK("cuGetProcAddress returns the shim's own entry point",
          via_proc == (alloc_t)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2"), "got %p", (void *)via_proc);

    proc2_t proc2 = (proc2_t)dlsym(lib, "cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    proc2("cuMemAllocAsync", (void **)&g_async, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
    free_t free_async = NULL;
    proc2("cuMemFree", (void **)&free_async, 12000, 0, NULL);
    CHECK("cuGetProcAddress_v2(cuMemAllocAsync, per-thread stream) is hooked",
          g_async && st == CU_GET_PROC_ADDRESS_SUCCESS && enforced(async_as_alloc, free_async),
          "the limit did not hold (status %d)", st);
    CHECK("the per-thread variant is the shim's _ptsz hook",
          (void *)g_async == dlsym(RTLD_DEFAULT, "cuMemAllocAsync_ptsz"), "got %p", (void *)g_async);

    proc2("cuMemAllocManaged", (void **)&g_managed, 12000, 0, NULL);
    CHECK("an entry the driver hands out through an internal alias is still hooked",
          g_managed && enforced(managed_as_alloc, free_async), "the limit did not hold");

    proc2_t nested = NULL;
    proc2("cuGetProcAddress", (void **)&nested, 12000, 0, NULL);
    alloc_t via_nested = NULL;
    if (nested) nested("cuMemAlloc", (void **)&via_nested, 12000, 0, NULL);
    CHECK("cuGetProcAddress fetched through itself stays hooked",
          via_nested && enforced(via_nested, free_async), "nested %p alloc %p", (void *)nested,
          (void *)via_nested);

    void *graph = NULL;
    proc2("cuGraphLaunch", &graph, 12000, 0, NULL);
    CHECK("cuGraphLaunch through cuGetProcAddress_v2 is the shim's",
          graph != NULL && graph == dlsym(RTLD_DEFAULT, "cuGraphLaunch"), "got %p", graph);

    proc_t old_nested = NULL;
    proc("cuGetProcAddress", (void **)&old_nested, 11080, 0);
    CHECK("cuGetProcAddress asked for at 11.8 is the hooked 11.3 form",
          (void *)old_nested == dlsym(RTLD_DEFAULT, "cuGetProcAddress"), "got %p", (void *)old_nested);

    void *missing = (void *)1;
    CUresult miss = proc("cuNoSuchFunction", &missing, 12000, 0);
    CHECK("unknown names pass through untouched", miss == CUDA_ERROR_NOT_FOUND && missing == NULL,
          "-> %d %p", miss, missing);

    int (*next_puts)(const char *) = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
    CHECK("dlsym(RTLD_NEXT) still resolves after the caller", next_puts == puts,
          "got %p, libc has %p", (void *)next_puts, (void *)puts);
    return g_failed ? 1 : 0;
}

/*
 * Every allocation and free path the shim hooks, called by symbol (the program links
 * against libcuda): the limit holds to the byte on each, frees make room again, devices
 * keep separate budgets, and cuMemGetInfo / cuDeviceTotalMem report the limit.
 * Run with ALNAIR_GPU_MEMORY_LIMIT_MIB=64 and two fake devices.
 */
#include <stdint.h>
#include <string.h>

#include "../src/cuda_types.h"
#include "check.h"

CUresult cuInit(unsigned);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuArrayCreate_v2(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
CUresult cuArray3DCreate_v2(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
CUresult cuMipmappedArrayCreate(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuArrayDestroy(CUarray);
CUresult cuMipmappedArrayDestroy(CUmipmappedArray);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, CUdevice);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);

#define LIMIT (64 * MIB)

typedef struct {
    const char *name;
    CUresult (*alloc)(uint64_t *, size_t);
    CUresult (*release)(uint64_t);
} path;

static CUresult a_alloc(uint64_t *h, size_t n) { return cuMemAlloc_v2((CUdeviceptr *)h, n); }
static CUresult a_pitch(uint64_t *h, size_t n) {
    size_t pitch;
    return cuMemAllocPitch_v2((CUdeviceptr *)h, &pitch, 65536, n / 65536, 4);
}
static CUresult a_managed(uint64_t *h, size_t n) { return cuMemAllocManaged((CUdeviceptr *)h, n, 1); }
static CUresult a_async(uint64_t *h, size_t n) { return cuMemAllocAsync((CUdeviceptr *)h, n, NULL); }
static CUresult a_async_ptsz(uint64_t *h, size_t n) { return cuMemAllocAsync_ptsz((CUdeviceptr *)h, n, NULL); }
static CUresult a_pool(uint64_t *h, size_t n) { return cuMemAllocFromPoolAsync((CUdeviceptr *)h, n, NULL, NULL); }
static CUresult a_create(uint64_t *h, size_t n) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return cuMemCreate((CUmemGenericAllocationHandle *)h, n, &prop, 0);
}
static CUresult a_array(uint64_t *h, size_t n) {
    CUDA_ARRAY_DESCRIPTOR d = {n / 4, 1, CU_AD_FORMAT_FLOAT, 1};
    return cuArrayCreate_v2((CUarray *)h, &d);
}
static CUresult a_array3d(uint64_t *h, size_t n) {
    CUDA_ARRAY3D_DESCRIPTOR d = {1024, 16, n / (1024 * 16 * 2 * 2), CU_AD_FORMAT_HALF, 2, 0};
    return cuArray3DCreate_v2((CUarray *)h, &d);
}
static CUresult a_mipmap(uint64_t *h, size_t n) {
    /* two levels of a square-ish 1-channel byte image: level 1 is a quarter of level 0 */
    size_t base = n / 5 * 4;
    CUDA_ARRAY3D_DESCRIPTOR d = {base / 1024, 1024, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0};
    return cuMipmappedArrayCreate((CUmipmappedArray *)h, &d, 2);
}
static CUresult f_free(uint64_t h) { return cuMemFree_v2(h); }
static CUresult f_async(uint64_t h) { return cuMemFreeAsync(h, NULL); }
static CUresult f_async_ptsz(uint64_t h) { return cuMemFreeAsync_ptsz(h, NULL); }
static CUresult f_release(uint64_t h) { return cuMemRelease(h); }
static CUresult f_array(uint64_t h) { return cuArrayDestroy((CUarray)(uintptr_t)h); }
static CUresult f_mipmap(uint64_t h) { return cuMipmappedArrayDestroy((CUmipmappedArray)(uintptr_t)h); }

static const path paths[] = {
    {"cuMemAlloc_v2", a_alloc, f_free},
    {"cuMemAllocPitch_v2", a_pitch, f_free},
    {"cuMemAllocManaged", a_managed, f_free},
    {"cuMemAllocAsync", a_async, f_async},
    {"cuMemAllocAsync_ptsz", a_async_ptsz, f_async_ptsz},
    {"cuMemAllocFromPoolAsync", a_pool, f_async},
    {"cuMemCreate", a_create, f_release},
    {"cuArrayCreate_v2", a_array, f_array},
    {"cuArray3DCreate_v2", a_array3d, f_array},
    {"cuMipmappedArrayCreate", a_mipmap, f_mipmap},
};

int main(void) {
    char name[128];
    cuInit(0);
    cuCtxSetCurrent((CUcontext)(uintptr_t)1);
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++) {
        const path *p = &paths[i];
        uint64_t a = 0, b = 0, c = 0;
        CUresult r1 = p->alloc(&a, 40 * MIB);
        CUresult r2 = p->alloc(&b, 40 * MIB);
        CUresult r3 = p->alloc(&c, 20 * MIB);
        snprintf(name, sizeof name, "%s: within the limit succeeds, past it is OUT_OF_MEMORY", p->name);
        CHECK(name, r1 == CUDA_SUCCESS && r2 == CUDA_ERROR_OUT_OF_MEMORY && r3 == CUDA_SUCCESS,
              "40 MiB -> %d, another 40 MiB -> %d, 20 MiB -> %d", r1, r2, r3);
        CUresult f1 = p->release(a);
        CUresult f2 = c ? p->release(c) : CUDA_SUCCESS;
        CUresult r4 = p->alloc(&a, 60 * MIB);
        snprintf(name, sizeof name, "%s: freed bytes are reusable", p->name);
        CHECK(name, f1 == CUDA_SUCCESS && f2 == CUDA_SUCCESS && r4 == CUDA_SUCCESS,
              "frees -> %d %d, 60 MiB afterwards -> %d", f1, f2, r4);
        if (r4 == CUDA_SUCCESS) p->release(a);
    }

    CUdeviceptr x = 0, y = 0;
    CUresult r = cuMemAlloc_v2(&x, LIMIT);
    CUresult over = cuMemAlloc_v2(&y, 1);
    CHECK("limit is exact to the byte", r == CUDA_SUCCESS && over == CUDA_ERROR_OUT_OF_MEMORY,
          "whole limit -> %d, one more byte -> %d", r, over);
    cuCtxSetCurrent((CUcontext)(uintptr_t)2);
    CUdeviceptr z = 0;
    CUresult other = cuMemAlloc_v2(&z, LIMIT);
    CHECK("each device has its own budget", other == CUDA_SUCCESS,
          "device 1 allocation while device 0 is full -> %d", other);
    cuMemFree_v2(z);
    cuCtxSetCurrent((CUcontext)(uintptr_t)1);
    cuMemFree_v2(x);

    CUdeviceptr q = 0;
    cuMemAlloc_v2(&q, 16 * MIB);
    size_t free_b = 0, total_b = 0, dev_total = 0;
    cuMemGetInfo_v2(&free_b, &total_b);
    CHECK("cuMemGetInfo reports the limit", total_b == LIMIT && free_b == LIMIT - 16 * MIB,
          "total %zu free %zu, want %llu and %llu", total_b, free_b, LIMIT, LIMIT - 16 * MIB);
    cuDeviceTotalMem_v2(&dev_total, 0);
    CHECK("cuDeviceTotalMem reports the limit", dev_total == LIMIT, "got %zu", dev_total);
    cuMemFree_v2(q);

    CUresult dbl = cuMemFree_v2(q);
    CUdeviceptr again = 0;
    CUresult whole = cuMemAlloc_v2(&again, LIMIT);
    CHECK("a double free is not credited twice", dbl != CUDA_SUCCESS && whole == CUDA_SUCCESS,
          "second free -> %d, whole limit afterwards -> %d", dbl, whole);
    CUdeviceptr more = 0;
    CHECK("still full after the double free", cuMemAlloc_v2(&more, 1) == CUDA_ERROR_OUT_OF_MEMORY,
          "one byte more was granted");
    cuMemFree_v2(again);

    CHECK("launches pass through without a compute limit",
          cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS, "launch failed");
    return g_failed ? 1 : 0;
}

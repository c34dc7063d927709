/*
 * libalnair-intercept: an LD_PRELOAD shim over the CUDA driver API that enforces a
 * container's GPU memory and compute share (DESIGN.md, native/intercept).
 *
 * Entry points are covered on all three paths a program can reach them by: direct calls
 * bind to the functions exported here; dlsym() is interposed so a dlopen'ed libcuda hands
 * out the hooks; and cuGetProcAddress (the CUDA 11.3+ runtime's only path to the driver,
 * and its CUDA 12 _v2 form) is hooked so every pointer it returns that belongs to a hooked
 * entry point is swapped for the hook. Peers that hooked only by symbol lost enforcement
 * the day the runtime switched to cuGetProcAddress.
 *
 * Without limits in the environment every hook is a load, a branch and a tail call.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_types.h"
#include "shim.h"

#define EXPORT __attribute__((visibility("default")))
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---------------------------------------------------------------- the real functions */

typedef CUresult (*fn_alloc)(CUdeviceptr *, size_t);
typedef CUresult (*fn_alloc_pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
typedef CUresult (*fn_alloc_managed)(CUdeviceptr *, size_t, unsigned);
typedef CUresult (*fn_alloc_async)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*fn_alloc_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*fn_mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                                  unsigned long long);
typedef CUresult (*fn_array)(CUarray *, const CUDA_ARRAY_DESCRIPTOR *);
typedef CUresult (*fn_array3d)(CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *);
typedef CUresult (*fn_mipmap)(CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned);
typedef CUresult (*fn_free)(CUdeviceptr);
typedef CUresult (*fn_free_async)(CUdeviceptr, CUstream);
typedef CUresult (*fn_release)(CUmemGenericAllocationHandle);
typedef CUresult (*fn_array_destroy)(CUarray);
typedef CUresult (*fn_mipmap_destroy)(CUmipmappedArray);
typedef CUresult (*fn_mem_info)(size_t *, size_t *);
typedef CUresult (*fn_total_mem)(size_t *, CUdevice);
typedef CUresult (*fn_ctx_device)(CUdevice *);
typedef CUresult (*fn_launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, CUstream, void **, void **);
typedef CUresult (*fn_launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*fn_graph)(CUgraphExec, CUstream);
typedef CUresult (*fn_proc)(const char *, void **, int, cuuint64_t);
typedef CUresult (*fn_proc_v2)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

static struct {
    fn_alloc cuMemAlloc_v2;
    fn_alloc_pitch cuMemAllocPitch_v2;
    fn_alloc_managed cuMemAllocManaged;
    fn_alloc_async cuMemAllocAsync, cuMemAllocAsync_ptsz;
    fn_alloc_pool cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz;
    fn_mem_create cuMemCreate;
    fn_array cuArrayCreate_v2;
    fn_array3d cuArray3DCreate_v2;
    fn_mipmap cuMipmappedArrayCreate;
    fn_free cuMemFree_v2;
    fn_free_async cuMemFreeAsync, cuMemFreeAsync_ptsz;
    fn_release cuMemRelease;
    fn_array_destroy cuArrayDestroy;
    fn_mipmap_destroy cuMipmappedArrayDestroy;
    fn_mem_info cuMemGetInfo_v2;
    fn_total_mem cuDeviceTotalMem_v2;
    fn_ctx_device cuCtxGetDevice;
    fn_launch cuLaunchKernel, cuLaunchKernel_ptsz, cuLaunchCooperativeKernel,
        cuLaunchCooperativeKernel_ptsz;
    fn_launch_ex cuLaunchKernelEx, cuLaunchKernelEx_ptsz;
    fn_graph cuGraphLaunch, cuGraphLaunch_ptsz;
    fn_proc cuGetProcAddress;
    fn_proc_v2 cuGetProcAddress_v2;
} real;

/* ---------------------------------------------------------------- state and setup */

static int g_ready;             /* read with acquire on every hooked call */
static int g_memory_limited;    /* any device has a memory limit */
static int g_single_device;     /* the container sees one GPU: skip cuCtxGetDevice */
static int g_debug;
static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static void *(*real_dlsym)(void *, const char *);

void shim_log(const char *fmt, ...) {
    if (!g_debug) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "alnair-intercept[%d]: %s\n", (int)getpid(), buf);
}

uint64_t shim_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void resolve_real_dlsym(void) {
    if (real_dlsym) return;
    /* dlvsym is not interposed, so it reaches glibc's dlsym (in libc since 2.34) */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof *versions && !real_dlsym; i++)
        real_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

/* "1024" applies to every device, "1024,2048" to devices 0 and 1; bytes out */
static void parse_list(const char *text, uint64_t scale, uint64_t *out) {
    memset(out, 0, sizeof(uint64_t) * ALNAIR_MAX_DEVICES);
    if (!text || !*text) return;
    int n = 0;
    const char *p = text;
    while (*p && n < ALNAIR_MAX_DEVICES) {
        char *end;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p) break;
        out[n++] = (uint64_t)v * scale;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',') break;
    }
    if (n == 1)
        for (int d = 1; d < ALNAIR_MAX_DEVICES; d++) out[d] = out[0];
}

static int count_list(const char *text) {
    if (!text || !*text || strcmp(text, "all") == 0 || strcmp(text, "none") == 0) return 0;
    int n = 1;
    for (const char *p = text; *p; p++) n += *p == ',';
    return n;
}

static char g_limits_text[256];

static void child_after_fork(void) {
    pthread_mutex_init(&g_init_mu, NULL);
    g_ready = 0;
    region_after_fork();
    registry_after_fork();
    table_reset();
}

#define RESOLVE(h, name) (real.name = (__typeof__(real.name))real_dlsym(h, #name))

static void init_locked(void) {
    g_debug = getenv("ALNAIR_INTERCEPT_DEBUG") != NULL;
    resolve_real_dlsym();
    const char *lib = getenv("ALNAIR_REAL_LIBCUDA");
    if (!lib || !*lib) lib = "libcuda.so.1";
    void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen(lib, RTLD_LAZY | RTLD_GLOBAL);
    if (!h) shim_log("cannot load %s: %s", lib, dlerror());
    if (h && real_dlsym) {
        RESOLVE(h, cuMemAlloc_v2);
        RESOLVE(h, cuMemAllocPitch_v2);
        RESOLVE(h, cuMemAllocManaged);
        RESOLVE(h, cuMemAllocAsync);
        RESOLVE(h, cuMemAllocAsync_ptsz);
        RESOLVE(h, cuMemAllocFromPoolAsync);
        RESOLVE(h, cuMemAllocFromPoolAsync_ptsz);
        RESOLVE(h, cuMemCreate);
        RESOLVE(h, cuArrayCreate_v2);
        RESOLVE(h, cuArray3DCreate_v2);
        RESOLVE(h, cuMipmappedArrayCreate);
        RESOLVE(h, cuMemFree_v2);
        RESOLVE(h, cuMemFreeAsync);
        RESOLVE(h, cuMemFreeAsync_ptsz);
        RESOLVE(h, cuMemRelease);
        RESOLVE(h, cuArrayDestroy);
        RESOLVE(h, cuMipmappedArrayDestroy);
        RESOLVE(h, cuMemGetInfo_v2);
        RESOLVE(h, cuDeviceTotalMem_v2);
        RESOLVE(h, cuCtxGetDevice);
        RESOLVE(h, cuLaunchKernel);
        RESOLVE(h, cuLaunchKernel_ptsz);
        RESOLVE(h, cuLaunchCooperativeKernel);
        RESOLVE(h, cuLaunchCooperativeKernel_ptsz);
        RESOLVE(h, cuLaunchKernelEx);
        RESOLVE(h, cuLaunchKernelEx_ptsz);
        RESOLVE(h, cuGraphLaunch);
        RESOLVE(h, cuGraphLaunch_ptsz);
        RESOLVE(h, cuGetProcAddress);
        RESOLVE(h, cuGetProcAddress_v2);
    }

    uint64_t limits[ALNAIR_MAX_DEVICES];
    uint64_t compute[ALNAIR_MAX_DEVICES];
    const char *bytes_text = getenv("ALNAIR_GPU_MEMORY_LIMIT_BYTES");
    const char *mib_text = getenv("ALNAIR_GPU_MEMORY_LIMIT_MIB");
    if (bytes_text && *bytes_text) {
        parse_list(bytes_text, 1, limits);
        snprintf(g_limits_text, sizeof g_limits_text, "%sB", bytes_text);
    } else {
        parse_list(mib_text, 1024ULL * 1024ULL, limits);
        snprintf(g_limits_text, sizeof g_limits_text, "%sMiB", mib_text ? mib_text : "");
    }
    const char *compute_text = getenv("ALNAIR_GPU_COMPUTE_PCT");
    parse_list(compute_text, 1, compute);

    g_memory_limited = 0;
    for (int d = 0; d < ALNAIR_MAX_DEVICES; d++) {
        g_memory_limited |= limits[d] != 0;
        throttle_configure(d, (unsigned)(compute[d] > 100 ? 100 : compute[d]));
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    if (!visible) visible = getenv("NVIDIA_VISIBLE_DEVICES");
    g_single_device = count_list(visible) == 1;

    const char *region_path = getenv("ALNAIR_VGPU_REGION");
    char fallback[256];
    const char *vgpu = getenv("ALNAIR_VGPU_ID");
    if ((!region_path || !*region_path) && vgpu && *vgpu) {
        snprintf(fallback, sizeof fallback, "/dev/shm/alnair-vgpu-%s", vgpu);
        region_path = fallback;
    }
    if (region_open(region_path) != 0 && g_memory_limited)
        shim_log("no shared region: each process of the container gets the whole limit");
    region_set_limits(limits, compute);
    registry_connect(getenv("ALNAIR_REGISTRY_SOCKET"), vgpu, region_path, g_limits_text,
                     compute_text);

    static int hooks_installed;
    if (!hooks_installed) {
        /* no exit handler gives bytes back: other threads may still be allocating while
         * exit() runs, so a dead process's bytes are reclaimed by whoever needs them next */
        pthread_atfork(NULL, NULL, child_after_fork);
        hooks_installed = 1;
    }
    __atomic_store_n(&g_ready, 1, __ATOMIC_RELEASE);
}

static void init_slow(void) {
    pthread_mutex_lock(&g_init_mu);
    if (!g_ready) init_locked();
    pthread_mutex_unlock(&g_init_mu);
}

static inline void ensure_init(void) {
    if (UNLIKELY(!__atomic_load_n(&g_ready, __ATOMIC_ACQUIRE))) init_slow();
}

static int current_device(void) {
    if (g_single_device || !real.cuCtxGetDevice) return 0;
    CUdevice d = 0;
    if (real.cuCtxGetDevice(&d) != CUDA_SUCCESS) return 0;
    return d;
}

#define CALL_REAL(name, ...) \
    (real.name ? real.name(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND)

/* ---------------------------------------------------------------- memory */

/* Reserve first, allocate second: another thread can never see room that is not there. */
static CUresult admit(int dev, uint64_t bytes) {
    if (region_reserve(dev, bytes)) return CUDA_SUCCESS;
    region_note_oom(dev);
    shim_log("device %d: %llu bytes more would pass the limit of %llu (%llu in use)", dev,
             (unsigned long long)bytes, (unsigned long long)region_limit(dev),
             (unsigned long long)region_used(dev));
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult settle(CUresult r, int dev, uint64_t bytes, uint64_t key, int kind) {
    if (r == CUDA_SUCCESS)
        table_insert(key, kind, dev, bytes);
    else
        region_release(dev, bytes);
    return r;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemAlloc_v2, p, n);
    int dev = current_device();
    CUresult r = admit(dev, n);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuMemAlloc_v2, p, n);
    return settle(r, dev, n, r == CUDA_SUCCESS ? *p : 0, ALLOC_DPTR);
}

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t width, size_t height,
                                   unsigned elem) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemAllocPitch_v2, p, pitch, width, height, elem);
    /* the driver picks the pitch: reserve the widest it can choose, then give back the rest */
    size_t guess = ((width + 511) / 512) * 512 * height;
    int dev = current_device();
    CUresult r = admit(dev, guess);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuMemAllocPitch_v2, p, pitch, width, height, elem);
    if (r != CUDA_SUCCESS) return settle(r, dev, guess, 0, ALLOC_DPTR);
    size_t actual = *pitch * height;
    if (actual < guess) {
        region_release(dev, guess - actual);
    } else if (actual > guess && admit(dev, actual - guess) != CUDA_SUCCESS) {
        CALL_REAL(cuMemFree_v2, *p);
        region_release(dev, guess);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    table_insert(*p, ALLOC_DPTR, dev, actual);
    return r;
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemAllocManaged, p, n, flags);
    /* managed memory can migrate away, but counting it keeps the promise "never over" */
    int dev = current_device();
    CUresult r = admit(dev, n);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuMemAllocManaged, p, n, flags);
    return settle(r, dev, n, r == CUDA_SUCCESS ? *p : 0, ALLOC_DPTR);
}

#define ASYNC_ALLOC(name)                                                      \
    EXPORT CUresult name(CUdeviceptr *p, size_t n, CUstream s) {               \
        ensure_init();                                                         \
        if (!g_memory_limited) return CALL_REAL(name, p, n, s);                \
        int dev = current_device();                                            \
        CUresult r = admit(dev, n);                                            \
        if (r != CUDA_SUCCESS) return r;                                       \
        r = CALL_REAL(name, p, n, s);                                          \
        return settle(r, dev, n, r == CUDA_SUCCESS ? *p : 0, ALLOC_DPTR);      \
    }
ASYNC_ALLOC(cuMemAllocAsync)
ASYNC_ALLOC(cuMemAllocAsync_ptsz)

#define POOL_ALLOC(name)                                                       \
    EXPORT CUresult name(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) { \
        ensure_init();                                                         \
        if (!g_memory_limited) return CALL_REAL(name, p, n, pool, s);          \
        int dev = current_device();                                            \
        CUresult r = admit(dev, n);                                            \
        if (r != CUDA_SUCCESS) return r;                                       \
        r = CALL_REAL(name, p, n, pool, s);                                    \
        return settle(r, dev, n, r == CUDA_SUCCESS ? *p : 0, ALLOC_DPTR);      \
    }
POOL_ALLOC(cuMemAllocFromPoolAsync)
POOL_ALLOC(cuMemAllocFromPoolAsync_ptsz)

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemCreate, h, n, prop, flags);
    /* physical memory is committed here, not at cuMemMap, so this is where it counts */
    int dev = prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id
                                                                          : current_device();
    CUresult r = admit(dev, n);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuMemCreate, h, n, prop, flags);
    return settle(r, dev, n, r == CUDA_SUCCESS ? *h : 0, ALLOC_HANDLE);
}

static uint64_t format_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    default:
        return 4; /* 32-bit formats; block-compressed ones are smaller, so this over-counts */
    }
}

static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch) {
    return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * format_bytes(f) * (ch ? ch : 1);
}

EXPORT CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *desc) {
    ensure_init();
    if (!g_memory_limited || !desc) return CALL_REAL(cuArrayCreate_v2, a, desc);
    uint64_t n = array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels);
    int dev = current_device();
    CUresult r = admit(dev, n);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuArrayCreate_v2, a, desc);
    return settle(r, dev, n, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*a : 0, ALLOC_ARRAY);
}

EXPORT CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    ensure_init();
    if (!g_memory_limited || !desc) return CALL_REAL(cuArray3DCreate_v2, a, desc);
    uint64_t n = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                             desc->NumChannels);
    int dev = current_device();
    CUresult r = admit(dev, n);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuArray3DCreate_v2, a, desc);
    return settle(r, dev, n, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*a : 0, ALLOC_ARRAY);
}

EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                       unsigned levels) {
    ensure_init();
    if (!g_memory_limited || !desc) return CALL_REAL(cuMipmappedArrayCreate, a, desc, levels);
    uint64_t n = 0;
    size_t w = desc->Width, h = desc->Height, d = desc->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        n += array_bytes(w, h, d, desc->Format, desc->NumChannels);
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        d = d > 1 ? d / 2 : d;
    }
    int dev = current_device();
    CUresult r = admit(dev, n);
    if (r != CUDA_SUCCESS) return r;
    r = CALL_REAL(cuMipmappedArrayCreate, a, desc, levels);
    return settle(r, dev, n, r == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*a : 0, ALLOC_MIPMAP);
}

/* Take the entry out before freeing, so two racing frees of one pointer credit it once. */
#define FREE_BODY(key, kind, call)                              \
    int dev;                                                    \
    uint64_t bytes;                                             \
    int held = table_remove((uint64_t)(key), kind, &dev, &bytes); \
    CUresult r = call;                                          \
    if (held) {                                                 \
        if (r == CUDA_SUCCESS)                                  \
            region_release(dev, bytes);                         \
        else                                                    \
            table_insert((uint64_t)(key), kind, dev, bytes);    \
    }                                                           \
    return r;

EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemFree_v2, p);
    FREE_BODY(p, ALLOC_DPTR, CALL_REAL(cuMemFree_v2, p))
}

/* Stream-ordered frees are credited when issued: the pool hands those bytes to the next
 * stream-ordered allocation, which is counted again, so the total still never passes. */
EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemFreeAsync, p, s);
    FREE_BODY(p, ALLOC_DPTR, CALL_REAL(cuMemFreeAsync, p, s))
}

EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemFreeAsync_ptsz, p, s);
    FREE_BODY(p, ALLOC_DPTR, CALL_REAL(cuMemFreeAsync_ptsz, p, s))
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMemRelease, h);
    FREE_BODY(h, ALLOC_HANDLE, CALL_REAL(cuMemRelease, h))
}

EXPORT CUresult cuArrayDestroy(CUarray a) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuArrayDestroy, a);
    FREE_BODY((uintptr_t)a, ALLOC_ARRAY, CALL_REAL(cuArrayDestroy, a))
}

EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
    ensure_init();
    if (!g_memory_limited) return CALL_REAL(cuMipmappedArrayDestroy, a);
    FREE_BODY((uintptr_t)a, ALLOC_MIPMAP, CALL_REAL(cuMipmappedArrayDestroy, a))
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    ensure_init();
    CUresult r = CALL_REAL(cuMemGetInfo_v2, free_bytes, total_bytes);
    if (r != CUDA_SUCCESS || !g_memory_limited) return r;
    int dev = current_device();
    uint64_t limit = region_limit(dev);
    if (limit == 0) return r;
    uint64_t used = region_used(dev);
    uint64_t room = used < limit ? limit - used : 0;
    if (total_bytes && *total_bytes > limit) *total_bytes = limit;
    if (free_bytes && *free_bytes > room) *free_bytes = room;
    return r;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    ensure_init();
    CUresult r = CALL_REAL(cuDeviceTotalMem_v2, bytes, dev);
    uint64_t limit = region_limit(dev);
    if (r == CUDA_SUCCESS && bytes && limit && *bytes > limit) *bytes = limit;
    return r;
}

/* ---------------------------------------------------------------- compute */

#define LAUNCH(name)                                                                       \
    EXPORT CUresult name(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,  \
                         unsigned by, unsigned bz, unsigned shm, CUstream s, void **params, \
                         void **extra) {                                                   \
        ensure_init();                                                                     \
        if (UNLIKELY(throttle_active()))                                                   \
            throttle_take(current_device(), (uint64_t)gx * (gy ? gy : 1) * (gz ? gz : 1));  \
        return CALL_REAL(name, f, gx, gy, gz, bx, by, bz, shm, s, params, extra);          \
    }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)
LAUNCH(cuLaunchCooperativeKernel)
LAUNCH(cuLaunchCooperativeKernel_ptsz)

#define LAUNCH_EX(name)                                                                    \
    EXPORT CUresult name(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) { \
        ensure_init();                                                                     \
        if (UNLIKELY(throttle_active()) && c)                                              \
            throttle_take(current_device(), (uint64_t)c->gridDimX * (c->gridDimY ? c->gridDimY : 1) * \
                                                (c->gridDimZ ? c->gridDimZ : 1));          \
        return CALL_REAL(name, c, f, params, extra);                                       \
    }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define GRAPH_LAUNCH(name)                                                                 \
    EXPORT CUresult name(CUgraphExec g, CUstream s) {                                     \
        ensure_init();                                                                     \
        if (UNLIKELY(throttle_active())) {                                                 \
            int dev = current_device();                                                    \
            throttle_take(dev, throttle_typical_cost(dev));                                \
        }                                                                                  \
        return CALL_REAL(name, g, s);                                                      \
    }
GRAPH_LAUNCH(cuGraphLaunch)
GRAPH_LAUNCH(cuGraphLaunch_ptsz)

/* ---------------------------------------------------------------- dynamic resolution */

typedef struct {
    const char *name;  /* exported name */
    const char *base;  /* the name cuGetProcAddress is asked for */
    int since;         /* CUDA version (1000*major+10*minor) from which base means this one */
    int ptsz;          /* the per-thread-default-stream variant */
    void *hook;
    void **real;
} hook_entry;

EXPORT CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
EXPORT CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);

#define H(n, b, v, p) {#n, b, v, p, (void *)n, (void **)&real.n}
static const hook_entry g_hooks[] = {
    H(cuMemAlloc_v2, "cuMemAlloc", 3020, 0),
    H(cuMemAllocPitch_v2, "cuMemAllocPitch", 3020, 0),
    H(cuMemAllocManaged, "cuMemAllocManaged", 6000, 0),
    H(cuMemAllocAsync, "cuMemAllocAsync", 11020, 0),
    H(cuMemAllocAsync_ptsz, "cuMemAllocAsync", 11020, 1),
    H(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, 0),
    H(cuMemAllocFromPoolAsync_ptsz, "cuMemAllocFromPoolAsync", 11020, 1),
    H(cuMemCreate, "cuMemCreate", 10020, 0),
    H(cuArrayCreate_v2, "cuArrayCreate", 3020, 0),
    H(cuArray3DCreate_v2, "cuArray3DCreate", 3020, 0),
    H(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, 0),
    H(cuMemFree_v2, "cuMemFree", 3020, 0),
    H(cuMemFreeAsync, "cuMemFreeAsync", 11020, 0),
    H(cuMemFreeAsync_ptsz, "cuMemFreeAsync", 11020, 1),
    H(cuMemRelease, "cuMemRelease", 10020, 0),
    H(cuArrayDestroy, "cuArrayDestroy", 2000, 0),
    H(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, 0),
    H(cuMemGetInfo_v2, "cuMemGetInfo", 3020, 0),
    H(cuDeviceTotalMem_v2, "cuDeviceTotalMem", 3020, 0),
    H(cuLaunchKernel, "cuLaunchKernel", 4000, 0),
    H(cuLaunchKernel_ptsz, "cuLaunchKernel", 7000, 1),
    H(cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 9000, 0),
    H(cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 9000, 1),
    H(cuLaunchKernelEx, "cuLaunchKernelEx", 11060, 0),
    H(cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 11060, 1),
    H(cuGraphLaunch, "cuGraphLaunch", 10000, 0),
    H(cuGraphLaunch_ptsz, "cuGraphLaunch", 10000, 1),
    H(cuGetProcAddress, "cuGetProcAddress", 11030, 0),
    H(cuGetProcAddress_v2, "cuGetProcAddress", 12000, 0),
};
#define NHOOKS (sizeof g_hooks / sizeof *g_hooks)

static const hook_entry *hook_by_name(const char *name) {
    if (!name || name[0] != 'c' || name[1] != 'u') return NULL;
    for (size_t i = 0; i < NHOOKS; i++)
        if (strcmp(g_hooks[i].name, name) == 0) return &g_hooks[i];
    return NULL;
}

/* The pointer the driver handed out decides which hook replaces it: by identity with the
 * exported entry point first, and by (name, version, stream flavour) when the driver
 * returns an internal alias, so a pointer for a hooked function never goes out bare. */
static void *redirect(const char *sym, void *p, int version, cuuint64_t flags) {
    if (!p || !sym) return p;
    for (size_t i = 0; i < NHOOKS; i++)
        if (*g_hooks[i].real == p) return g_hooks[i].hook;
    int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    const hook_entry *best = NULL;
    for (size_t i = 0; i < NHOOKS; i++) {
        const hook_entry *e = &g_hooks[i];
        if (strcmp(e->base, sym) != 0 || e->since > version) continue;
        if (e->ptsz != want_ptsz && !(best == NULL && !e->ptsz)) continue;
        if (!best || e->since > best->since || (e->ptsz == want_ptsz && best->ptsz != want_ptsz))
            best = e;
    }
    if (!best) return p;
    if (*best->real == NULL) *best->real = p;
    shim_log("cuGetProcAddress(%s) gave an unexported pointer: routed through %s", sym, best->name);
    return best->hook;
}

EXPORT CUresult cuGetProcAddress(const char *sym, void **pfn, int version, cuuint64_t flags) {
    ensure_init();
    CUresult r = CALL_REAL(cuGetProcAddress, sym, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn) *pfn = redirect(sym, *pfn, version, flags);
    return r;
}

EXPORT CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                                    CUdriverProcAddressQueryResult *status) {
    ensure_init();
    CUresult r = CALL_REAL(cuGetProcAddress_v2, sym, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn) *pfn = redirect(sym, *pfn, version, flags);
    return r;
}

/* RTLD_NEXT means "after the caller", and glibc finds the caller from its return address.
 * So every lookup this shim does not answer itself ends in a tail call (a jump, at -O2 with
 * sibling calls, which the Makefile asks for): glibc then sees our caller, not us, and an
 * interposer asking for "the next malloc" never gets its own back. */
EXPORT void *dlsym(void *handle, const char *name) {
    if (UNLIKELY(!real_dlsym)) resolve_real_dlsym();
    if (name[0] == 'c' && name[1] == 'u') {
        const hook_entry *e = hook_by_name(name);
        if (e) return real_dlsym(handle, name) ? e->hook : NULL;
    }
    return real_dlsym(handle, name);
}

__attribute__((constructor)) static void resolve_early(void) { resolve_real_dlsym(); }

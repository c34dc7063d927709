/*
 * A stand-in libcuda.so.1 for testing the intercept shim on a machine without a GPU. It
 * implements the entry points the shim hooks on host memory, and a simulated GPU timeline
 * for kernel launches (each launch occupies the device for FAKE_CUDA_KERNEL_US, with a
 * short launch queue like the real driver's). What the "device" actually holds is kept in
 * a shared file (FAKE_CUDA_STATS) so a test can check, across processes, that the bytes
 * the driver handed out never passed the shim's limit.
 *
 * Linked with -Bsymbolic: like the real driver, the pointers its cuGetProcAddress returns
 * are its own functions, not whatever an LD_PRELOAD library exported under the same name.
 * One entry (cuMemAllocManaged) is handed out through an internal alias, as the real
 * driver does for some functions, to test that the shim still recognises it.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../src/cuda_types.h"
#include "fake_gpu.h"

#define API __attribute__((visibility("default")))
#define MAXDEV FAKE_MAXDEV
#define QUEUE_DEPTH 64

static fake_stats *g_stats;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_devices = 2;
/* NVIDIA_VISIBLE_DEVICES as the NVIDIA container toolkit applies it: the container sees only
 * the listed GPUs, numbered from 0; the counters (what the node's fake NVML reads) are kept
 * under the physical index. Entries are indices or UUIDs ending in "-<index>" (the fake
 * NVML's "GPU-fake-<index>"). */
static int g_physical[MAXDEV];
static uint64_t g_total = 16384ULL << 20;
static uint64_t g_kernel_ns;
static int g_no_memory; /* FAKE_CUDA_NO_MEMORY: hand out addresses only, for benchmarks */
static _Atomic uint64_t g_next_address = 1ULL << 40;
static __thread int t_dev;

static pthread_mutex_t g_gpu_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t g_busy_until, g_busy_total;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void visible_devices(void) {
    for (int i = 0; i < MAXDEV; i++) g_physical[i] = i;
    const char *s = getenv("NVIDIA_VISIBLE_DEVICES");
    if (!s || !*s || strcmp(s, "all") == 0) return;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", s);
    int n = 0;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item && n < MAXDEV;
         item = strtok_r(NULL, ",", &save)) {
        const char *digits = strrchr(item, '-');
        digits = digits ? digits + 1 : item;
        g_physical[n++] = atoi(digits) % MAXDEV;
    }
    g_devices = n;
}

static void setup(void) {
    const char *s = getenv("FAKE_CUDA_DEVICES");
    if (s) g_devices = atoi(s);
    visible_devices();
    s = getenv("FAKE_CUDA_TOTAL_MIB");
    if (s) g_total = strtoull(s, NULL, 10) << 20;
    s = getenv("FAKE_CUDA_KERNEL_US");
    if (s) g_kernel_ns = strtoull(s, NULL, 10) * 1000ULL;
    g_no_memory = getenv("FAKE_CUDA_NO_MEMORY") != NULL;
    s = getenv("FAKE_CUDA_STATS");
    if (s && *s) {
        int fd = open(s, O_RDWR | O_CREAT, 0600);
        if (fd >= 0 && ftruncate(fd, sizeof(fake_stats)) == 0) {
            void *p = mmap(NULL, sizeof(fake_stats), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (p != MAP_FAILED) g_stats = p;
        }
        if (fd >= 0) close(fd);
    }
    if (!g_stats) g_stats = calloc(1, sizeof(fake_stats));
}

static void ensure(void) { pthread_once(&g_once, setup); }

/* Every block of "device memory" carries its size and device just before it. */
typedef struct {
    uint64_t bytes;
    int dev;
    int magic;
} header;
#define MAGIC 0x0fa4e

static CUresult take(uint64_t bytes, int dev, void **out) {
    ensure();
    if (dev < 0 || dev >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    dev = g_physical[dev];
    uint64_t before = atomic_fetch_add(&g_stats->used[dev], bytes);
    if (before + bytes > g_total) {
        atomic_fetch_sub(&g_stats->used[dev], bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t now = before + bytes;
    uint64_t peak = atomic_load(&g_stats->peak[dev]);
    while (now > peak && !atomic_compare_exchange_weak(&g_stats->peak[dev], &peak, now)) {
    }
    atomic_fetch_add(&g_stats->allocations, 1);
    /* untouched pages cost no RSS, so large "device" blocks are cheap */
    header *h = malloc(sizeof(header) + (bytes ? bytes : 1));
    if (!h) {
        atomic_fetch_sub(&g_stats->used[dev], bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    h->bytes = bytes;
    h->dev = dev;
    h->magic = MAGIC;
    *out = h + 1;
    return CUDA_SUCCESS;
}

static CUresult give(void *p) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    header *h = (header *)p - 1;
    if (h->magic != MAGIC) return CUDA_ERROR_INVALID_VALUE;
    h->magic = 0;
    atomic_fetch_sub(&g_stats->used[h->dev], h->bytes);
    free(h);
    return CUDA_SUCCESS;
}

static CUresult alloc_dptr(CUdeviceptr *p, size_t n) {
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    if (g_no_memory) {
        *p = atomic_fetch_add(&g_next_address, (n + 255) & ~255ULL);
        return CUDA_SUCCESS;
    }
    void *q;
    CUresult r = take(n, t_dev, &q);
    if (r == CUDA_SUCCESS) *p = (CUdeviceptr)(uintptr_t)q;
    return r;
}

/* ------------------------------------------------------------------ device, context */
API CUresult cuInit(unsigned flags) { (void)flags; ensure(); return CUDA_SUCCESS; }
API CUresult cuDriverGetVersion(int *v) { *v = 12040; return CUDA_SUCCESS; }
API CUresult cuDeviceGetCount(int *n) { ensure(); *n = g_devices; return CUDA_SUCCESS; }
API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
    ensure();
    if (ordinal < 0 || ordinal >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    *d = ordinal;
    return CUDA_SUCCESS;
}
/* a context is just its device ordinal plus one */
API CUresult cuCtxSetCurrent(CUcontext c) {
    t_dev = c ? (int)((uintptr_t)c - 1) : 0;
    return CUDA_SUCCESS;
}
API CUresult cuCtxGetDevice(CUdevice *d) { *d = t_dev; return CUDA_SUCCESS; }
API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
    *c = (CUcontext)(uintptr_t)(d + 1);
    return CUDA_SUCCESS;
}
/* modules hold no code here: gpu_smoke.c can be dry-run against this fake */
API CUresult cuModuleLoadData(void **m, const void *image) {
    *m = (void *)image;
    return CUDA_SUCCESS;
}
API CUresult cuModuleGetFunction(CUfunction *f, void *m, const char *name) {
    (void)name;
    *f = (CUfunction)m;
    return CUDA_SUCCESS;
}
API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
    ensure();
    if (d < 0 || d >= g_devices) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = g_total;
    return CUDA_SUCCESS;
}
API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    ensure();
    uint64_t used = atomic_load(&g_stats->used[g_physical[t_dev]]);
    *free_bytes = used < g_total ? g_total - used : 0;
    *total_bytes = g_total;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */
API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { return alloc_dptr(p, n); }
API CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
    (void)e;
    *pitch = (w + 511) / 512 * 512;
    return alloc_dptr(p, *pitch * h);
}
API CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    (void)flags;
    return alloc_dptr(p, n);
}
static CUresult internal_alloc_managed(CUdeviceptr *p, size_t n, unsigned flags) {
    (void)flags;
    return alloc_dptr(p, n);
}
API CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc_dptr(p, n); }
API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, CUstream s) { (void)s; return alloc_dptr(p, n); }
API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)pool; (void)s;
    return alloc_dptr(p, n);
}
API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, CUmemoryPool pool, CUstream s) {
    (void)pool; (void)s;
    return alloc_dptr(p, n);
}
API CUresult cuMemFree_v2(CUdeviceptr p) {
    ensure();
    return g_no_memory ? CUDA_SUCCESS : give((void *)(uintptr_t)p);
}
API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { (void)s; return cuMemFree_v2(p); }
API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                         unsigned long long flags) {
    (void)flags;
    void *q;
    CUresult r = take(n, prop ? prop->location.id : 0, &q);
    if (r == CUDA_SUCCESS) *h = (CUmemGenericAllocationHandle)(uintptr_t)q;
    return r;
}
API CUresult cuMemRelease(CUmemGenericAllocationHandle h) { ensure(); return give((void *)(uintptr_t)h); }

static uint64_t fmt_bytes(CUarray_format f) {
    return f == CU_AD_FORMAT_UNSIGNED_INT8 || f == CU_AD_FORMAT_SIGNED_INT8 ? 1
           : f == CU_AD_FORMAT_UNSIGNED_INT16 || f == CU_AD_FORMAT_SIGNED_INT16 || f == CU_AD_FORMAT_HALF
               ? 2
               : 4;
}
API CUresult cuArrayCreate_v2(CUarray *a, const CUDA_ARRAY_DESCRIPTOR *d) {
    void *q;
    uint64_t n = d->Width * (d->Height ? d->Height : 1) * fmt_bytes(d->Format) * d->NumChannels;
    CUresult r = take(n, t_dev, &q);
    if (r == CUDA_SUCCESS) *a = (CUarray)q;
    return r;
}
API CUresult cuArray3DCreate_v2(CUarray *a, const CUDA_ARRAY3D_DESCRIPTOR *d) {
    void *q;
    uint64_t n = d->Width * (d->Height ? d->Height : 1) * (d->Depth ? d->Depth : 1) *
                 fmt_bytes(d->Format) * d->NumChannels;
    CUresult r = take(n, t_dev, &q);
    if (r == CUDA_SUCCESS) *a = (CUarray)q;
    return r;
}
API CUresult cuMipmappedArrayCreate(CUmipmappedArray *a, const CUDA_ARRAY3D_DESCRIPTOR *d, unsigned levels) {
    uint64_t n = 0;
    size_t w = d->Width, h = d->Height, z = d->Depth;
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        n += w * (h ? h : 1) * (z ? z : 1) * fmt_bytes(d->Format) * d->NumChannels;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        z = z > 1 ? z / 2 : z;
    }
    void *q;
    CUresult r = take(n, t_dev, &q);
    if (r == CUDA_SUCCESS) *a = (CUmipmappedArray)q;
    return r;
}
API CUresult cuArrayDestroy(CUarray a) { ensure(); return give(a); }
API CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) { ensure(); return give(a); }

/* ------------------------------------------------------------------ kernels */
static CUresult run_kernels(uint64_t count) {
    ensure();
    if (g_kernel_ns == 0) return CUDA_SUCCESS;
    pthread_mutex_lock(&g_gpu_mu);
    uint64_t now = now_ns();
    uint64_t start = g_busy_until > now ? g_busy_until : now;
    g_busy_until = start + count * g_kernel_ns;
    g_busy_total += count * g_kernel_ns;
    atomic_fetch_add(&g_stats->busy_ns[g_physical[t_dev]], count * g_kernel_ns);
    uint64_t ahead = g_busy_until - now;
    pthread_mutex_unlock(&g_gpu_mu);
    /* a full launch queue blocks the launching thread, as the real driver does */
    if (ahead > QUEUE_DEPTH * g_kernel_ns) {
        uint64_t wait = ahead - QUEUE_DEPTH * g_kernel_ns;
        struct timespec ts = {(time_t)(wait / 1000000000ULL), (long)(wait % 1000000000ULL)};
        nanosleep(&ts, NULL);
    }
    return CUDA_SUCCESS;
}
static CUresult run_kernel(void) { return run_kernels(1); }

/* a graph here is four kernels back to back */
API CUresult cuGraphLaunch(CUgraphExec g, CUstream s) {
    (void)g; (void)s;
    return run_kernels(4);
}
API CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return cuGraphLaunch(g, s); }

API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                            unsigned bz, unsigned shm, CUstream s, void **p, void **e) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shm; (void)s; (void)p; (void)e;
    return run_kernel();
}
API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shm, CUstream s, void **p, void **e) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, e);
}
API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                       unsigned by, unsigned bz, unsigned shm, CUstream s, void **p) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, NULL);
}
API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                            unsigned by, unsigned bz, unsigned shm, CUstream s, void **p) {
    return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shm, s, p, NULL);
}
API CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    (void)c; (void)f; (void)p; (void)e;
    return run_kernel();
}
API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *c, CUfunction f, void **p, void **e) {
    return cuLaunchKernelEx(c, f, p, e);
}
API CUresult cuCtxSynchronize(void) {
    pthread_mutex_lock(&g_gpu_mu);
    uint64_t until = g_busy_until;
    pthread_mutex_unlock(&g_gpu_mu);
    uint64_t now = now_ns();
    if (until > now) {
        uint64_t wait = until - now;
        struct timespec ts = {(time_t)(wait / 1000000000ULL), (long)(wait % 1000000000ULL)};
        nanosleep(&ts, NULL);
    }
    return CUDA_SUCCESS;
}
API CUresult cuStreamSynchronize(CUstream s) { (void)s; return cuCtxSynchronize(); }

/* Test hook: device time spent on kernels that have finished by now, like NVML's counter. */
API uint64_t fake_cuda_busy_ns(void) {
    pthread_mutex_lock(&g_gpu_mu);
    uint64_t now = now_ns();
    uint64_t pending = g_busy_until > now ? g_busy_until - now : 0;
    uint64_t done = g_busy_total - pending;
    pthread_mutex_unlock(&g_gpu_mu);
    return done;
}
API uint64_t fake_cuda_used_bytes(int dev) { ensure(); return atomic_load(&g_stats->used[g_physical[dev]]); }
API uint64_t fake_cuda_peak_bytes(int dev) { ensure(); return atomic_load(&g_stats->peak[g_physical[dev]]); }

/* ------------------------------------------------------------------ resolution */
typedef struct {
    const char *name;
    void *fn;
} proc;

API CUresult cuGetProcAddress(const char *, void **, int, cuuint64_t);
API CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

#define P(n) {#n, (void *)n}
static const proc g_procs[] = {
    P(cuInit), P(cuDriverGetVersion), P(cuDeviceGetCount), P(cuDeviceGet), P(cuCtxSetCurrent),
    P(cuCtxGetDevice), P(cuDeviceTotalMem_v2), P(cuMemGetInfo_v2), P(cuMemAlloc_v2),
    P(cuMemAllocPitch_v2), {"cuMemAllocManaged", (void *)internal_alloc_managed}, P(cuMemAllocAsync),
    P(cuMemAllocAsync_ptsz), P(cuMemAllocFromPoolAsync), P(cuMemAllocFromPoolAsync_ptsz),
    P(cuMemFree_v2), P(cuMemFreeAsync), P(cuMemFreeAsync_ptsz), P(cuMemCreate), P(cuMemRelease),
    P(cuArrayCreate_v2), P(cuArray3DCreate_v2), P(cuMipmappedArrayCreate), P(cuArrayDestroy),
    P(cuMipmappedArrayDestroy), P(cuLaunchKernel), P(cuLaunchKernel_ptsz), P(cuLaunchCooperativeKernel),
    P(cuLaunchCooperativeKernel_ptsz), P(cuLaunchKernelEx), P(cuLaunchKernelEx_ptsz),
    P(cuGraphLaunch), P(cuGraphLaunch_ptsz), P(cuCtxSynchronize), P(cuStreamSynchronize), P(cuGetProcAddress), P(cuGetProcAddress_v2),
};

static void *find(const char *name) {
    for (size_t i = 0; i < sizeof g_procs / sizeof *g_procs; i++)
        if (strcmp(g_procs[i].name, name) == 0) return g_procs[i].fn;
    return NULL;
}

static void *lookup(const char *sym, int version, cuuint64_t flags) {
    char buf[128];
    void *fn = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) {
        snprintf(buf, sizeof buf, "%s_ptsz", sym);
        fn = find(buf);
    }
    if (!fn && strcmp(sym, "cuGetProcAddress") == 0) fn = find(version >= 12000 ? "cuGetProcAddress_v2" : sym);
    if (!fn && version >= 3020) {
        snprintf(buf, sizeof buf, "%s_v2", sym);
        fn = find(buf);
    }
    return fn ? fn : find(sym);
}

API CUresult cuGetProcAddress(const char *sym, void **pfn, int version, cuuint64_t flags) {
    void *fn = lookup(sym, version, flags);
    *pfn = fn;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

API CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int version, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *status) {
    void *fn = lookup(sym, version, flags);
    *pfn = fn;
    if (status) *status = fn ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return fn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

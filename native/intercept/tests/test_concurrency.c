/*
 * 4 processes x 8 threads allocate and free at random through three allocation paths
 * against one container budget. What the fake driver actually handed out (tracked across
 * processes in FAKE_CUDA_STATS) must never pass the limit, the budget must be contended
 * (peak near the limit, refusals seen), and once everyone is gone the whole limit must be
 * allocatable again. A process killed while holding memory must not leak its share.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../src/cuda_types.h"
#include "../src/shim.h"
#include "check.h"

CUresult cuInit(unsigned);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, CUstream);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
uint64_t fake_cuda_used_bytes(int);
uint64_t fake_cuda_peak_bytes(int);

#define PROCS 4
#define THREADS 8
#define ITERATIONS 4000
#define HOLD 6

static uint64_t g_limit;

typedef struct {
    uint64_t h;
    int kind;
} held;

static void release(held *x) {
    if (x->kind == 0) cuMemFree_v2(x->h);
    else if (x->kind == 1) cuMemFreeAsync(x->h, NULL);
    else cuMemRelease(x->h);
    x->h = 0;
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    held mine[HOLD] = {{0}};
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    for (int i = 0; i < ITERATIONS; i++) {
        int slot = rand_r(&seed) % HOLD;
        if (mine[slot].h) {
            release(&mine[slot]);
            continue;
        }
        /* sizes up to 1/16 of the limit, never aligned, so the sum rarely lands on it */
        size_t n = 4096 + (size_t)rand_r(&seed) % (g_limit / 16) + (size_t)(rand_r(&seed) % 4093);
        int kind = rand_r(&seed) % 3;
        CUresult r;
        uint64_t h = 0;
        if (kind == 0) r = cuMemAlloc_v2((CUdeviceptr *)&h, n);
        else if (kind == 1) r = cuMemAllocAsync((CUdeviceptr *)&h, n, NULL);
        else r = cuMemCreate((CUmemGenericAllocationHandle *)&h, n, &prop, 0);
        if (r == CUDA_SUCCESS) mine[slot] = (held){h, kind};
        else if (r != CUDA_ERROR_OUT_OF_MEMORY) abort();
    }
    for (int s = 0; s < HOLD; s++)
        if (mine[s].h) release(&mine[s]);
    return NULL;
}

static int child(int id) {
    cuInit(0);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(id * 1000 + i + 1));
    for (int i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
    return 0;
}

static alnair_region *map_region(void) {
    int fd = open(getenv("ALNAIR_VGPU_REGION"), O_RDWR);
    if (fd < 0) return NULL;
    void *p = mmap(NULL, sizeof(alnair_region), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

int main(void) {
    g_limit = strtoull(getenv("ALNAIR_GPU_MEMORY_LIMIT_BYTES"), NULL, 10);
    pid_t pids[PROCS];
    /* fork before any CUDA call: each process attaches to the region on its own */
    for (int p = 0; p < PROCS; p++) {
        pids[p] = fork();
        if (pids[p] == 0) _exit(child(p));
    }
    int clean = 1;
    for (int p = 0; p < PROCS; p++) {
        int status = 0;
        waitpid(pids[p], &status, 0);
        clean &= WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    CHECK("4 processes x 8 threads ran to the end", clean, "a worker process failed");

    alnair_region *region = map_region();
    CHECK("the container's region exists", region != NULL, "cannot map ALNAIR_VGPU_REGION");
    if (!region) return 1;
    uint64_t peak = fake_cuda_peak_bytes(0);
    uint64_t accounted_peak = atomic_load(&region->devices[0].peak_bytes);
    uint64_t ooms = atomic_load(&region->devices[0].oom_count);
    printf("INFO limit=%llu driver_peak=%llu accounted_peak=%llu refusals=%llu\n",
           (unsigned long long)g_limit, (unsigned long long)peak,
           (unsigned long long)accounted_peak, (unsigned long long)ooms);
    CHECK("never a byte over the limit (driver's view, all processes)", peak <= g_limit,
          "driver held %llu of %llu", (unsigned long long)peak, (unsigned long long)g_limit);
    CHECK("never a byte over the limit (accounting)", accounted_peak <= g_limit,
          "accounted %llu", (unsigned long long)accounted_peak);
    CHECK("the budget was contended", peak > g_limit / 10 * 9 && ooms > 0,
          "peak %llu, refusals %llu", (unsigned long long)peak, (unsigned long long)ooms);
    CHECK("everything freed: accounting back to zero",
          atomic_load(&region->devices[0].used_bytes) == 0 && fake_cuda_used_bytes(0) == 0,
          "accounted %llu, driver %llu", (unsigned long long)atomic_load(&region->devices[0].used_bytes),
          (unsigned long long)fake_cuda_used_bytes(0));

    /* a process that dies holding memory: the next one to need room gets it back */
    pid_t victim = fork();
    if (victim == 0) {
        CUdeviceptr p;
        cuInit(0);
        cuMemAlloc_v2(&p, g_limit / 2);
        raise(SIGKILL);
        _exit(0);
    }
    int status;
    waitpid(victim, &status, 0);
    uint64_t stranded = atomic_load(&region->devices[0].used_bytes);

    cuInit(0);
    CUdeviceptr whole = 0, extra = 0;
    CUresult r = cuMemAlloc_v2(&whole, g_limit);
    CUresult over = cuMemAlloc_v2(&extra, 1);
    CHECK("a killed process's bytes come back", stranded == g_limit / 2 && r == CUDA_SUCCESS,
          "stranded %llu, whole limit -> %d", (unsigned long long)stranded, r);
    CHECK("after the run the whole limit and not a byte more", over == CUDA_ERROR_OUT_OF_MEMORY,
          "one more byte -> %d", over);
    cuMemFree_v2(whole);

    /* a process that exits without freeing, not yet reaped by its parent (a zombie) */
    int ready[2];
    if (pipe(ready) != 0) return 1;
    pid_t leaver = fork();
    if (leaver == 0) {
        CUdeviceptr p;
        CUresult got = cuMemAlloc_v2(&p, g_limit / 2);
        if (write(ready[1], &got, sizeof got) != (ssize_t)sizeof got) _exit(2);
        _exit(0); /* no cuMemFree, no exit handlers */
    }
    CUresult child_got = CUDA_ERROR_NOT_INITIALIZED;
    if (read(ready[0], &child_got, sizeof child_got) != (ssize_t)sizeof child_got) return 1;
    siginfo_t info;
    memset(&info, 0, sizeof info);
    waitid(P_PID, (id_t)leaver, &info, WEXITED | WNOWAIT); /* exited, left unreaped */
    CUdeviceptr again = 0;
    r = cuMemAlloc_v2(&again, g_limit);
    CHECK("an exited, unreaped process's bytes come back", child_got == CUDA_SUCCESS && r == CUDA_SUCCESS,
          "child allocation -> %d, whole limit afterwards -> %d", child_got, r);
    cuMemFree_v2(again);
    waitpid(leaver, &status, 0);
    return g_failed ? 1 : 0;
}

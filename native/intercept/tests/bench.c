/*
 * Cost of a hooked call: times cuLaunchKernel and cuMemAlloc_v2 / cuMemFree_v2 against
 * the fake driver (whose own work is tiny), best of several rounds, and prints
 * nanoseconds per call. bench.sh runs it bare and under the shim and subtracts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "../src/cuda_types.h"

CUresult cuInit(unsigned);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);

#define ROUNDS 7
#define LAUNCHES 2000000
#define ALLOCS 4096
#define ALLOC_REPEATS 64

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(void) {
    cuInit(0);
    static CUdeviceptr ptrs[ALLOCS];
    double launch = 1e30, alloc = 1e30, release = 1e30;
    for (int round = 0; round < ROUNDS; round++) {
        double t0 = now_ns();
        for (int i = 0; i < LAUNCHES; i++) cuLaunchKernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
        double t1 = now_ns();
        if ((t1 - t0) / LAUNCHES < launch) launch = (t1 - t0) / LAUNCHES;
        double a = 0, f = 0;
        for (int rep = 0; rep < ALLOC_REPEATS; rep++) {
            double s0 = now_ns();
            for (int i = 0; i < ALLOCS; i++)
                if (cuMemAlloc_v2(&ptrs[i], 256) != CUDA_SUCCESS) abort();
            double s1 = now_ns();
            for (int i = 0; i < ALLOCS; i++) cuMemFree_v2(ptrs[i]);
            double s2 = now_ns();
            a += s1 - s0;
            f += s2 - s1;
        }
        a /= (double)ALLOCS * ALLOC_REPEATS;
        f /= (double)ALLOCS * ALLOC_REPEATS;
        if (a < alloc) alloc = a;
        if (f < release) release = f;
    }
    printf("%.2f %.2f %.2f\n", launch, alloc, release);
    return 0;
}

/*
 * What the fake driver (fake_cuda.c) shares with the fake NVML (fake_nvml.c): each process's
 * counters in the file named by its FAKE_CUDA_STATS. The fake NVML finds a process's file
 * through /proc/<pid>/environ and /proc/<pid>/root, as NVML sees a containerised process from
 * the host, so a container's usage reaches the node's profiler agent.
 */
#ifndef FAKE_GPU_H
#define FAKE_GPU_H
#include <stdatomic.h>
#include <stdint.h>

#define FAKE_MAXDEV 16

typedef struct {
    _Atomic uint64_t used[FAKE_MAXDEV];    /* bytes held on each device now */
    _Atomic uint64_t peak[FAKE_MAXDEV];
    _Atomic uint64_t allocations;
    _Atomic uint64_t busy_ns[FAKE_MAXDEV]; /* device time of the kernels launched so far */
} fake_stats;

#endif

/*
 * Compute share: this program plays the node's vGPU registry (accepts the shim's
 * registration on ALNAIR_REGISTRY_SOCKET and sends it the container's measured
 * utilisation every 100 ms, read from the fake GPU's busy time as NVML would report it),
 * then launches fake kernels back to back for a few seconds. The device time they take
 * must match the requested share (ALNAIR_GPU_COMPUTE_PCT) within 10%; with no limit the
 * shim must hold no launch back.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>
#include <stdatomic.h>
#include <sys/mman.h>

#include "../src/cuda_types.h"
#include "../src/shim.h"
#include "check.h"

CUresult cuInit(unsigned);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        CUstream, void **, void **);
CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuGraphLaunch(CUgraphExec, CUstream);
uint64_t fake_cuda_busy_ns(void);

#define WARMUP_S 0.5
#define MEASURE_S 3.0
#define FEEDBACK_MS 100

static int g_listen = -1;
static char g_register[512];
static volatile int g_stop;

static const alnair_region *map_region(void) {
    const char *path = getenv("ALNAIR_VGPU_REGION");
    int fd = path ? open(path, O_RDONLY) : -1;
    if (fd < 0) return NULL;
    void *p = mmap(NULL, sizeof(alnair_region), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int g_reregistered;

/* With TEST_REGISTRY_RESTART set, the stand-in drops the shim after 1 s, as a restarting
 * device plugin would, and expects the shim to register again on its own. */
static void *registry(void *arg) {
    (void)arg;
    int restart = getenv("TEST_REGISTRY_RESTART") != NULL;
    int fd = accept(g_listen, NULL, NULL);
    if (fd < 0) return NULL;
    ssize_t n = read(fd, g_register, sizeof g_register - 1);
    if (n > 0) g_register[n] = '\0';
    uint64_t last = fake_cuda_busy_ns();
    double last_t = now_s(), started = last_t;
    while (!g_stop) {
        struct timespec ts = {0, FEEDBACK_MS * 1000000L};
        nanosleep(&ts, NULL);
        if (restart && now_s() - started > 1.0) {
            restart = 0;
            close(fd);
            fd = accept(g_listen, NULL, NULL);
            if (fd < 0) return NULL;
            char again[512];
            ssize_t m = read(fd, again, sizeof again - 1);
            if (m > 0) {
                again[m] = '\0';
                g_reregistered = strncmp(again, "REGISTER ", 9) == 0;
            }
        }
        uint64_t busy = fake_cuda_busy_ns();
        double t = now_s();
        char line[64];
        int len = snprintf(line, sizeof line, "UTIL 0 %.2f\n", (double)(busy - last) / ((t - last_t) * 1e9) * 100.0);
        if (write(fd, line, (size_t)len) != len) break;
        last = busy;
        last_t = t;
    }
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "kernel";
    int use_ex = strcmp(mode, "ex") == 0;
    int use_graph = strcmp(mode, "graph") == 0;
    const char *path_name = use_graph ? "cuGraphLaunch" : use_ex ? "cuLaunchKernelEx" : "cuLaunchKernel";
    const char *pct_text = getenv("ALNAIR_GPU_COMPUTE_PCT");
    double target = pct_text && *pct_text ? atof(pct_text) : 100.0;
    const char *path = getenv("ALNAIR_REGISTRY_SOCKET");
    pthread_t t;
    int have_registry = 0;
    if (path && *path) {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
        unlink(path);
        g_listen = socket(AF_UNIX, SOCK_STREAM, 0);
        have_registry = bind(g_listen, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(g_listen, 4) == 0;
        if (have_registry) pthread_create(&t, NULL, registry, NULL);
    }
    cuInit(0);
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = 80;
    cfg.gridDimY = cfg.gridDimZ = 1;
    double start = now_s();
    double begin = start + WARMUP_S, end = begin + MEASURE_S;
    uint64_t busy_begin = 0;
    long launches = 0;
    int measuring = 0;
    for (;;) {
        double t_now = now_s();
        if (!measuring && t_now >= begin) {
            busy_begin = fake_cuda_busy_ns();
            measuring = 1;
        }
        if (t_now >= end) break;
        CUresult r = use_graph ? cuGraphLaunch(NULL, NULL)
                     : use_ex  ? cuLaunchKernelEx(&cfg, NULL, NULL, NULL)
                               : cuLaunchKernel(NULL, 80, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
        if (r != CUDA_SUCCESS) abort();
        if (measuring) launches++;
    }
    double elapsed = now_s() - begin;
    double share = (double)(fake_cuda_busy_ns() - busy_begin) / (elapsed * 1e9) * 100.0;
    g_stop = 1;
    char name[160];
    printf("INFO path=%s target=%.0f%% measured=%.1f%% launches=%ld over %.2fs\n",
           path_name, target, share, launches, elapsed);
    if (target < 100.0) {
        snprintf(name, sizeof name, "%s held to %.0f%% of the GPU within 10%%", path_name, target);
        CHECK(name, share >= target * 0.9 && share <= target * 1.1, "measured %.1f%%", share);
        char want[64];
        snprintf(want, sizeof want, "pid=%d ", (int)getpid());
        if (getenv("TEST_REGISTRY_RESTART"))
            CHECK("the shim registers again after the registry restarts", g_reregistered,
                  "no second REGISTER");
        CHECK("the process registered with the vGPU registry",
              have_registry && strstr(g_register, "REGISTER ") == g_register && strstr(g_register, want) &&
                  strstr(g_register, "compute=") != NULL,
              "registry got \"%s\"", g_register);
    } else {
        /* The share stays under 100% only when the machine deschedules the launching thread,
         * so the sharp check is that the shim never held a launch back. */
        const alnair_region *region = map_region();
        uint64_t held = region ? atomic_load(&region->devices[0].launches) : 1;
        CHECK("no compute limit: the shim holds no launch back", region && held == 0,
              "%llu launches went through the throttle", (unsigned long long)held);
        CHECK("no compute limit: launches keep the GPU busy", share >= 50.0, "measured %.1f%%", share);
    }
    return g_failed ? 1 : 0;
}

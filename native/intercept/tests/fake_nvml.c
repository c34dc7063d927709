/*
 * A stand-in libnvidia-ml.so.1 for a machine without a GPU: the NVML entry points the
 * profiler's nvml backend calls (through the nvidia-ml-py bindings), answered from the fake
 * driver's per-process counters (fake_gpu.h).
 *
 * - Devices: FAKE_NVML_DEVICES (2) of FAKE_NVML_NAME ("Tesla V100-SXM2-16GB"),
 *   FAKE_NVML_TOTAL_MIB (16384) each, compute capability FAKE_NVML_CC ("7.0"), UUIDs
 *   "<FAKE_NVML_UUID_PREFIX>-<index>" ("GPU-fake-<index>"); no NVLink; every pair shares a
 *   NUMA node.
 * - Processes: every process whose environment names FAKE_CUDA_STATS, read through
 *   /proc/<pid>/root (FAKE_NVML_PROC: "/proc"), so a container's process shows with its host
 *   pid, as NVML shows it. A process is on a device while it holds memory there or has
 *   launched kernels there.
 * - Utilization: a process's SM share is the device time its kernels took between two
 *   readings over the wall time between them; the device's is the sum, at most 100.
 * - Events: nvmlEventSetWait reports the XIDs appended to FAKE_NVML_XID_FILE as lines
 *   "<gpu index> <xid>", and times out otherwise.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_gpu.h"

#define API __attribute__((visibility("default")))
#define MAXPROCS 256

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_TIMEOUT = 10,
};
#define XID_CRITICAL_ERROR 0x8ULL
#define TOPOLOGY_NODE 40

typedef struct {
    int index;
} device;
typedef device *nvmlDevice_t;

typedef struct {
    char busIdLegacy[16];
    unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned gpu, memory;
} nvmlUtilization_t;

typedef struct {
    unsigned pid;
    unsigned long long usedGpuMemory;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

typedef struct {
    unsigned pid;
    unsigned long long timeStamp;
    unsigned smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct {
    long offset; /* how far the XID file has been read */
} event_set;
typedef event_set *nvmlEventSet_t;

static device g_devices[FAKE_MAXDEV];
static int g_count = 2;
static uint64_t g_total = 16384ULL << 20;
static int g_cc_major = 7, g_cc_minor = 0;
static const char *g_name = "Tesla V100-SXM2-16GB";
static const char *g_uuid_prefix = "GPU-fake";
static const char *g_proc = "/proc";
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* the last reading of each (process, device), for rates between readings */
typedef struct {
    unsigned pid;
    int dev;
    uint64_t busy_ns, at_ns;
} reading;
static reading g_seen[MAXPROCS];
static int g_nseen;
static uint64_t g_dev_busy[FAKE_MAXDEV], g_dev_at[FAKE_MAXDEV];

typedef struct {
    unsigned pid;
    fake_stats stats;
} proc_usage;
static proc_usage g_procs[MAXPROCS]; /* the last scan, read and written under g_mu */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static uint64_t wall_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000ULL + (uint64_t)ts.tv_nsec / 1000ULL;
}

static device *dev_of(nvmlDevice_t d) {
    if (!d || d < g_devices || d >= g_devices + g_count) return NULL;
    return d;
}

/* FAKE_CUDA_STATS from a process's environment, or 0 */
static int stats_path(unsigned pid, char *out, size_t n) {
    char path[64];
    snprintf(path, sizeof path, "%s/%u/environ", g_proc, pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[16384];
    ssize_t got = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (got <= 0) return 0;
    buf[got] = 0;
    static const char key[] = "FAKE_CUDA_STATS=";
    for (char *p = buf; p < buf + got; p += strlen(p) + 1) {
        if (strncmp(p, key, sizeof key - 1) == 0 && p[sizeof key - 1]) {
            snprintf(out, n, "%s", p + sizeof key - 1);
            return 1;
        }
    }
    return 0;
}

/* every process using the fake driver, with its counters */
static int scan(proc_usage *out, int max) {
    DIR *dir = opendir(g_proc);
    if (!dir) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) && n < max) {
        char *end;
        unsigned long pid = strtoul(e->d_name, &end, 10);
        if (*end || pid == 0) continue;
        char inside[512], path[700];
        if (!stats_path((unsigned)pid, inside, sizeof inside)) continue;
        snprintf(path, sizeof path, "%s/%lu/root%s%s", g_proc, pid, inside[0] == '/' ? "" : "/", inside);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        ssize_t got = pread(fd, &out[n].stats, sizeof out[n].stats, 0);
        close(fd);
        if (got != (ssize_t)sizeof out[n].stats) continue;
        out[n].pid = (unsigned)pid;
        n++;
    }
    closedir(dir);
    return n;
}

static int on_device(const proc_usage *p, int dev) {
    return atomic_load(&p->stats.used[dev]) > 0 || atomic_load(&p->stats.busy_ns[dev]) > 0;
}

static unsigned share(uint64_t busy, uint64_t elapsed) {
    if (elapsed == 0) return 0;
    double pct = 100.0 * (double)busy / (double)elapsed;
    return pct > 100 ? 100 : (unsigned)(pct + 0.5);
}

/* the SM share of (pid, dev) since its last reading; the first reading gives 0 */
static unsigned process_share(unsigned pid, int dev, uint64_t busy, uint64_t at) {
    for (int i = 0; i < g_nseen; i++) {
        if (g_seen[i].pid == pid && g_seen[i].dev == dev) {
            uint64_t db = busy >= g_seen[i].busy_ns ? busy - g_seen[i].busy_ns : 0;
            unsigned pct = share(db, at - g_seen[i].at_ns);
            g_seen[i].busy_ns = busy;
            g_seen[i].at_ns = at;
            return pct;
        }
    }
    int slot = g_nseen < MAXPROCS ? g_nseen++ : (int)(pid % MAXPROCS);
    g_seen[slot] = (reading){pid, dev, busy, at};
    return 0;
}

__attribute__((constructor)) static void setup(void) {
    const char *s;
    if ((s = getenv("FAKE_NVML_DEVICES"))) g_count = atoi(s);
    if (g_count < 0) g_count = 0;
    if (g_count > FAKE_MAXDEV) g_count = FAKE_MAXDEV;
    if ((s = getenv("FAKE_NVML_TOTAL_MIB"))) g_total = strtoull(s, NULL, 10) << 20;
    if ((s = getenv("FAKE_NVML_NAME"))) g_name = s;
    if ((s = getenv("FAKE_NVML_UUID_PREFIX"))) g_uuid_prefix = s;
    if ((s = getenv("FAKE_NVML_PROC"))) g_proc = s;
    if ((s = getenv("FAKE_NVML_CC"))) sscanf(s, "%d.%d", &g_cc_major, &g_cc_minor);
    for (int i = 0; i < FAKE_MAXDEV; i++) g_devices[i].index = i;
}

API nvmlReturn_t nvmlInitWithFlags(unsigned flags) { (void)flags; return NVML_SUCCESS; }
API nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
API nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
API nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

API const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned *n) {
    if (!n) return NVML_ERROR_INVALID_ARGUMENT;
    *n = (unsigned)g_count;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned i, nvmlDevice_t *d) {
    if (!d || i >= (unsigned)g_count) return NVML_ERROR_INVALID_ARGUMENT;
    *d = &g_devices[i];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned n) {
    device *dev = dev_of(d);
    if (!dev || !uuid) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(uuid, n, "%s-%d", g_uuid_prefix, dev->index);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned n) {
    if (!dev_of(d) || !name) return NVML_ERROR_INVALID_ARGUMENT;
    snprintf(name, n, "%s", g_name);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *pci) {
    device *dev = dev_of(d);
    if (!dev || !pci) return NVML_ERROR_INVALID_ARGUMENT;
    memset(pci, 0, sizeof *pci);
    pci->bus = 0x3b + (unsigned)dev->index;
    pci->pciDeviceId = 0x1db110de;
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", pci->bus);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", pci->bus);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
    if (!dev_of(d) || !major || !minor) return NVML_ERROR_INVALID_ARGUMENT;
    *major = g_cc_major;
    *minor = g_cc_minor;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned link, unsigned *active) {
    (void)d; (void)link; (void)active;
    return NVML_ERROR_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t d, unsigned link, nvmlPciInfo_t *pci) {
    (void)d; (void)link; (void)pci;
    return NVML_ERROR_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int *level) {
    if (!dev_of(a) || !dev_of(b) || !level) return NVML_ERROR_INVALID_ARGUMENT;
    *level = TOPOLOGY_NODE;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    device *dev = dev_of(d);
    if (!dev || !m) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_mu);
    int n = scan(g_procs, MAXPROCS);
    uint64_t used = 0;
    for (int i = 0; i < n; i++) used += atomic_load(&g_procs[i].stats.used[dev->index]);
    pthread_mutex_unlock(&g_mu);
    m->total = g_total;
    m->used = used > g_total ? g_total : used;
    m->free = g_total - m->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    device *dev = dev_of(d);
    if (!dev || !u) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_mu);
    int n = scan(g_procs, MAXPROCS);
    uint64_t busy = 0, at = now_ns();
    for (int i = 0; i < n; i++) busy += atomic_load(&g_procs[i].stats.busy_ns[dev->index]);
    uint64_t prev = g_dev_busy[dev->index], since = g_dev_at[dev->index];
    u->gpu = since && busy >= prev ? share(busy - prev, at - since) : 0;
    u->memory = 0;
    g_dev_busy[dev->index] = busy;
    g_dev_at[dev->index] = at;
    pthread_mutex_unlock(&g_mu);
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned *count,
                                                         nvmlProcessInfo_v2_t *infos) {
    device *dev = dev_of(d);
    if (!dev || !count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_mu);
    int n = scan(g_procs, MAXPROCS);
    unsigned found = 0;
    for (int i = 0; i < n; i++) {
        if (!on_device(&g_procs[i], dev->index)) continue;
        if (infos && found < *count) {
            infos[found] = (nvmlProcessInfo_v2_t){g_procs[i].pid,
                                                  atomic_load(&g_procs[i].stats.used[dev->index]), ~0u, ~0u};
        }
        found++;
    }
    pthread_mutex_unlock(&g_mu);
    unsigned room = *count;
    *count = found;
    if (found == 0) return NVML_SUCCESS;
    return infos && found <= room ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

API nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *samples,
                                                 unsigned *count, unsigned long long last_seen_us) {
    (void)last_seen_us;
    device *dev = dev_of(d);
    if (!dev || !count) return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_lock(&g_mu);
    int n = scan(g_procs, MAXPROCS);
    unsigned found = 0;
    uint64_t at = now_ns(), stamp = wall_us();
    for (int i = 0; i < n; i++) {
        uint64_t busy = atomic_load(&g_procs[i].stats.busy_ns[dev->index]);
        if (busy == 0) continue;
        /* the size query reads nothing, so the rates span reading to reading */
        if (samples && found < *count) {
            unsigned pct = process_share(g_procs[i].pid, dev->index, busy, at);
            samples[found] = (nvmlProcessUtilizationSample_t){g_procs[i].pid, stamp, pct, 0, 0, 0};
        }
        found++;
    }
    pthread_mutex_unlock(&g_mu);
    unsigned room = *count;
    *count = found;
    if (found == 0) return NVML_ERROR_NOT_FOUND;
    return samples && found <= room ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
}

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(event_set));
    const char *file = getenv("FAKE_NVML_XID_FILE");
    if (*set && file) {
        FILE *f = fopen(file, "r");
        if (f) { /* only XIDs written from now on */
            fseek(f, 0, SEEK_END);
            (*set)->offset = ftell(f);
            fclose(f);
        }
    }
    return *set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    (void)types;
    return dev_of(d) && set ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* the next "<index> <xid>" line of the XID file past the set's offset, if any */
static int next_xid(event_set *set, int *index, unsigned long long *xid) {
    const char *file = getenv("FAKE_NVML_XID_FILE");
    if (!file) return 0;
    FILE *f = fopen(file, "r");
    if (!f) return 0;
    int got = 0;
    char line[128];
    if (fseek(f, set->offset, SEEK_SET) == 0 && fgets(line, sizeof line, f) && strchr(line, '\n')) {
        set->offset = ftell(f);
        got = sscanf(line, "%d %llu", index, xid) == 2 && *index >= 0 && *index < g_count;
    }
    fclose(f);
    return got;
}

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeout_ms) {
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ULL;
    for (;;) {
        int index;
        unsigned long long xid;
        if (next_xid(set, &index, &xid)) {
            *data = (nvmlEventData_t){&g_devices[index], XID_CRITICAL_ERROR, xid, ~0u, ~0u};
            return NVML_SUCCESS;
        }
        if (now_ns() >= deadline) return NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 50 * 1000000L}; /* a driver's event queue, looked at often */
        nanosleep(&ts, NULL);
    }
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    free(set);
    return NVML_SUCCESS;
}

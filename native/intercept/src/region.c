/*
 * The per-container accounting region: one shared file that every process of a container
 * maps, holding the bytes each device has reserved. Reservation is a compare-and-swap loop
 * on the device counter, so any number of threads and processes together can never hold
 * more than the limit. Each process also keeps its own share in a slot, so a process that
 * dies without freeing (SIGKILL, OOM killer) has its bytes returned by the next process
 * that needs room (or the next process to start), since the driver frees a dead process's
 * memory anyway. A process that exits normally is treated the same way: an exit handler
 * cannot give bytes back safely while other threads of the process may still be allocating.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shim.h"

static alnair_region *g_region;
static alnair_proc_slot *g_slot;
static alnair_proc_slot g_private_slot; /* when the table is full: accounting still holds */
static uint64_t g_limit[ALNAIR_MAX_DEVICES];

/* Start time (clock ticks since boot) of `pid`, 0 if it is gone; `zombie` says whether it has
 * exited and only waits to be reaped, which for the driver is as good as gone. */
static uint64_t proc_stat(pid_t pid, int *zombie) {
    char path[64];
    char buf[1024];
    *zombie = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    /* the command name may hold spaces and parentheses: count fields after the last ')' */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return 0;
    *zombie = p[2] == 'Z' || p[2] == 'X';
    int field = 2;
    for (; *p && field < 22; p++)
        if (*p == ' ') field++;
    return strtoull(p, NULL, 10);
}

static uint64_t proc_start_time(pid_t pid) {
    int zombie;
    return proc_stat(pid, &zombie);
}

static int slot_owner_dead(alnair_proc_slot *s, int32_t pid) {
    uint64_t started = atomic_load(&s->start_time);
    if (started == 0) return 0; /* still being claimed */
    if (kill(pid, 0) == -1 && errno == ESRCH) return 1;
    int zombie;
    uint64_t now = proc_stat(pid, &zombie);
    /* exited (a zombie has released its GPU memory), or the pid was reused */
    return zombie || (now != 0 && now != started);
}

int region_reclaim_dead(void) {
    if (!g_region) return 0;
    int freed = 0;
    pid_t self = getpid();
    for (int i = 0; i < ALNAIR_MAX_PROCS; i++) {
        alnair_proc_slot *s = &g_region->procs[i];
        int32_t pid = atomic_load(&s->pid);
        if (pid <= 0 || pid == self || !slot_owner_dead(s, pid)) continue;
        /* only the process that wins this exchange gives the bytes back */
        if (!atomic_compare_exchange_strong(&s->pid, &pid, -1)) continue;
        for (int d = 0; d < ALNAIR_MAX_DEVICES; d++) {
            uint64_t held = atomic_exchange(&s->used[d], 0);
            if (held) atomic_fetch_sub(&g_region->devices[d].used_bytes, held);
        }
        atomic_store(&s->start_time, 0);
        atomic_store(&s->pid, 0);
        freed++;
    }
    return freed;
}

static void claim_slot(void) {
    pid_t self = getpid();
    for (int attempt = 0; attempt < 2; attempt++) {
        for (int i = 0; i < ALNAIR_MAX_PROCS; i++) {
            alnair_proc_slot *s = &g_region->procs[i];
            int32_t expected = 0;
            if (atomic_compare_exchange_strong(&s->pid, &expected, self)) {
                for (int d = 0; d < ALNAIR_MAX_DEVICES; d++) atomic_store(&s->used[d], 0);
                uint64_t started = proc_start_time(self);
                atomic_store(&s->start_time, started ? started : 1);
                g_slot = s;
                atomic_fetch_add(&g_region->registered, 1);
                return;
            }
        }
        region_reclaim_dead();
    }
    shim_log("process table of the region is full: a crash of this process would leak its bytes");
    g_slot = &g_private_slot;
}

int region_open(const char *path) {
    alnair_region *r = MAP_FAILED;
    if (path && *path) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fd >= 0) {
            /* the lock orders the first process's initialisation before everyone's use */
            flock(fd, LOCK_EX);
            struct stat st;
            if (fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof(alnair_region)) {
                /* processes of one container may run as different users: all must attach */
                if (fchmod(fd, 0666) != 0) shim_log("cannot open %s to every user", path);
                if (ftruncate(fd, sizeof(alnair_region)) != 0) shim_log("ftruncate %s failed", path);
            }
            r = mmap(NULL, sizeof(alnair_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            if (r != MAP_FAILED && r->magic != ALNAIR_REGION_MAGIC) {
                r->version = ALNAIR_REGION_VERSION;
                r->max_devices = ALNAIR_MAX_DEVICES;
                r->max_procs = ALNAIR_MAX_PROCS;
                atomic_thread_fence(memory_order_release);
                r->magic = ALNAIR_REGION_MAGIC;
            }
            flock(fd, LOCK_UN);
            close(fd);
        } else {
            shim_log("cannot open region %s (%s): limits hold per process only", path, strerror(errno));
        }
    }
    int shared = r != MAP_FAILED;
    if (!shared) {
        r = mmap(NULL, sizeof(alnair_region), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (r == MAP_FAILED) return -1;
        r->magic = ALNAIR_REGION_MAGIC;
        r->version = ALNAIR_REGION_VERSION;
    }
    g_region = r;
    region_reclaim_dead();
    claim_slot();
    return shared ? 0 : 1;
}

void region_set_limits(const uint64_t *limit_bytes, const uint64_t *compute_pct) {
    for (int d = 0; d < ALNAIR_MAX_DEVICES; d++) {
        g_limit[d] = limit_bytes[d];
        /* every process of a container has the same environment: these stores agree */
        atomic_store(&g_region->devices[d].limit_bytes, limit_bytes[d]);
        atomic_store(&g_region->devices[d].compute_pct, compute_pct[d]);
    }
}

uint64_t region_limit(int dev) { return dev >= 0 && dev < ALNAIR_MAX_DEVICES ? g_limit[dev] : 0; }

uint64_t region_used(int dev) {
    if (!g_region || dev < 0 || dev >= ALNAIR_MAX_DEVICES) return 0;
    return atomic_load_explicit(&g_region->devices[dev].used_bytes, memory_order_relaxed);
}

static int try_reserve(alnair_device_counters *c, uint64_t limit, uint64_t bytes) {
    uint64_t cur = atomic_load_explicit(&c->used_bytes, memory_order_relaxed);
    do {
        if (bytes > limit || cur > limit - bytes) return 0;
    } while (!atomic_compare_exchange_weak_explicit(&c->used_bytes, &cur, cur + bytes,
                                                    memory_order_acq_rel, memory_order_relaxed));
    uint64_t now = cur + bytes;
    uint64_t peak = atomic_load_explicit(&c->peak_bytes, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak_explicit(&c->peak_bytes, &peak, now,
                                                                 memory_order_relaxed,
                                                                 memory_order_relaxed)) {
    }
    return 1;
}

int region_reserve(int dev, uint64_t bytes) {
    if (dev < 0 || dev >= ALNAIR_MAX_DEVICES || !g_region) return 1;
    uint64_t limit = g_limit[dev];
    alnair_device_counters *c = &g_region->devices[dev];
    if (limit == 0) return 1;
    if (!try_reserve(c, limit, bytes)) {
        /* a dead neighbour's bytes are the only ones that can come back without a free */
        if (region_reclaim_dead() == 0 || !try_reserve(c, limit, bytes)) return 0;
    }
    atomic_fetch_add_explicit(&g_slot->used[dev], bytes, memory_order_relaxed);
    return 1;
}

void region_release(int dev, uint64_t bytes) {
    if (dev < 0 || dev >= ALNAIR_MAX_DEVICES || !g_region || !g_slot || g_limit[dev] == 0) return;
    atomic_fetch_sub_explicit(&g_slot->used[dev], bytes, memory_order_relaxed);
    atomic_fetch_sub_explicit(&g_region->devices[dev].used_bytes, bytes, memory_order_release);
}

void region_note_oom(int dev) {
    if (g_region && dev >= 0 && dev < ALNAIR_MAX_DEVICES)
        atomic_fetch_add_explicit(&g_region->devices[dev].oom_count, 1, memory_order_relaxed);
}

void region_note_launch(int dev, uint64_t throttled_ns) {
    if (!g_region || dev < 0 || dev >= ALNAIR_MAX_DEVICES) return;
    atomic_fetch_add_explicit(&g_region->devices[dev].launches, 1, memory_order_relaxed);
    if (throttled_ns)
        atomic_fetch_add_explicit(&g_region->devices[dev].throttled_ns, throttled_ns,
                                  memory_order_relaxed);
}

void region_after_fork(void) {
    /* the child owns none of the parent's allocations: it attaches afresh on first use */
    g_slot = NULL;
    g_region = NULL;
}

/*
 * Internal interfaces of libalnair-intercept: the per-container shared accounting region
 * (region.c), the per-process table of live allocations (alloc_table.c), the launch
 * throttle (throttle.c) and the client of the node's vGPU registry (registry.c). The hooks
 * themselves live in intercept.c.
 */
#ifndef ALNAIR_SHIM_H
#define ALNAIR_SHIM_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#define ALNAIR_MAX_DEVICES 16
#define ALNAIR_MAX_PROCS 256
#define ALNAIR_REGION_MAGIC 0x524e4c41u /* "ALNR" little-endian */
#define ALNAIR_REGION_VERSION 1u

/*
 * Binary layout shared with the vGPU registry (alnair.deviceplugin.region reads it with
 * struct): a 64-byte header, 16 device records of 64 bytes, then the process slots. All
 * counters are little-endian uint64; only atomic operations touch them.
 */
typedef struct {
    _Atomic uint64_t limit_bytes; /* 0: no memory limit on this device */
    _Atomic uint64_t used_bytes;
    _Atomic uint64_t peak_bytes;
    _Atomic uint64_t oom_count;
    _Atomic uint64_t compute_pct; /* 0: no compute limit */
    _Atomic uint64_t launches;    /* throttled launches only: unthrottled ones stay free */
    _Atomic uint64_t throttled_ns;
    uint64_t reserved;
} alnair_device_counters;

typedef struct {
    _Atomic int32_t pid; /* 0 free, -1 being reclaimed */
    int32_t pad;
    _Atomic uint64_t start_time; /* 0 while the owner is still filling the slot */
    _Atomic uint64_t used[ALNAIR_MAX_DEVICES];
} alnair_proc_slot;

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint32_t max_devices;
    uint32_t max_procs;
    _Atomic uint64_t registered; /* processes that ever attached, for the registry's metrics */
    uint64_t reserved[5];
    alnair_device_counters devices[ALNAIR_MAX_DEVICES];
    alnair_proc_slot procs[ALNAIR_MAX_PROCS];
} alnair_region;

/* alnair.deviceplugin.region decodes exactly this layout */
_Static_assert(sizeof(alnair_device_counters) == 64, "device record is 64 bytes");
_Static_assert(sizeof(alnair_proc_slot) == 144, "process slot is 144 bytes");
_Static_assert(sizeof(alnair_region) == 64 + 16 * 64 + 256 * 144, "region layout changed");

/* region.c */
int region_open(const char *path);            /* 0 ok; falls back to a private region */
void region_set_limits(const uint64_t *limit_bytes, const uint64_t *compute_pct);
int region_reserve(int dev, uint64_t bytes);  /* 1 reserved, 0 over the limit */
void region_release(int dev, uint64_t bytes);
uint64_t region_used(int dev);
uint64_t region_limit(int dev);
void region_note_oom(int dev);
void region_note_launch(int dev, uint64_t throttled_ns);
int region_reclaim_dead(void);                /* number of dead processes' slots freed */
void region_after_fork(void);

/* alloc_table.c: kinds keep device pointers and opaque handles apart */
enum { ALLOC_DPTR = 1, ALLOC_ARRAY = 2, ALLOC_MIPMAP = 3, ALLOC_HANDLE = 4 };
void table_insert(uint64_t key, int kind, int dev, uint64_t bytes);
int table_remove(uint64_t key, int kind, int *dev, uint64_t *bytes); /* 1 found */
void table_reset(void);

/* throttle.c */
void throttle_configure(int dev, unsigned pct);
void throttle_take(int dev, uint64_t cost);
uint64_t throttle_typical_cost(int dev); /* a kernel launch's usual cost, for graphs */
void throttle_feedback(int dev, double measured_pct);
int throttle_active(void);

/* registry.c */
void registry_connect(const char *socket_path, const char *vgpu_id, const char *region_path,
                      const char *limits_text, const char *compute_text);
void registry_after_fork(void);

/* intercept.c */
void shim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
uint64_t shim_now_ns(void);

#endif

/*
 * Which live allocation holds how many bytes on which device, so a free gives back exactly
 * what its allocation reserved. Device pointers and handles are per process, so the table
 * is too: open addressing with backward-shift deletion (no tombstones to rehash away)
 * behind one mutex, which costs tens of nanoseconds next to a driver call of microseconds.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "shim.h"

typedef struct {
    uint64_t key; /* 0: empty */
    uint64_t bytes;
    int32_t kind;
    int32_t dev;
} entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static entry *g_slots;
static size_t g_cap; /* power of two */
static size_t g_len;

static inline size_t hash(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key;
}

static void put(entry *slots, size_t cap, entry e) {
    size_t i = hash(e.key) & (cap - 1);
    while (slots[i].key != 0 && slots[i].key != e.key) i = (i + 1) & (cap - 1);
    slots[i] = e;
}

static int grow(void) {
    size_t cap = g_cap ? g_cap * 2 : 1024;
    entry *slots = calloc(cap, sizeof(entry));
    if (!slots) return 0;
    for (size_t i = 0; i < g_cap; i++)
        if (g_slots[i].key) put(slots, cap, g_slots[i]);
    free(g_slots);
    g_slots = slots;
    g_cap = cap;
    return 1;
}

void table_insert(uint64_t key, int kind, int dev, uint64_t bytes) {
    if (key == 0) return;
    pthread_mutex_lock(&g_mu);
    if ((g_len + 1) * 2 > g_cap && !grow()) {
        pthread_mutex_unlock(&g_mu);
        shim_log("allocation table cannot grow: a free of %#llx will not be credited",
                 (unsigned long long)key);
        return;
    }
    size_t i = hash(key) & (g_cap - 1);
    while (g_slots[i].key != 0 && g_slots[i].key != key) i = (i + 1) & (g_cap - 1);
    if (g_slots[i].key == 0) g_len++;
    g_slots[i] = (entry){key, bytes, kind, dev};
    pthread_mutex_unlock(&g_mu);
}

int table_remove(uint64_t key, int kind, int *dev, uint64_t *bytes) {
    int found = 0;
    pthread_mutex_lock(&g_mu);
    if (g_cap && key) {
        size_t mask = g_cap - 1;
        size_t i = hash(key) & mask;
        while (g_slots[i].key != 0 && g_slots[i].key != key) i = (i + 1) & mask;
        if (g_slots[i].key == key && g_slots[i].kind == kind) {
            *dev = g_slots[i].dev;
            *bytes = g_slots[i].bytes;
            found = 1;
            g_len--;
            /* shift later members of the probe run back so lookups never stop early */
            size_t hole = i;
            size_t j = (i + 1) & mask;
            while (g_slots[j].key != 0) {
                size_t home = hash(g_slots[j].key) & mask;
                int movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
                if (movable) {
                    g_slots[hole] = g_slots[j];
                    hole = j;
                }
                j = (j + 1) & mask;
            }
            g_slots[hole].key = 0;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}

void table_reset(void) {
    /* after fork: the child must not credit frees of the parent's pointers */
    pthread_mutex_init(&g_mu, NULL);
    g_slots = NULL;
    g_cap = 0;
    g_len = 0;
}

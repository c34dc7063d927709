/*
 * Compute share: a launch-rate limiter per device, only for devices with a compute limit.
 * Launches pay "cost" (thread blocks in the grid, which tracks SM time better than a flat
 * count; a CUDA graph pays a typical kernel's cost) into a GCRA bucket: each launch pushes a theoretical arrival time forward by
 * cost/rate and sleeps only once that time runs more than a short burst ahead of now.
 *
 * The rate is not guessed from a kernel's shape: the vGPU registry sends the container's
 * measured utilisation (NVML through the profiler), and every measurement turns into
 * "cost per second that produced that utilisation", from which the rate that yields the
 * target share follows. The first window runs unthrottled to calibrate. Several processes
 * of one container each hold a bucket, but all see the container's utilisation, so
 * together they settle on the container's share.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "shim.h"

#define BURST_NS 5e6      /* launches may run this far ahead of the schedule */
#define MIN_MEASURED_PCT 0.5 /* below this a measurement says nothing about the rate */

typedef struct {
    pthread_mutex_t mu;
    int limited;
    double target_pct;
    double rate;     /* cost per ns; 0 until the first measurement */
    double tat_ns;   /* theoretical arrival time of the next launch */
    uint64_t window_start_ns;
    double window_cost;
    double typical_cost; /* moving average of launch costs */
} bucket;

static bucket g_buckets[ALNAIR_MAX_DEVICES];
static int g_active;

int throttle_active(void) { return g_active; }

void throttle_configure(int dev, unsigned pct) {
    if (dev < 0 || dev >= ALNAIR_MAX_DEVICES) return;
    bucket *b = &g_buckets[dev];
    pthread_mutex_init(&b->mu, NULL);
    b->limited = pct > 0 && pct < 100;
    b->target_pct = pct;
    b->rate = 0;
    b->tat_ns = 0;
    b->window_start_ns = shim_now_ns();
    b->window_cost = 0;
    b->typical_cost = 1;
    if (b->limited) g_active = 1;
}

void throttle_take(int dev, uint64_t cost) {
    if (dev < 0 || dev >= ALNAIR_MAX_DEVICES) return;
    bucket *b = &g_buckets[dev];
    if (!b->limited) return;
    pthread_mutex_lock(&b->mu);
    double now = (double)shim_now_ns();
    b->window_cost += (double)cost;
    b->typical_cost += ((double)cost - b->typical_cost) / 64.0;
    double wait = 0;
    if (b->rate > 0) {
        double tat = (b->tat_ns > now ? b->tat_ns : now) + (double)cost / b->rate;
        b->tat_ns = tat;
        wait = tat - now - BURST_NS;
    }
    pthread_mutex_unlock(&b->mu);
    if (wait > 0) {
        struct timespec ts = {(time_t)(wait / 1e9), (long)((uint64_t)wait % 1000000000ULL)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    region_note_launch(dev, wait > 0 ? (uint64_t)wait : 0);
}

/* A graph launch runs many kernels of unknown size. Any fixed cost keeps the share, since the
 * rate is learnt from what the container's launches did to its utilisation; the usual kernel
 * cost just keeps graphs and single kernels of one container on a comparable footing. */
uint64_t throttle_typical_cost(int dev) {
    if (dev < 0 || dev >= ALNAIR_MAX_DEVICES) return 1;
    bucket *b = &g_buckets[dev];
    pthread_mutex_lock(&b->mu);
    double c = b->typical_cost;
    pthread_mutex_unlock(&b->mu);
    return c < 1 ? 1 : (uint64_t)c;
}

void throttle_feedback(int dev, double measured_pct) {
    if (dev < 0 || dev >= ALNAIR_MAX_DEVICES) return;
    bucket *b = &g_buckets[dev];
    if (!b->limited) return;
    pthread_mutex_lock(&b->mu);
    uint64_t now = shim_now_ns();
    double window_ns = (double)(now - b->window_start_ns);
    double observed = window_ns > 0 ? b->window_cost / window_ns : 0;
    if (measured_pct >= MIN_MEASURED_PCT && observed > 0) {
        double proposed = observed * b->target_pct / measured_pct;
        if (b->rate <= 0) {
            b->rate = proposed;
        } else if (measured_pct > b->target_pct || observed >= 0.8 * b->rate) {
            /* halfway steps damp measurement noise; an app below its share on its own
             * (observed well under the rate) says nothing about the rate, so it stays */
            b->rate = 0.5 * b->rate + 0.5 * proposed;
        }
    }
    b->window_start_ns = now;
    b->window_cost = 0;
    pthread_mutex_unlock(&b->mu);
}

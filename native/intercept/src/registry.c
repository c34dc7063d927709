/*
 * Client of the node's vGPU registry (alnair.deviceplugin.registry) over a unix socket.
 * A process says who it is once (REGISTER line); the registry learns its host pid from
 * the socket's peer credentials and its exit from the connection closing, and reads usage
 * straight from the accounting region, so nothing here reports on a timer. The other
 * direction carries utilisation measurements ("UTIL <device> <percent>") that steer the
 * launch throttle. One thread per process blocks on them, and dials again (with backoff)
 * when the registry goes away, so a device plugin restart leaves no process unregistered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

static int g_fd = -1;
static struct sockaddr_un g_addr;
static char g_register[1024];
static int g_register_len;

#define RECONNECT_MIN_S 0.5
#define RECONNECT_MAX_S 30.0

/* Connect and say who we are; -1 if the registry is not there. */
static int dial(void) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&g_addr, sizeof g_addr) != 0 ||
        write(fd, g_register, (size_t)g_register_len) != g_register_len) {
        close(fd);
        return -1;
    }
    return fd;
}

static void pause_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

/* Reads measurements until the registry goes away, then dials again with backoff: a device
 * plugin restart must not leave the container unregistered or its throttle unsteered. */
static void *reader(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[4096];
    for (;;) {
        double backoff = RECONNECT_MIN_S;
        while (fd < 0) {
            pause_s(backoff);
            backoff = backoff * 2 > RECONNECT_MAX_S ? RECONNECT_MAX_S : backoff * 2;
            fd = dial();
        }
        g_fd = fd;
        size_t len = 0;
        for (;;) {
            ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            len += (size_t)n;
            buf[len] = '\0';
            char *line = buf;
            char *nl;
            while ((nl = strchr(line, '\n')) != NULL) {
                *nl = '\0';
                int dev;
                double pct;
                if (sscanf(line, "UTIL %d %lf", &dev, &pct) == 2) throttle_feedback(dev, pct);
                line = nl + 1;
            }
            len = strlen(line);
            memmove(buf, line, len);
            if (len == sizeof buf - 1) len = 0; /* a line this long is garbage: drop it */
        }
        shim_log("registry connection closed: compute share keeps its last rate meanwhile");
        close(fd);
        fd = -1;
    }
    return NULL;
}

void registry_connect(const char *socket_path, const char *vgpu_id, const char *region_path,
                      const char *limits_text, const char *compute_text) {
    if (!socket_path || !*socket_path) return;
    memset(&g_addr, 0, sizeof g_addr);
    g_addr.sun_family = AF_UNIX;
    if (strlen(socket_path) >= sizeof g_addr.sun_path) {
        shim_log("registry socket path too long: %s", socket_path);
        return;
    }
    strcpy(g_addr.sun_path, socket_path);
    g_register_len = snprintf(g_register, sizeof g_register,
                              "REGISTER vgpu=%s pid=%d region=%s memory=%s compute=%s\n",
                              vgpu_id && *vgpu_id ? vgpu_id : "-", (int)getpid(),
                              region_path && *region_path ? region_path : "-",
                              limits_text && *limits_text ? limits_text : "-",
                              compute_text && *compute_text ? compute_text : "-");
    if (g_register_len <= 0 || g_register_len >= (int)sizeof g_register) return;
    int fd = dial();
    if (fd < 0)
        shim_log("cannot reach vGPU registry at %s (%s): limits still hold, retrying", socket_path,
                 strerror(errno));
    g_fd = fd;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, reader, (void *)(intptr_t)fd) != 0)
        shim_log("cannot start the registry reader: compute share stays uncalibrated");
    pthread_attr_destroy(&attr);
}

void registry_after_fork(void) {
    /* the parent's registration is not the child's: close it, re-register on first use */
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
}

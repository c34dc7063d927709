/*
 * Client of the node's vGPU registry (alnair.deviceplugin.registry) over a unix socket.
 * A process says who it is once (REGISTER line); the registry learns its host pid from
 * the socket's peer credentials and its exit from the connection closing, and reads usage
 * straight from the accounting region, so nothing here reports on a timer. The other
 * direction carries utilisation measurements ("UTIL <device> <percent>") that steer the
 * launch throttle; a thread blocks on them only when some device has a compute limit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"

static int g_fd = -1;

static void *reader(void *arg) {
    int fd = (int)(intptr_t)arg;
    char buf[4096];
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
    shim_log("registry connection closed: compute share keeps its last rate");
    return NULL;
}

void registry_connect(const char *socket_path, const char *vgpu_id, const char *region_path,
                      const char *limits_text, const char *compute_text) {
    if (!socket_path || !*socket_path) return;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(socket_path) >= sizeof addr.sun_path) {
        shim_log("registry socket path too long: %s", socket_path);
        return;
    }
    strcpy(addr.sun_path, socket_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        shim_log("cannot reach vGPU registry at %s (%s): limits still hold", socket_path,
                 strerror(errno));
        close(fd);
        return;
    }
    char line[1024];
    int n = snprintf(line, sizeof line, "REGISTER vgpu=%s pid=%d region=%s memory=%s compute=%s\n",
                     vgpu_id && *vgpu_id ? vgpu_id : "-", (int)getpid(),
                     region_path && *region_path ? region_path : "-",
                     limits_text && *limits_text ? limits_text : "-",
                     compute_text && *compute_text ? compute_text : "-");
    if (n > 0 && write(fd, line, (size_t)n) != n) shim_log("short write to the vGPU registry");
    g_fd = fd;
    if (throttle_active()) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&t, &attr, reader, (void *)(intptr_t)fd) != 0)
            shim_log("cannot start the registry reader: compute share stays uncalibrated");
        pthread_attr_destroy(&attr);
    }
}

void registry_after_fork(void) {
    /* the parent's registration is not the child's: close it, re-register on first use */
    if (g_fd >= 0) close(g_fd);
    g_fd = -1;
}

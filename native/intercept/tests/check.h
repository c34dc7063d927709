/* Shared by the shim's C tests: one "PASS name" or "FAIL name: why" line per check, which
 * run_tests.sh counts into the closing "N passed, M failed" line. */
#ifndef ALNAIR_CHECK_H
#define ALNAIR_CHECK_H
#include <stdio.h>

static int g_failed;

#define CHECK(name, cond, ...)                          \
    do {                                                \
        if (cond) {                                     \
            printf("PASS %s\n", name);                  \
        } else {                                        \
            printf("FAIL %s: ", name);                  \
            printf(__VA_ARGS__);                        \
            printf("\n");                               \
            g_failed++;                                 \
        }                                               \
        fflush(stdout);                                 \
    } while (0)

#define MIB (1024ULL * 1024ULL)
#endif

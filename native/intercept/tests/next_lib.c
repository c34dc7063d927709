/* Two small libraries for test_next: both define which(); library A also asks the loader for
 * "the next which()" with RTLD_NEXT, as interposers of malloc and friends do. */
#define _GNU_SOURCE
#include <dlfcn.h>

#ifdef LIB_A
const char *which(void) { return "a"; }
const char *next_which(void) {
    const char *(*next)(void) = (const char *(*)(void))dlsym(RTLD_NEXT, "which");
    return next ? next() : "none";
}
#else
const char *which(void) { return "b"; }
#endif

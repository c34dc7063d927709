/* With dlsym interposed by the shim, RTLD_NEXT must still mean "after the caller": library A
 * (loaded after the shim, before library B) asking for the next which() gets B's, not its
 * own, which would send a real interposer into endless recursion. */
#include <string.h>

#include "check.h"

const char *next_which(void);

int main(void) {
    const char *got = next_which();
    CHECK("dlsym(RTLD_NEXT) from a library resolves after that library", strcmp(got, "b") == 0,
          "got \"%s\"", got);
    return g_failed ? 1 : 0;
}

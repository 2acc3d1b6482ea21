/* populate.c: a mapping's pages made present in one call before a fill writes them. */

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "populate.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int memory_populate_write(void *p, size_t n) {
        long s = sysconf(_SC_PAGESIZE);
        size_t page = s > 0 ? (size_t) s : 4096;
        uintptr_t start, end;

        if (n == 0)
                return 0;
        start = (uintptr_t) p & ~(uintptr_t) (page - 1);
        if ((uintptr_t) p > UINTPTR_MAX - n || (uintptr_t) p + n > UINTPTR_MAX - (page - 1))
                return -EINVAL;
        end = ((uintptr_t) p + n + page - 1) & ~(uintptr_t) (page - 1);
        return madvise((void *) start, end - start, MADV_POPULATE_WRITE) < 0 ? -errno : 0;
}

/* macro.c: the out-of-line helpers of macro.h. */
#include <stdint.h>

#include "macro.h"

bool greedy_realloc(void **p, size_t *allocated, size_t need, size_t size) {
        if (need <= *allocated)
                return true;

        size_t n = *allocated ? *allocated : 4;
        while (n < need) {
                if (n > SIZE_MAX / 2)
                        return false;
                n *= 2;
        }
        if (n > SIZE_MAX / size)
                return false;

        void *q = realloc(*p, n * size);
        if (!q)
                return false;
        *p = q;
        *allocated = n;
        return true;
}

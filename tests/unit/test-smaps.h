/* test-smaps.h: a field of this process's /proc/self/smaps entry for one mapping (include after cmocka.h). */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kB of field in the /proc/self/smaps entry of the mapping that starts at p; UINT64_MAX
 * when there is none. */
static inline uint64_t smaps_kib(const void *p, const char *field) {
        FILE *f = fopen("/proc/self/smaps", "re");
        unsigned long start, end;
        uint64_t v = UINT64_MAX;
        char line[512];
        bool in = false;

        assert_non_null(f);
        while (fgets(line, sizeof line, f)) {
                if (sscanf(line, "%lx-%lx ", &start, &end) == 2)
                        in = start == (unsigned long) (uintptr_t) p;
                else if (in && strncmp(line, field, strlen(field)) == 0 &&
                         line[strlen(field)] == ':')
                        v = strtoull(line + strlen(field) + 1, NULL, 10);
        }
        fclose(f);
        return v;
}

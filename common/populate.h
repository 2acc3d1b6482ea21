/* populate.h: a mapping's pages made present in one call before a fill writes them. */
#pragma once

#include <stddef.h>

/*
 * Makes the pages of [p, p + n) present and writable (MADV_POPULATE_WRITE, Linux 5.14),
 * rounded out to whole pages, so that the writes that follow take no page fault per page: on
 * fresh shared memory that saves about a quarter of the pages' cost (docs/benchmarks.md,
 * "Populated fills"). Nothing is written. Best effort: 0, or a negative errno (-EINVAL from a
 * kernel without it or a range not aligned to a hugetlb mapping's pages, -ENOMEM for a range
 * not mapped) that callers ignore: the writes then fault the pages in as before.
 */
int memory_populate_write(void *p, size_t n);

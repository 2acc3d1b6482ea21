/* huge-pages.h: whether host shards go on huge pages (--huge-pages), and what the host has of them. */
#pragma once

/*
 * DESIGN: the operator gives familyd huge pages two ways (docs/operating.md, "Huge pages"): reserved
 * hugetlb pages (vm.nr_hugepages), which host segments use as MFD_HUGETLB memfds, and shmem
 * transparent huge pages in `advise` mode, which a normal memfd gets by MADV_HUGEPAGE on its
 * mappings. The mode is one setting of the whole process, set once at start before any
 * segment is made (host segments are made in shm/ and in build/, which both ask here):
 *
 *   auto     hugetlb when the pages are there: a segment whose pages cannot be reserved (none
 *            reserved, or too few free) is made on normal pages instead; the first such
 *            fallback is logged, once per process, with why. A segment smaller than one huge
 *            page stays on normal pages (a norm's 8 KiB would take 2 MiB), not logged. The
 *            default.
 *   never    normal pages only.
 *   require  hugetlb or nothing: a segment whose pages cannot be reserved fails (-ENOMEM;
 *            huge_pages_error() is the Build's sentence).
 *
 * A hugetlb segment's size is rounded up to the huge page size (the kernel refuses any other
 * size), and that is what a Build reserves of --shm-budget (huge_pages_allocation_size()).
 * Reading the host's numbers (/proc/meminfo, the THP mode) is cheap and done each time: the
 * operator may change vm.nr_hugepages while the daemon runs.
 *
 * Thread safety: the mode is an atomic, set before the build threads start; the one-time
 * log is an atomic flag. Everything else reads files.
 */

#include <stdbool.h>
#include <stdint.h>

#include "core/error.h"

typedef enum HugePagesMode {
        HUGE_PAGES_AUTO,
        HUGE_PAGES_NEVER,
        HUGE_PAGES_REQUIRE,
        _HUGE_PAGES_MODE_MAX,
        _HUGE_PAGES_MODE_INVALID = -EINVAL,
} HugePagesMode;

/* "auto", "never", "require"; NULL for anything else. */
const char *huge_pages_mode_to_string(HugePagesMode m);
/* _HUGE_PAGES_MODE_INVALID for anything but those three. */
HugePagesMode huge_pages_mode_from_string(const char *s);

/* The process's mode (default auto); set once at start, before any segment is made. */
void huge_pages_set_mode(HugePagesMode m);
HugePagesMode huge_pages_mode(void);

/* What the host has (/proc/meminfo): the default huge page size in bytes (0: no hugetlb),
 * the pages reserved (HugePages_Total) and those still free to reserve (Free less Rsvd). */
typedef struct HugePagesHost {
        uint64_t page_size;
        uint64_t total;
        uint64_t available;
} HugePagesHost;
int huge_pages_host(HugePagesHost *ret);

/* Whether shmem transparent huge pages are in `advise` mode (MADV_HUGEPAGE asks for them). */
bool huge_pages_shmem_advise(void);

/* Whether a host segment of size bytes is to go on hugetlb pages of h: the host has them
 * reserved, the mode is not never, and under auto the segment is at least one page. */
bool huge_pages_wanted(uint64_t size, const HugePagesHost *h);

/* The bytes a host segment of size bytes will take: rounded up to the huge page size when it
 * is to go on huge pages (huge_pages_wanted()); else size. */
uint64_t huge_pages_allocation_size(uint64_t size);

/* Logs, once per process, that a segment went on normal pages and why (auto's fallback). */
void huge_pages_log_fallback(uint64_t size, const char *why);

/*
 * A start-time check for the daemon: 0 when mode can work on this host; -ENOENT under require
 * when the host has no hugetlb pages reserved at all, why saying so (the daemon refuses to
 * start). auto and never always pass.
 */
int huge_pages_check(HugePagesMode mode, char *why, size_t why_size);

/* A Build's failure under require: RESOURCE_EXHAUSTED, reason HUGE_PAGES, with the host's
 * numbers. Returns -ENOMEM. */
int huge_pages_error(uint64_t bytes, FamilyError *ret_error);

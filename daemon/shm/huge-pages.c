/* huge-pages.c: the --huge-pages mode, the host's huge pages, and auto's one fallback log. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "huge-pages.h"

#define MEMINFO_PATH "/proc/meminfo"
#define SHMEM_THP_PATH "/sys/kernel/mm/transparent_hugepage/shmem_enabled"

static const char *const mode_names[_HUGE_PAGES_MODE_MAX] = {
        [HUGE_PAGES_AUTO] = "auto",
        [HUGE_PAGES_NEVER] = "never",
        [HUGE_PAGES_REQUIRE] = "require",
};

static _Atomic int process_mode = HUGE_PAGES_AUTO;
static atomic_bool fallback_logged;

const char *huge_pages_mode_to_string(HugePagesMode m) {
        return m >= 0 && m < _HUGE_PAGES_MODE_MAX ? mode_names[m] : NULL;
}

HugePagesMode huge_pages_mode_from_string(const char *s) {
        for (int m = 0; s && m < _HUGE_PAGES_MODE_MAX; m++)
                if (streq(s, mode_names[m]))
                        return (HugePagesMode) m;
        return _HUGE_PAGES_MODE_INVALID;
}

void huge_pages_set_mode(HugePagesMode m) {
        if (huge_pages_mode_to_string(m))
                atomic_store_explicit(&process_mode, (int) m, memory_order_relaxed);
}

HugePagesMode huge_pages_mode(void) {
        return (HugePagesMode) atomic_load_explicit(&process_mode, memory_order_relaxed);
}

/* The start of a small file (procfs, sysfs) as a string. */
static int read_small(const char *path, char *buf, size_t size) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        ssize_t n;

        if (fd < 0)
                return -errno;
        n = read(fd, buf, size - 1);
        if (n < 0)
                return -errno;
        buf[n] = 0;
        return 0;
}

/* The number after "name:" in meminfo's text; 0 when it is not there. */
static uint64_t meminfo_field(const char *text, const char *name) {
        size_t len = strlen(name);
        uint64_t v = 0;

        for (const char *p = text; p;) {
                if (strncmp(p, name, len) == 0 && p[len] == ':') {
                        (void) sscanf(p + len + 1, "%" SCNu64, &v);
                        break;
                }
                p = strchr(p, '\n');
                if (p)
                        p++;
        }
        return v;
}

int huge_pages_host(HugePagesHost *ret) {
        char text[8192];
        int r;

        r = read_small(MEMINFO_PATH, text, sizeof text);
        if (r < 0)
                return r;
        uint64_t size_kib = meminfo_field(text, "Hugepagesize"),
                 total = meminfo_field(text, "HugePages_Total"),
                 free_pages = meminfo_field(text, "HugePages_Free"),
                 rsvd = meminfo_field(text, "HugePages_Rsvd");
        *ret = (HugePagesHost) {
                .page_size = size_kib * 1024,
                .total = size_kib > 0 ? total : 0,
                .available = size_kib > 0 && free_pages > rsvd ? free_pages - rsvd : 0,
        };
        return 0;
}

bool huge_pages_shmem_advise(void) {
        char line[256];

        /* "always within_size [advise] never deny force": the bracketed one is in force. */
        return read_small(SHMEM_THP_PATH, line, sizeof line) >= 0 && strstr(line, "[advise]");
}

bool huge_pages_wanted(uint64_t size, const HugePagesHost *h) {
        HugePagesMode mode = huge_pages_mode();

        if (mode == HUGE_PAGES_NEVER || h->page_size == 0 || h->total == 0)
                return false;
        return mode == HUGE_PAGES_REQUIRE || size >= h->page_size;
}

uint64_t huge_pages_allocation_size(uint64_t size) {
        HugePagesHost h;

        if (huge_pages_host(&h) < 0 || !huge_pages_wanted(size, &h))
                return size;
        /* Past UINT64_MAX less a page the size is refused later anyway. */
        if (size > UINT64_MAX - h.page_size)
                return size;
        return (size + h.page_size - 1) / h.page_size * h.page_size;
}

void huge_pages_log_fallback(uint64_t size, const char *why) {
        if (atomic_exchange(&fallback_logged, true))
                return;
        log_notice("Huge pages: a shard segment of %" PRIu64 " bytes is on normal pages: %s "
                   "(--huge-pages auto; logged once).",
                   size, why);
}

int huge_pages_check(HugePagesMode mode, char *why, size_t why_size) {
        HugePagesHost h = {};

        if (mode != HUGE_PAGES_REQUIRE)
                return 0;
        (void) huge_pages_host(&h);
        if (h.page_size > 0 && h.total > 0)
                return 0;
        (void) snprintf(why, why_size,
                        "--huge-pages require: the host has no huge pages reserved "
                        "(vm.nr_hugepages is 0); reserve some, or use --huge-pages auto");
        return -ENOENT;
}

int huge_pages_error(uint64_t bytes, FamilyError *ret_error) {
        HugePagesHost h = {};

        (void) huge_pages_host(&h);
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "HUGE_PAGES", NULL,
                                "out of huge pages for %" PRIu64 " bytes: %" PRIu64 " of %" PRIu64
                                " reserved pages of %" PRIu64 " kB free (--huge-pages require)",
                                bytes, h.available, h.total, h.page_size / 1024);
}

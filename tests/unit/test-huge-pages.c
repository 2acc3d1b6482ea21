/* test-huge-pages.c: host segments on hugetlb pages by --huge-pages mode, with the host's real pages. */

/*
 * As root the tests reserve huge pages for themselves (vm.nr_hugepages, put back afterwards)
 * and set shmem THP to advise for the one test that needs it (put back too); without root
 * those tests skip. vm.nr_hugepages is the whole machine's: every test here that touches it,
 * and the integration test test_huge_pages.py, hold one lock file while they do.
 */

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "test-smaps.h"

#include "common/macro.h"
#include "core/error.h"
#include "shm/huge-pages.h"
#include "shm/segment.h"

#define MiB (UINT64_C(1) << 20)
#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"
#define SHMEM_THP "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
#define LOCK_PATH "/tmp/familyd-test-huge-pages.lock"

static int lock_fd = -1;
static char saved_nr[32], saved_thp[128];

static int read_text(const char *path, char *buf, size_t size) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n;

        if (fd < 0)
                return -errno;
        n = read(fd, buf, size - 1);
        close(fd);
        if (n < 0)
                return -errno;
        buf[n] = 0;
        return 0;
}

static int write_text(const char *path, const char *text) {
        int fd = open(path, O_WRONLY | O_CLOEXEC), r = 0;

        if (fd < 0)
                return -errno;
        if (write(fd, text, strlen(text)) < 0)
                r = -errno;
        close(fd);
        return r;
}

static void set_nr_hugepages(unsigned n) {
        char text[32];
        (void) snprintf(text, sizeof text, "%u\n", n);
        assert_int_equal(write_text(NR_HUGEPAGES, text), 0);
}

/* The mode in brackets of shmem_enabled ("always within_size [advise] never ...") */
static void thp_mode(const char *text, char *ret, size_t size) {
        const char *a = strchr(text, '['), *b = a ? strchr(a, ']') : NULL;
        assert_non_null(b);
        (void) snprintf(ret, size, "%.*s", (int) (b - a - 1), a + 1);
}

static int group_setup(void **state) {
        if (geteuid() != 0 || access(NR_HUGEPAGES, W_OK) < 0)
                return 0; /* the tests that need root skip */
        lock_fd = open(LOCK_PATH, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (lock_fd < 0 || flock(lock_fd, LOCK_EX) < 0)
                return -1;
        if (read_text(NR_HUGEPAGES, saved_nr, sizeof saved_nr) < 0)
                return -1;
        if (read_text(SHMEM_THP, saved_thp, sizeof saved_thp) >= 0)
                thp_mode(saved_thp, saved_thp, sizeof saved_thp);
        return 0;
}

static int group_teardown(void **state) {
        if (lock_fd < 0)
                return 0;
        (void) write_text(NR_HUGEPAGES, saved_nr);
        if (saved_thp[0])
                (void) write_text(SHMEM_THP, saved_thp);
        close(lock_fd);
        return 0;
}

static void need_root(void) {
        if (lock_fd < 0)
                skip();
}

static bool fd_is_hugetlb(int fd) {
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        return st.st_blksize == 2 * MiB;
}

static void test_mode_names(void **state) {
        assert_int_equal(huge_pages_mode_from_string("auto"), HUGE_PAGES_AUTO);
        assert_int_equal(huge_pages_mode_from_string("never"), HUGE_PAGES_NEVER);
        assert_int_equal(huge_pages_mode_from_string("require"), HUGE_PAGES_REQUIRE);
        assert_int_equal(huge_pages_mode_from_string("always"), _HUGE_PAGES_MODE_INVALID);
        assert_int_equal(huge_pages_mode_from_string(NULL), _HUGE_PAGES_MODE_INVALID);
        assert_string_equal(huge_pages_mode_to_string(HUGE_PAGES_REQUIRE), "require");
        assert_null(huge_pages_mode_to_string(_HUGE_PAGES_MODE_MAX));
        /* The default, with nothing set. */
        assert_int_equal(huge_pages_mode(), HUGE_PAGES_AUTO);
}

/* require with pages reserved: a hugetlb memfd, rounded up, sealed, handed out as before. */
static void test_require_with_pages(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        int ro;

        need_root();
        set_nr_hugepages(4);
        huge_pages_set_mode(HUGE_PAGES_REQUIRE);
        assert_int_equal(huge_pages_allocation_size(3 * MiB), 4 * MiB);
        assert_int_equal(huge_pages_allocation_size(4 * MiB), 4 * MiB);
        assert_int_equal(shard_segment_new_host("huge", 3 * MiB, 0, &s), 0);
        assert_int_equal(shard_segment_size(s), 4 * MiB);
        assert_true(fd_is_hugetlb(shard_segment_fd(s)));
        assert_true(shard_segment_is_sealed(s));
        assert_int_equal(fcntl(shard_segment_fd(s), F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW |
                                                                    F_SEAL_SEAL),
                         F_SEAL_SHRINK | F_SEAL_GROW);
        assert_int_equal(ftruncate(shard_segment_fd(s), 8 * MiB), -1);

        /* Filled through the daemon's mapping; a read-only handout sees it, cannot write. */
        memset(shard_segment_data(s), 0x5a, 4 * MiB);
        shard_segment_unmap(s);
        assert_int_equal(shard_segment_seal(s), 0);
        assert_int_equal(fcntl(shard_segment_fd(s), F_GET_SEALS) & F_SEAL_WRITE, F_SEAL_WRITE);
        assert_int_equal(shard_segment_open(s, false, &ro), 0);
        assert_true(fd_is_hugetlb(ro));
        assert_ptr_equal(mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0),
                         MAP_FAILED);
        const uint8_t *p = mmap(NULL, 4 * MiB, PROT_READ, MAP_SHARED, ro, 0);
        assert_ptr_not_equal(p, MAP_FAILED);
        assert_int_equal(p[0], 0x5a);
        assert_int_equal(p[4 * MiB - 1], 0x5a);
        assert_int_equal(munmap((void *) p, 4 * MiB), 0);
        close(ro);

        /* The adopted descriptor (the fd store's path) keeps the size and the seals. */
        _cleanup_(shard_segment_unrefp) ShardSegment *a = NULL;
        int fd = fcntl(shard_segment_fd(s), F_DUPFD_CLOEXEC, 3);
        assert_int_equal(shard_segment_adopt(fd, 0, &a), 0);
        assert_int_equal(shard_segment_size(a), 4 * MiB);
        assert_true(shard_segment_is_sealed(a));
        assert_int_equal(shard_segment_huge_page_size(a), 2 * MiB);
        assert_int_equal(shard_segment_huge_page_size(s), 2 * MiB);
        /* It holds a rank of 3 MiB (rounded up), or of exactly 4 MiB; nothing else. */
        assert_true(shard_segment_fits(a, 3 * MiB));
        assert_true(shard_segment_fits(a, 2 * MiB + 1));
        assert_true(shard_segment_fits(a, 4 * MiB));
        assert_false(shard_segment_fits(a, 2 * MiB));
        assert_false(shard_segment_fits(a, 4 * MiB + 1));
        assert_false(shard_segment_fits(a, 0));
        huge_pages_set_mode(HUGE_PAGES_AUTO);
}

/* require without pages: -ENOMEM, the Build's sentence, and the start-time check. */
static void test_require_without_pages(void **state) {
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        ShardSegment *s = NULL;
        char why[256] = "";

        need_root();
        set_nr_hugepages(0);
        huge_pages_set_mode(HUGE_PAGES_REQUIRE);
        assert_int_equal(shard_segment_new_host("huge", 3 * MiB, 0, &s), -ENOMEM);
        assert_null(s);
        assert_int_equal(huge_pages_check(HUGE_PAGES_REQUIRE, why, sizeof why), -ENOENT);
        assert_string_equal(why, "--huge-pages require: the host has no huge pages reserved "
                                 "(vm.nr_hugepages is 0); reserve some, or use --huge-pages auto");
        assert_int_equal(huge_pages_check(HUGE_PAGES_AUTO, why, sizeof why), 0);
        assert_int_equal(huge_pages_check(HUGE_PAGES_NEVER, why, sizeof why), 0);
        assert_int_equal(huge_pages_allocation_size(3 * MiB), 3 * MiB);

        assert_int_equal(huge_pages_error(3 * MiB, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_RESOURCE_EXHAUSTED);
        assert_string_equal(e.reason, "HUGE_PAGES");
        assert_string_equal(e.message, "out of huge pages for 3145728 bytes: 0 of 0 reserved "
                                       "pages of 2048 kB free (--huge-pages require)");

        /* Reserved but too few free: require still fails, the check at start passes. */
        set_nr_hugepages(1);
        assert_int_equal(shard_segment_new_host("huge", 3 * MiB, 0, &s), -ENOMEM);
        assert_int_equal(huge_pages_check(HUGE_PAGES_REQUIRE, why, sizeof why), 0);
        huge_pages_set_mode(HUGE_PAGES_AUTO);
}

/* auto: hugetlb when the pages are free, normal pages (exact size) when not, and for a
 * segment smaller than one huge page. */
static void test_auto_falls_back(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *h = NULL, *n = NULL, *z = NULL;

        need_root();
        set_nr_hugepages(2);
        huge_pages_set_mode(HUGE_PAGES_AUTO);
        assert_int_equal(shard_segment_new_host("auto-huge", 3 * MiB, 0, &h), 0);
        assert_true(fd_is_hugetlb(shard_segment_fd(h)));
        assert_int_equal(shard_segment_size(h), 4 * MiB);
        /* Both pages are taken: the next one goes on normal pages, at its own size. */
        assert_int_equal(shard_segment_new_host("auto-normal", 3 * MiB, 0, &n), 0);
        assert_false(fd_is_hugetlb(shard_segment_fd(n)));
        assert_int_equal(shard_segment_size(n), 3 * MiB);
        assert_true(shard_segment_is_sealed(n));
        set_nr_hugepages(0);
        assert_int_equal(shard_segment_new_host("auto-none", 5000, 0, &z), 0);
        assert_false(fd_is_hugetlb(shard_segment_fd(z)));
        assert_int_equal(shard_segment_size(z), 5000);
        z = shard_segment_unref(z);
        /* Pages free, but a segment under one huge page stays on normal pages under auto (an
         * 8 KiB norm would take 2 MiB); require still rounds it up (h holds two of the
         * three). */
        set_nr_hugepages(3);
        assert_int_equal(huge_pages_allocation_size(5000), 5000);
        assert_int_equal(huge_pages_allocation_size(2 * MiB), 2 * MiB);
        assert_int_equal(shard_segment_new_host("auto-small", 5000, 0, &z), 0);
        assert_false(fd_is_hugetlb(shard_segment_fd(z)));
        assert_int_equal(shard_segment_size(z), 5000);
        z = shard_segment_unref(z);
        huge_pages_set_mode(HUGE_PAGES_REQUIRE);
        assert_int_equal(huge_pages_allocation_size(5000), 2 * MiB);
        assert_int_equal(shard_segment_new_host("require-small", 5000, 0, &z), 0);
        assert_true(fd_is_hugetlb(shard_segment_fd(z)));
        assert_int_equal(shard_segment_size(z), 2 * MiB);
        z = shard_segment_unref(z);
        huge_pages_set_mode(HUGE_PAGES_AUTO);
        set_nr_hugepages(0);
        assert_int_equal(shard_segment_new_host("auto-none", 5000, 0, &z), 0);
        assert_false(fd_is_hugetlb(shard_segment_fd(z)));
        assert_int_equal(shard_segment_size(z), 5000);
}

/* never: normal pages, whatever the host has. */
static void test_never(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;

        need_root();
        set_nr_hugepages(4);
        huge_pages_set_mode(HUGE_PAGES_NEVER);
        assert_int_equal(huge_pages_allocation_size(3 * MiB), 3 * MiB);
        assert_int_equal(shard_segment_new_host("never", 3 * MiB, 0, &s), 0);
        assert_false(fd_is_hugetlb(shard_segment_fd(s)));
        assert_int_equal(shard_segment_size(s), 3 * MiB);
        assert_int_equal(shard_segment_huge_page_size(s), 0);
        assert_true(shard_segment_fits(s, 3 * MiB));
        assert_false(shard_segment_fits(s, 3 * MiB - 1));
        huge_pages_set_mode(HUGE_PAGES_AUTO);
}

/* shmem THP in advise mode: a normal segment's fill gets huge folios (MADV_HUGEPAGE). */
static void test_shmem_thp_advise(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;

        need_root();
        if (access(SHMEM_THP, W_OK) < 0)
                skip();
        set_nr_hugepages(0);
        huge_pages_set_mode(HUGE_PAGES_NEVER);
        assert_int_equal(write_text(SHMEM_THP, "advise"), 0);
        assert_true(huge_pages_shmem_advise());
        assert_int_equal(shard_segment_new_host("thp", 8 * MiB, 0, &s), 0);
        void *p = shard_segment_data(s);
        memset(p, 1, 8 * MiB);
        /* At least the aligned 2 MiB pieces of the mapping are mapped huge. */
        assert_true(smaps_kib(p, "ShmemPmdMapped") >= 4096);
        shard_segment_unmap(s);
        assert_int_equal(write_text(SHMEM_THP, "never"), 0);
        assert_false(huge_pages_shmem_advise());
        huge_pages_set_mode(HUGE_PAGES_AUTO);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_mode_names),
                cmocka_unit_test(test_require_with_pages),
                cmocka_unit_test(test_require_without_pages),
                cmocka_unit_test(test_auto_falls_back),
                cmocka_unit_test(test_never),
                cmocka_unit_test(test_shmem_thp_advise),
        };
        return cmocka_run_group_tests(tests, group_setup, group_teardown);
}

/* test-shard-populate.c: libfamilyd maps a shard populated by default, lazily when asked. */

/*
 * A shard's bytes are already in memory (the daemon filled them), so mincore() says
 * "resident" for every page of any mapping of them, touched or not: it reports the page
 * cache, not this process's page tables. What populating changes is the latter, which
 * /proc/self/smaps counts per mapping (Rss; Shared_Hugetlb for hugetlb pages): that is what
 * these tests read. Real memfds stand in for the daemon's segments (same flags, same seals).
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
#include <unistd.h>
#include <cmocka.h>

#include "test-smaps.h"

#include "familyd.h"

#define MiB (UINT64_C(1) << 20)
#define NR_HUGEPAGES "/proc/sys/vm/nr_hugepages"
#define LOCK_PATH "/tmp/familyd-test-huge-pages.lock"

/* A sealed memfd of size bytes, every byte 0x11, as the daemon leaves one. */
static int shard_memfd(uint64_t size, bool huge) {
        int fd = memfd_create("populate", MFD_CLOEXEC | MFD_ALLOW_SEALING |
                                                  (huge ? MFD_HUGETLB : 0));
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, (off_t) size), 0);
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_ptr_not_equal(p, MAP_FAILED);
        memset(p, 0x11, size);
        assert_int_equal(munmap(p, size), 0);
        return fd;
}

static void test_populated_by_default(void **state) {
        uint64_t size = 96 * MiB;
        int fd = shard_memfd(size, false);
        void *p;

        /* 96 MiB: two threads' worth (64 MiB each at most), on any CPU count. */
        assert_int_equal(familyd_shard_map_mode(fd, size, FAMILYD_MAP_READ_ONLY, &p), 0);
        assert_int_equal(smaps_kib(p, "Rss"), size / 1024);
        assert_int_equal(((const uint8_t *) p)[size - 1], 0x11);
        assert_int_equal(familyd_shard_unmap(p, size), 0);

        assert_int_equal(familyd_shard_map(fd, size, false, &p), 0);
        assert_int_equal(smaps_kib(p, "Rss"), size / 1024);
        assert_int_equal(familyd_shard_unmap(p, size), 0);
        close(fd);
}

static void test_lazy(void **state) {
        uint64_t size = 8 * MiB;
        int fd = shard_memfd(size, false);
        void *p;

        assert_int_equal(familyd_shard_map_flags(fd, size, FAMILYD_MAP_READ_ONLY,
                                                 FAMILYD_MAP_LAZY, &p),
                         0);
        assert_int_equal(smaps_kib(p, "Rss"), 0);
        /* mincore cannot tell: the pages are in memory, only not in this mapping. */
        unsigned char vec[8 * MiB / 4096];
        if (sysconf(_SC_PAGESIZE) == 4096) {
                assert_int_equal(mincore(p, size, vec), 0);
                assert_int_equal(vec[0] & 1, 1);
        }
        assert_int_equal(((const uint8_t *) p)[0], 0x11);
        assert_true(smaps_kib(p, "Rss") > 0);
        assert_true(smaps_kib(p, "Rss") < size / 1024);
        /* Populating later makes the rest resident. */
        assert_int_equal(familyd_shard_populate(p, size, FAMILYD_MAP_READ_ONLY), 0);
        assert_int_equal(smaps_kib(p, "Rss"), size / 1024);
        assert_int_equal(familyd_shard_unmap(p, size), 0);
        close(fd);
}

/* A private mapping is populated by reading: nothing is copied, writes still copy a page. */
static void test_private_and_shared(void **state) {
        uint64_t size = 4 * MiB;
        int fd = shard_memfd(size, false);
        uint8_t *p, *q;

        assert_int_equal(familyd_shard_map_mode(fd, size, FAMILYD_MAP_PRIVATE, (void **) &p), 0);
        assert_int_equal(smaps_kib(p, "Rss"), size / 1024);
        assert_int_equal(smaps_kib(p, "Anonymous"), 0);
        p[0] = 0x22;
        assert_int_equal(smaps_kib(p, "Anonymous"), 4);

        assert_int_equal(familyd_shard_map_mode(fd, size, FAMILYD_MAP_SHARED, (void **) &q), 0);
        assert_int_equal(smaps_kib(q, "Rss"), size / 1024);
        assert_int_equal(q[0], 0x11);
        assert_int_equal(familyd_shard_unmap(p, size), 0);
        assert_int_equal(familyd_shard_unmap(q, size), 0);
        close(fd);
}

static void test_bad_arguments(void **state) {
        int fd = shard_memfd(MiB, false);
        void *p = NULL;

        assert_int_equal(familyd_shard_map_flags(fd, MiB, FAMILYD_MAP_READ_ONLY, 0x80, &p),
                         -EINVAL);
        assert_null(p);
        assert_int_equal(familyd_shard_populate(NULL, MiB, FAMILYD_MAP_READ_ONLY), -EINVAL);
        assert_int_equal(familyd_shard_populate(&p, 0, FAMILYD_MAP_READ_ONLY), -EINVAL);
        assert_int_equal(familyd_shard_populate(&p, 8, (FamilydMapMode) 7), -EINVAL);
        /* A range that is not mapped: the kernel's answer. */
        void *hole = mmap(NULL, 4 * MiB, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_ptr_not_equal(hole, MAP_FAILED);
        assert_int_equal(munmap(hole, 4 * MiB), 0);
        assert_true(familyd_shard_populate(hole, 4 * MiB, FAMILYD_MAP_READ_ONLY) < 0);
        close(fd);
}

/* A shard on huge pages: populated whole, hugetlb pages in this mapping, and mapped
 * copy-on-write with no huge page free (as root only). */
static void test_hugetlb(void **state) {
        char saved[32] = "";
        int lock, nr;
        void *p;

        if (geteuid() != 0)
                skip();
        lock = open(LOCK_PATH, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        assert_true(lock >= 0);
        assert_int_equal(flock(lock, LOCK_EX), 0);
        nr = open(NR_HUGEPAGES, O_RDWR | O_CLOEXEC);
        assert_true(nr >= 0);
        assert_true(read(nr, saved, sizeof saved - 1) > 0);
        assert_true(pwrite(nr, "4\n", 2, 0) == 2);

        int fd = shard_memfd(8 * MiB, true);
        assert_int_equal(familyd_shard_map_flags(fd, 8 * MiB, FAMILYD_MAP_READ_ONLY,
                                                 FAMILYD_MAP_LAZY, &p),
                         0);
        assert_int_equal(smaps_kib(p, "KernelPageSize"), 2048);
        assert_int_equal(smaps_kib(p, "Shared_Hugetlb"), 0);
        assert_int_equal(familyd_shard_unmap(p, 8 * MiB), 0);
        assert_int_equal(familyd_shard_map_mode(fd, 8 * MiB, FAMILYD_MAP_READ_ONLY, &p), 0);
        assert_int_equal(smaps_kib(p, "Shared_Hugetlb") + smaps_kib(p, "Private_Hugetlb"),
                         8192);
        assert_int_equal(familyd_shard_unmap(p, 8 * MiB), 0);
        /* Copy-on-write (a frozen module's mapping) while the shard holds every huge page:
         * nothing is left to reserve for copies, so it maps without a reservation, and its
         * bytes read as they are. */
        assert_int_equal(familyd_shard_map_mode(fd, 8 * MiB, FAMILYD_MAP_PRIVATE, &p), 0);
        assert_int_equal(((const uint8_t *) p)[0], 0x11);
        assert_int_equal(((const uint8_t *) p)[8 * MiB - 1], 0x11);
        assert_int_equal(familyd_shard_unmap(p, 8 * MiB), 0);
        close(fd);

        (void) pwrite(nr, saved, strlen(saved), 0);
        close(nr);
        close(lock);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_populated_by_default),
                cmocka_unit_test(test_lazy),
                cmocka_unit_test(test_private_and_shared),
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_hugetlb),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

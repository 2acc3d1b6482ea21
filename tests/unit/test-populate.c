/* test-populate.c: common/populate.c: a range's pages made present, rounded out to pages, nothing written. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/populate.h"

#define PAGES 16

static size_t page;

/* Which of the mapping's PAGES pages are resident. */
static void resident(uint8_t *p, unsigned char vec[static PAGES]) {
        assert_int_equal(mincore(p, PAGES * page, vec), 0);
        for (size_t i = 0; i < PAGES; i++)
                vec[i] &= 1;
}

/* A fresh shared mapping of a memfd, as a segment's: no page present yet. */
static uint8_t *fresh(int *ret_fd) {
        int fd = memfd_create("test-populate", MFD_CLOEXEC);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, (off_t) (PAGES * page)), 0);
        uint8_t *p = mmap(NULL, PAGES * page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        assert_true(p != MAP_FAILED);
        *ret_fd = fd;
        return p;
}

static void test_rounded_out(void **state) {
        unsigned char vec[PAGES];
        int fd;
        uint8_t *p = fresh(&fd);

        resident(p, vec);
        for (size_t i = 0; i < PAGES; i++)
                assert_int_equal(vec[i], 0);
        /* From inside page 3 to inside page 6: pages 3 to 6 present, no other. */
        assert_int_equal(memory_populate_write(p + 3 * page + 100, 3 * page), 0);
        resident(p, vec);
        for (size_t i = 0; i < PAGES; i++)
                assert_int_equal(vec[i], i >= 3 && i <= 6);
        /* Present, writable without a fault, and still zero: nothing was written. */
        for (size_t i = 3 * page; i < 7 * page; i++)
                assert_int_equal(p[i], 0);
        assert_int_equal(munmap(p, PAGES * page), 0);
        assert_int_equal(close(fd), 0);
        (void) state;
}

static void test_empty_and_errors(void **state) {
        unsigned char vec[PAGES];
        int fd;
        uint8_t *p = fresh(&fd);

        assert_int_equal(memory_populate_write(p + page, 0), 0);
        resident(p, vec);
        for (size_t i = 0; i < PAGES; i++)
                assert_int_equal(vec[i], 0);
        /* A range past the mapping's end: refused (callers ignore it and fault as before). */
        assert_int_equal(munmap(p + (PAGES - 1) * page, page), 0);
        assert_int_equal(memory_populate_write(p + (PAGES - 2) * page, 2 * page), -ENOMEM);
        /* A range that wraps the address space. */
        assert_int_equal(memory_populate_write((void *) (UINTPTR_MAX - 10), 100), -EINVAL);
        assert_int_equal(munmap(p, (PAGES - 1) * page), 0);
        assert_int_equal(close(fd), 0);
        (void) state;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_rounded_out),
                cmocka_unit_test(test_empty_and_errors),
        };

        page = (size_t) sysconf(_SC_PAGESIZE);
        return cmocka_run_group_tests(tests, NULL, NULL);
}

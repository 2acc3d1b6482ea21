/* test-segment.c: shm/segment.c: host segments sealed against resizing and writes, writable ones, adopted descriptors, with real memfds. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "familyd-v1-shard.pb-c.h"
#include "common/macro.h"
#include "shm/segment.h"
#include "handout/shard-socket.h"
#include "handout/shard-table.h"
#include "handout/token.h"

typedef Familyd__V1__ShardFdRequest Request;
typedef Familyd__V1__ShardFdReply Reply;

static void test_segment_sealing(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        _cleanup_close_ int ro = -1, rw = -1, reopened = -1;
        const size_t size = 3 * 4096 + 17;
        char path[64];
        struct stat st;

        assert_int_equal(shard_segment_new_host("test", 0, 0, &s), -EINVAL);
        assert_null(s);
        assert_int_equal(shard_segment_new_host("test-shard", size, 3, &s), 0);
        assert_int_equal(shard_segment_size(s), size);
        assert_int_equal(shard_segment_device(s), 3);
        assert_string_equal(shard_segment_device_kind(s), "host");
        assert_true(shard_segment_is_sealed(s));

        uint8_t *data = shard_segment_data(s);
        assert_non_null(data);
        for (size_t i = 0; i < size; i++)
                data[i] = (uint8_t) (i * 7 + 1);

        /* Resizing is sealed from the start; writes and further seals only at the end. */
        int seals = fcntl(shard_segment_fd(s), F_GET_SEALS);
        assert_true(seals >= 0);
        assert_true(seals & F_SEAL_SHRINK);
        assert_true(seals & F_SEAL_GROW);
        assert_false(seals & F_SEAL_SEAL);
        assert_false(seals & F_SEAL_WRITE);

        /* Nothing is handed out before the final seals, which wait for the daemon's mapping. */
        assert_false(shard_segment_is_final(s));
        assert_int_equal(shard_segment_open(s, false, &ro), -EBUSY);
        assert_int_equal(shard_segment_seal(s), -EBUSY);
        shard_segment_unmap(s);
        assert_null(shard_segment_data(s));
        shard_segment_unmap(s);
        assert_int_equal(shard_segment_seal(s), 0);
        assert_int_equal(shard_segment_seal(s), 0);
        assert_true(shard_segment_is_final(s));
        seals = fcntl(shard_segment_fd(s), F_GET_SEALS);
        assert_int_equal(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL),
                         F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL);

        /* Read-only: no resize, no write, no writable shared mapping, even by mprotect. */
        assert_int_equal(shard_segment_open(s, false, &ro), 0);
        assert_int_equal(fcntl(ro, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        assert_int_equal(fcntl(ro, F_GETFL) & O_ACCMODE, O_RDONLY);
        assert_int_equal(fstat(ro, &st), 0);
        assert_int_equal(st.st_size, size);
        assert_int_equal(st.st_mode & 07777, 0400);
        assert_int_equal(ftruncate(ro, 1), -1);
        assert_int_equal(write(ro, "x", 1), -1);
        assert_int_equal(errno, EBADF);
        assert_true(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0) == MAP_FAILED);
        assert_int_equal(errno, EACCES);
        uint8_t *view = mmap(NULL, size, PROT_READ, MAP_SHARED, ro, 0);
        assert_true(view != MAP_FAILED);
        for (size_t i = 0; i < size; i++)
                assert_int_equal(view[i], (uint8_t) (i * 7 + 1));
        assert_int_equal(mprotect(view, size, PROT_READ | PROT_WRITE), -1);
        assert_int_equal(errno, EACCES);

        /* Reopened O_RDWR through /proc (what root may do despite the mode): the write seal
         * still refuses every write, for every process. */
        (void) snprintf(path, sizeof path, "/proc/self/fd/%i", ro);
        reopened = open(path, O_RDWR | O_CLOEXEC);
        if (reopened >= 0) { /* we may be root here, or not */
                assert_int_equal(write(reopened, "x", 1), -1);
                assert_int_equal(errno, EPERM);
                assert_true(mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, reopened, 0) ==
                            MAP_FAILED);
                assert_int_equal(errno, EPERM);
        } else
                assert_int_equal(errno, EACCES);
        assert_int_equal(fcntl(ro, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);

        /* Copy-on-write mappings still work: the trainer's own copy, never the memfd. */
        uint8_t *cow = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, ro, 0);
        assert_true(cow != MAP_FAILED);
        cow[0] = 0xee;
        assert_int_equal(view[0], 1);
        assert_int_equal(munmap(cow, size), 0);

        /* A read-only segment never becomes writable. */
        assert_false(shard_segment_writes_allowed(s));
        assert_int_equal(shard_segment_open(s, true, &rw), -EACCES);
        assert_int_equal(munmap(view, size), 0);
}

static void test_segment_writable(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        _cleanup_close_ int ro = -1, rw = -1;
        const size_t size = 2 * 4096;

        assert_int_equal(shard_segment_new_host("test-writable", size, 0, &s), 0);
        uint8_t *data = shard_segment_data(s);
        assert_non_null(data);
        memset(data, 0x11, size);
        shard_segment_unmap(s);

        /* Writable: refused until the creator allows writes (a writable build), then sealed
         * against further sealing only. */
        assert_false(shard_segment_writes_allowed(s));
        shard_segment_allow_writes(s);
        assert_true(shard_segment_writes_allowed(s));
        assert_int_equal(shard_segment_open(s, true, &rw), -EBUSY);
        assert_int_equal(shard_segment_seal(s), 0);
        int seals = fcntl(shard_segment_fd(s), F_GET_SEALS);
        assert_int_equal(seals & (F_SEAL_WRITE | F_SEAL_SEAL), F_SEAL_SEAL);

        /* Writes land in the one memory; the size is final; no holder can seal writes off. */
        assert_int_equal(shard_segment_open(s, true, &rw), 0);
        assert_int_equal(shard_segment_open(s, false, &ro), 0);
        assert_int_equal(fcntl(rw, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
        assert_int_equal(ftruncate(rw, 1), -1);
        assert_int_equal(errno, EPERM);
        assert_int_equal(ftruncate(rw, (off_t) size * 2), -1);
        assert_int_equal(errno, EPERM);
        assert_int_equal(fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE), -1);
        assert_int_equal(errno, EPERM);
        assert_int_equal(fcntl(rw, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
        assert_int_equal(errno, EPERM);
        uint8_t *view = mmap(NULL, size, PROT_READ, MAP_SHARED, ro, 0);
        assert_true(view != MAP_FAILED);
        uint8_t *w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
        assert_true(w != MAP_FAILED);
        w[0] = 0xaa;
        w[size - 1] = 0xbb;
        assert_int_equal(view[0], 0xaa);
        assert_int_equal(view[size - 1], 0xbb);

        /* Released, the memory lives on in the handed-out descriptors. */
        s = shard_segment_unref(s);
        w[1] = 0xcc;
        assert_int_equal(view[1], 0xcc);
        assert_int_equal(view[2], 0x11);
        assert_int_equal(munmap(w, size), 0);
        assert_int_equal(munmap(view, size), 0);
}

static void test_segment_adopt(void **state) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL, *a = NULL, *u = NULL;
        _cleanup_close_ int ro = -1, rw = -1;

        assert_int_equal(shard_segment_new_host("adopt", 4096, 1, &s), 0);
        shard_segment_unmap(s);
        int fd = fcntl(shard_segment_fd(s), F_DUPFD_CLOEXEC, 3);
        assert_true(fd >= 0);
        /* Adopted before its final seals (a restart between fill and publication): it is
         * sealed on adoption's terms, and handed out only then. */
        assert_int_equal(shard_segment_adopt(fd, 5, &a), 0);
        assert_int_equal(shard_segment_size(a), 4096);
        assert_int_equal(shard_segment_device(a), 5);
        assert_true(shard_segment_is_sealed(a));
        assert_false(shard_segment_is_final(a));
        assert_null(shard_segment_data(a));
        assert_int_equal(shard_segment_open(a, true, &rw), -EACCES);
        shard_segment_allow_writes(a);
        assert_int_equal(shard_segment_open(a, true, &rw), -EBUSY);
        assert_int_equal(shard_segment_seal(a), 0);
        assert_int_equal(shard_segment_open(a, true, &rw), 0);
        /* The memfd is final for every struct that names it. */
        assert_int_equal(fcntl(shard_segment_fd(s), F_GET_SEALS) & (F_SEAL_SEAL | F_SEAL_WRITE),
                         F_SEAL_SEAL);
        assert_int_equal(shard_segment_seal(s), 0);

        /* An unsealed file (the --state-dir mode) is handed out read-only only. */
        char path[] = "/tmp/test-shm-adopt-XXXXXX";
        int ufd = mkostemp(path, O_CLOEXEC);
        assert_true(ufd >= 0);
        (void) unlink(path);
        assert_int_equal(ftruncate(ufd, 100), 0);
        assert_int_equal(shard_segment_adopt(ufd, 0, &u), 0);
        assert_false(shard_segment_is_sealed(u));
        shard_segment_allow_writes(u);
        assert_int_equal(shard_segment_open(u, true, &ro), -EPERM);
        assert_int_equal(shard_segment_open(u, false, &ro), 0);
        assert_int_equal(fcntl(ro, F_GETFL) & O_ACCMODE, O_RDONLY);
}

/* ---- the table ---- */

/* A filled segment, sealed for sharing: a writable build's when writable. */

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_segment_sealing),
                cmocka_unit_test(test_segment_writable),
                cmocka_unit_test(test_segment_adopt),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}

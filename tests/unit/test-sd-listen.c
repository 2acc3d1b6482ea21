/* test-sd-listen.c: sd/listen.c: LISTEN_FDS by name; sockets and fd-store entries taken. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"
#include "sd/listen.h"

enum { KIND_LISTEN, KIND_DGRAM, KIND_MEMFD };

typedef struct Passed {
        const char *name;
        int kind;
} Passed;

static char tmpdir[] = "/tmp/test-sd-listen-XXXXXX";
static unsigned n_sockets;

static int make(int kind, const char *name) {
        if (kind == KIND_MEMFD) {
                int fd = memfd_create(name, MFD_CLOEXEC);
                assert_true(fd >= 0);
                return fd;
        }
        int fd = socket(AF_UNIX, kind == KIND_LISTEN ? SOCK_STREAM : SOCK_DGRAM, 0);
        assert_true(fd >= 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s/s%u", tmpdir, n_sockets++);
        assert_int_equal(bind(fd, (struct sockaddr *) &sa, sizeof sa), 0);
        if (kind == KIND_LISTEN)
                assert_int_equal(listen(fd, 4), 0);
        return fd;
}

/* Puts the descriptors at 3, 4, ... and sets LISTEN_* as a service manager would. */
static void pass(const Passed *p, size_t n, bool named, pid_t pid) {
        int high[16];
        char names[256] = "", buf[32];

        assert_true(n <= 16);
        for (size_t i = 0; i < n; i++) {
                int fd = make(p[i].kind, p[i].name);
                high[i] = fcntl(fd, F_DUPFD_CLOEXEC, 100);
                assert_true(high[i] >= 100);
                close(fd);
        }
        for (size_t i = 0; i < n; i++) {
                assert_int_equal(dup2(high[i], 3 + (int) i), 3 + (int) i);
                close(high[i]);
                if (i > 0)
                        strcat(names, ":");
                strcat(names, p[i].name);
        }
        snprintf(buf, sizeof buf, "%zu", n);
        setenv("LISTEN_FDS", buf, 1);
        snprintf(buf, sizeof buf, "%d", (int) pid);
        setenv("LISTEN_PID", buf, 1);
        if (named)
                setenv("LISTEN_FDNAMES", names, 1);
        else
                unsetenv("LISTEN_FDNAMES");
}

static bool fd_open(int fd) {
        return fcntl(fd, F_GETFD) >= 0;
}

static void close_range_from_3(size_t n) {
        for (size_t i = 0; i < n; i++)
                close(3 + (int) i);
}

static void test_nothing_passed(void **state) {
        ListenFds *l = NULL;
        ListenFd *a = NULL;
        size_t n = 99;
        int fd = -1;

        unsetenv("LISTEN_FDS");
        unsetenv("LISTEN_PID");
        unsetenv("LISTEN_FDNAMES");
        assert_int_equal(listen_fds_new(&l), 0);
        assert_int_equal(listen_fds_count(l), 0);
        assert_int_equal(listen_fds_take_socket(l, LISTEN_NAME_API, &fd), -ENOENT);
        assert_int_equal(listen_fds_take(l, LISTEN_PREFIX_FDSTORE_SHARD, &a, &n), 0);
        assert_int_equal(n, 0);
        assert_null(a);
        listen_fds_free(l);
}

static void test_sockets_and_fdstore_entries(void **state) {
        static const Passed p[] = {
                { "api", KIND_LISTEN },        { "shard", KIND_LISTEN },
                { "shard-aa", KIND_MEMFD },     { "meta", KIND_MEMFD },
                { "shard-bb", KIND_MEMFD },     { "meta-extra", KIND_MEMFD },
        };
        ListenFds *l = NULL;
        ListenFd *a = NULL;
        size_t n = 0;
        int api = -1, shard = -1;

        pass(p, ELEMENTSOF(p), true, getpid());
        assert_int_equal(listen_fds_new(&l), 0);
        /* The variables are gone: nothing started later would take them for its own. */
        assert_null(getenv("LISTEN_FDS"));
        assert_null(getenv("LISTEN_FDNAMES"));
        assert_int_equal(listen_fds_count(l), 6);

        assert_int_equal(listen_fds_take_socket(l, LISTEN_NAME_API, &api), 0);
        assert_int_equal(api, 3);
        assert_true(fcntl(api, F_GETFL) & O_NONBLOCK);
        assert_true(fcntl(api, F_GETFD) & FD_CLOEXEC);
        /* Taken once. */
        assert_int_equal(listen_fds_take_socket(l, LISTEN_NAME_API, &api), -ENOENT);

        /* "shard-" never matches the socket named "shard"; order is the order passed. */
        assert_int_equal(listen_fds_take(l, LISTEN_PREFIX_FDSTORE_SHARD, &a, &n), 0);
        assert_int_equal(n, 2);
        assert_string_equal(a[0].name, "shard-aa");
        assert_int_equal(a[0].fd, 5);
        assert_string_equal(a[1].name, "shard-bb");
        assert_int_equal(a[1].fd, 7);
        listen_fd_array_free(a, n);
        assert_false(fd_open(5));

        assert_int_equal(listen_fds_take_socket(l, LISTEN_NAME_SHARD, &shard), 0);
        assert_int_equal(shard, 4);
        assert_int_equal(listen_fds_count(l), 2);

        /* Freeing the set closes what nobody took, and only that. */
        listen_fds_free(l);
        assert_false(fd_open(6));
        assert_false(fd_open(8));
        assert_true(fd_open(api));
        assert_true(fd_open(shard));
        close(api);
        close(shard);
}

static void test_unknown_name_refused(void **state) {
        static const Passed p[] = { { "api", KIND_LISTEN }, { "web", KIND_LISTEN } };
        ListenFds *l = NULL;

        pass(p, ELEMENTSOF(p), true, getpid());
        assert_int_equal(listen_fds_new(&l), -EINVAL);
        assert_null(l);
        /* Refused descriptors are closed. */
        assert_false(fd_open(3));
        assert_false(fd_open(4));
}

static void test_unnamed_refused(void **state) {
        static const Passed p[] = { { "api", KIND_LISTEN } };
        ListenFds *l = NULL;

        pass(p, ELEMENTSOF(p), false, getpid());
        assert_int_equal(listen_fds_new(&l), -EINVAL);
        close_range_from_3(1);
}

static void test_wrong_kinds_refused(void **state) {
        static const Passed memfd_api[] = { { "api", KIND_MEMFD } };
        static const Passed dgram_shard[] = { { "shard", KIND_DGRAM } };
        static const Passed two_api[] = { { "api", KIND_LISTEN }, { "api", KIND_LISTEN } };
        ListenFds *l = NULL;

        pass(memfd_api, 1, true, getpid());
        assert_int_equal(listen_fds_new(&l), -EINVAL);
        pass(dgram_shard, 1, true, getpid());
        assert_int_equal(listen_fds_new(&l), -EINVAL);
        pass(two_api, 2, true, getpid());
        assert_int_equal(listen_fds_new(&l), -EINVAL);
        close_range_from_3(2);
}

static void test_other_pid_ignored(void **state) {
        static const Passed p[] = { { "web", KIND_LISTEN } };
        ListenFds *l = NULL;

        /* Meant for another process (LISTEN_PID): not ours to judge, or to close. */
        pass(p, ELEMENTSOF(p), true, getpid() + 1);
        assert_int_equal(listen_fds_new(&l), 0);
        assert_int_equal(listen_fds_count(l), 0);
        listen_fds_free(l);
        assert_true(fd_open(3));
        close_range_from_3(1);
}

static void test_socket_unix_path(void **state) {
        static const Passed p[] = { { "api", KIND_LISTEN } };
        ListenFds *l = NULL;
        char *path = NULL;
        int fd = -1;

        pass(p, 1, true, getpid());
        assert_int_equal(listen_fds_new(&l), 0);
        assert_int_equal(listen_fds_take_socket(l, LISTEN_NAME_API, &fd), 0);
        assert_int_equal(socket_unix_path(fd, &path), 0);
        assert_true(strncmp(path, tmpdir, strlen(tmpdir)) == 0);
        free(path);
        close(fd);
        listen_fds_free(l);

        int unnamed = socket(AF_UNIX, SOCK_STREAM, 0);
        assert_int_equal(socket_unix_path(unnamed, &path), -ENODATA);
        close(unnamed);
}

static int setup(void **state) {
        if (!mkdtemp(tmpdir))
                return -1;
        log_set_max_level(LOG_WARNING);
        return 0;
}

static int teardown(void **state) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_nothing_passed),
                cmocka_unit_test(test_sockets_and_fdstore_entries),
                cmocka_unit_test(test_unknown_name_refused),
                cmocka_unit_test(test_unnamed_refused),
                cmocka_unit_test(test_wrong_kinds_refused),
                cmocka_unit_test(test_other_pid_ignored),
                cmocka_unit_test(test_socket_unix_path),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}

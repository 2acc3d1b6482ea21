/* test-build-caller.c: build/build-caller.c: the process behind a call, with real processes. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "build/build-holders-keep.h"

/* Field 22 of /proc/PID/stat (starttime), read here on its own: what a caller must carry. */
static uint64_t start_time_of(pid_t pid) {
        char path[64], buf[1024];
        unsigned long long start = 0;
        FILE *f;
        char *p;

        snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        f = fopen(path, "re");
        assert_non_null(f);
        assert_non_null(fgets(buf, sizeof buf, f));
        fclose(f);
        p = strrchr(buf, ')'); /* the command may hold spaces and parentheses */
        assert_non_null(p);
        /* After ") ": field 3 (state) on; starttime is the 20th field from there. */
        p += 2;
        for (int field = 3; field < 22; field++) {
                p = strchr(p, ' ');
                assert_non_null(p);
                p++;
        }
        assert_int_equal(sscanf(p, "%llu", &start), 1);
        return start;
}

/* A pidfd of this process, or -1 where the system has none (valgrind 3.19 knows no pidfd
 * calls: ENOSYS, and then callers are named by pid and start time alone). */
static int self_pidfd(void) {
        int fd = (int) syscall(SYS_pidfd_open, getpid(), 0);

        if (fd < 0)
                assert_int_equal(errno, ENOSYS);
        return fd;
}

static bool have_pidfds(void) {
        int fd = self_pidfd();

        safe_close(fd);
        return fd >= 0;
}

/* A child that has exited and been reaped: its pid names no process. */
static pid_t gone_pid(void) {
        pid_t pid = fork();
        int status;

        assert_true(pid >= 0);
        if (pid == 0)
                _exit(0);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        return pid;
}

static void test_identify_self(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        BuildCaller c = {};
        int pidfd = -2;

        (void) state;
        assert_int_equal(build_caller_identify(getpid(), 1234, -1, &c, &pidfd, &e), 0);
        assert_false(family_error_is_set(&e));
        assert_int_equal(c.pid, getpid());
        assert_int_equal(c.uid, 1234);
        assert_true(c.start_time > 0);
        assert_int_equal(c.start_time, start_time_of(getpid()));
        assert_int_equal(pidfd >= 0, have_pidfds());
        safe_close(pidfd);
        assert_true(build_caller_alive(&c));
}

/* A pidfd the connection gave (SO_PEERPIDFD) is the one handed back. */
static void test_identify_takes_peer_pidfd(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        BuildCaller c = {};
        int given, pidfd = -2;

        (void) state;
        given = self_pidfd();
        assert_int_equal(build_caller_identify(getpid(), 0, given, &c, &pidfd, &e), 0);
        assert_int_equal(pidfd, given);
        assert_int_equal(c.start_time, start_time_of(getpid()));
        safe_close(pidfd);
}

static void expect_unknown(int r, const FamilyError *e, const char *why) {
        assert_int_equal(r, -EINVAL);
        assert_int_equal(e->status, FAMILY_STATUS_UNAVAILABLE);
        assert_string_equal(e->reason, "CALLER_UNKNOWN");
        assert_non_null(strstr(e->message, why));
}

static void test_identify_unknown(void **state) {
        FamilyError e = FAMILY_ERROR_NULL;
        BuildCaller c = { .pid = 77 };
        int pidfd = -2;

        (void) state;
        /* pid 0: SO_PEERCRED's answer for a process of another pid namespace. */
        expect_unknown(build_caller_identify(0, 0, -1, &c, &pidfd, &e), &e,
                       "outside familyd's pid namespace");
        family_error_done(&e);
        expect_unknown(build_caller_identify(gone_pid(), 0, -1, &c, &pidfd, &e), &e,
                       "it has exited");
        family_error_done(&e);
        /* Nothing written on failure. */
        assert_int_equal(c.pid, 77);
        assert_int_equal(pidfd, -2);
}

static void test_reopen(void **state) {
        BuildCaller self = { .pid = getpid(), .start_time = start_time_of(getpid()) };
        BuildCaller reused = self, gone = { .pid = gone_pid(), .start_time = 1 }, none = {};
        int pidfd = -2;

        (void) state;
        assert_int_equal(build_caller_reopen(&self, &pidfd), 0);
        assert_int_equal(pidfd >= 0, have_pidfds());
        safe_close(pidfd);

        /* The same pid with another start time: another process (a reused pid). */
        reused.start_time++;
        pidfd = -2;
        assert_int_equal(build_caller_reopen(&reused, &pidfd), -ESRCH);
        assert_false(build_caller_alive(&reused));
        assert_int_equal(build_caller_reopen(&gone, &pidfd), -ESRCH);
        assert_false(build_caller_alive(&gone));
        assert_int_equal(build_caller_reopen(&none, &pidfd), -ESRCH);
        assert_int_equal(pidfd, -2);
        assert_true(build_caller_alive(&self));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_identify_self),
                cmocka_unit_test(test_identify_takes_peer_pidfd),
                cmocka_unit_test(test_identify_unknown),
                cmocka_unit_test(test_reopen),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

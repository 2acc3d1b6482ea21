/* test-sd-notify.c: daemon/sd/notify.c against a datagram socket standing in for NOTIFY_SOCKET. */
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <systemd/sd-event.h>

#include "common/log.h"
#include "core/manager.h"
#include "sd/notify.h"

static char tmpdir[] = "/tmp/test-sd-notify-XXXXXX";
static char registry[128];
static int sock = -1;
static Manager *manager;

/* The next datagram (within a second), and the descriptors that came with it. */
static char *receive(int *ret_fds, size_t *ret_n_fds) {
        static char buf[4096];
        char control[CMSG_SPACE(16 * sizeof(int))];
        struct iovec iov = { .iov_base = buf, .iov_len = sizeof buf - 1 };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                             .msg_controllen = sizeof control };
        struct pollfd p = { .fd = sock, .events = POLLIN };

        if (poll(&p, 1, 1000) != 1)
                return NULL;
        ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
        assert_true(n >= 0);
        buf[n] = 0;
        size_t n_fds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
                if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                        n_fds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        if (ret_fds)
                                memcpy(ret_fds, CMSG_DATA(c), n_fds * sizeof(int));
                }
        if (ret_n_fds)
                *ret_n_fds = n_fds;
        return buf;
}

static uint64_t now_usec(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static bool nothing_pending(void) {
        struct pollfd p = { .fd = sock, .events = POLLIN };
        return poll(&p, 1, 100) == 0;
}

static void test_disabled_without_notify_socket(void **state) {
        Notifier *n = NULL;
        int fd = memfd_create("x", MFD_CLOEXEC);

        unsetenv("NOTIFY_SOCKET");
        sd_event *e = NULL;
        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(notifier_new(manager, &n), 0);
        /* No timer joins the loop: nothing to dispatch. */
        assert_int_equal(notifier_attach(n, e), 0);
        assert_int_equal(sd_event_run(e, 100000), 0);
        notifier_ready(n);
        notifier_reload_begin(n);
        notifier_reload_end(n, 0);
        notifier_stopping(n);
        notifier_free(n);
        sd_event_unref(e);
        assert_int_equal(notify_fdstore_add("shard-x", &fd, 1), 0);
        close(fd);
}

static void test_ready_reload_stopping(void **state) {
        char path[256];
        Notifier *n = NULL;
        char *m;

        snprintf(path, sizeof path, "%s/notify", tmpdir);
        setenv("NOTIFY_SOCKET", path, 1);
        unsetenv("WATCHDOG_USEC");
        sd_event *e = NULL;
        assert_int_equal(sd_event_new(&e), 0);
        assert_int_equal(notifier_new(manager, &n), 0);
        /* No watchdog: the timer only refreshes STATUS=, every 10 s. */
        assert_int_equal(notifier_attach(n, e), 0);
        assert_int_equal(sd_event_run(e, 100000), 0);

        /* A Reload RPC before READY=1 says nothing: the manager waits for readiness. */
        notifier_reload_begin(n);
        notifier_reload_end(n, 0);
        assert_true(nothing_pending());

        notifier_ready(n);
        m = receive(NULL, NULL);
        assert_non_null(m);
        assert_string_equal(m, "READY=1\nSTATUS=Serving: registry generation 1, 0 families, "
                               "0 builds, 0 meshes");

        /* Overlapping reloads (SIGHUP during a Reload RPC): one pair. */
        notifier_reload_begin(n);
        notifier_reload_begin(n);
        m = receive(NULL, NULL);
        assert_non_null(m);
        assert_true(strncmp(m, "RELOADING=1\nSTATUS=Reloading the registry\nMONOTONIC_USEC=",
                            57) == 0);
        notifier_reload_end(n, 0);
        assert_true(nothing_pending());
        notifier_reload_end(n, -EINVAL);
        m = receive(NULL, NULL);
        assert_non_null(m);
        assert_non_null(strstr(m, "READY=1\nSTATUS=Serving: registry generation 1"));
        assert_non_null(strstr(m, "the last reload failed"));

        /* The next good reload clears it. */
        notifier_reload_begin(n);
        assert_non_null(receive(NULL, NULL));
        notifier_reload_end(n, 0);
        m = receive(NULL, NULL);
        assert_non_null(m);
        assert_null(strstr(m, "failed"));

        /* Nothing changed: the timer sends nothing. */
        notifier_dispatch(n);
        assert_true(nothing_pending());

        notifier_stopping(n);
        m = receive(NULL, NULL);
        assert_non_null(m);
        assert_string_equal(m, "STOPPING=1\nSTATUS=Stopping");
        notifier_free(n);
        sd_event_unref(e);
}

static void test_watchdog(void **state) {
        char path[256], pid[32];
        Notifier *n = NULL;

        snprintf(path, sizeof path, "%s/notify", tmpdir);
        setenv("NOTIFY_SOCKET", path, 1);
        setenv("WATCHDOG_USEC", "100000", 1);
        snprintf(pid, sizeof pid, "%d", (int) getpid());
        setenv("WATCHDOG_PID", pid, 1);
        sd_event *e = NULL;
        assert_int_equal(sd_event_new(&e), 0);
        uint64_t t0 = now_usec();
        assert_int_equal(notifier_new(manager, &n), 0);
        assert_int_equal(notifier_attach(n, e), 0);
        notifier_ready(n);
        assert_non_null(receive(NULL, NULL));

        /* The timer fires after half the interval, 50 ms (never sooner; later on a slow run),
         * and again 50 ms after that: it repeats. */
        for (unsigned i = 1; i <= 3; i++) {
                assert_int_equal(sd_event_run(e, 1000000), 1);
                assert_true(now_usec() - t0 >= i * 50000);
                char *m = receive(NULL, NULL);
                assert_non_null(m);
                assert_string_equal(m, "WATCHDOG=1\n");
        }
        assert_true(now_usec() - t0 < 1000000);
        notifier_free(n);

        /* WATCHDOG_PID of another process: the watchdog is not ours. */
        snprintf(pid, sizeof pid, "%d", (int) getpid() + 1);
        setenv("WATCHDOG_PID", pid, 1);
        assert_int_equal(notifier_new(manager, &n), 0);
        assert_int_equal(notifier_attach(n, e), 0);
        notifier_ready(n);
        assert_non_null(receive(NULL, NULL));
        assert_int_equal(sd_event_run(e, 200000), 0);
        assert_true(nothing_pending());
        notifier_free(n);
        sd_event_unref(e);
        unsetenv("WATCHDOG_USEC");
        unsetenv("WATCHDOG_PID");
}

static void test_fdstore(void **state) {
        char path[256], name[300];
        int fd = memfd_create("segment", MFD_CLOEXEC), got[16];
        size_t n_got = 0;
        struct stat a, b;

        snprintf(path, sizeof path, "%s/notify", tmpdir);
        setenv("NOTIFY_SOCKET", path, 1);

        assert_int_equal(notify_fdstore_add("shard-bld-1-0", &fd, 1), 1);
        char *m = receive(got, &n_got);
        assert_non_null(m);
        assert_string_equal(m, "FDSTORE=1\nFDNAME=shard-bld-1-0");
        assert_int_equal(n_got, 1);
        assert_int_equal(fstat(fd, &a), 0);
        assert_int_equal(fstat(got[0], &b), 0);
        assert_true(a.st_ino == b.st_ino && a.st_dev == b.st_dev);
        close(got[0]);

        assert_int_equal(notify_fdstore_remove("shard-bld-1-0"), 1);
        m = receive(NULL, &n_got);
        assert_non_null(m);
        assert_string_equal(m, "FDSTOREREMOVE=1\nFDNAME=shard-bld-1-0");
        assert_int_equal(n_got, 0);

        /* Names systemd would refuse never leave. */
        memset(name, 'a', 256);
        name[256] = 0;
        assert_int_equal(notify_fdstore_add("", &fd, 1), -EINVAL);
        assert_int_equal(notify_fdstore_add("a:b", &fd, 1), -EINVAL);
        assert_int_equal(notify_fdstore_add("tab\there", &fd, 1), -EINVAL);
        assert_int_equal(notify_fdstore_add(name, &fd, 1), -EINVAL);
        assert_int_equal(notify_fdstore_add("ok", &fd, 0), -EINVAL);
        assert_int_equal(notify_fdstore_remove("a:b"), -EINVAL);
        name[255] = 0;
        assert_int_equal(notify_fdstore_add(name, &fd, 1), 1);
        assert_non_null(receive(got, &n_got));
        close(got[0]);
        assert_true(nothing_pending());
        close(fd);
}

static int setup(void **state) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        struct sockaddr_un sa = { .sun_family = AF_UNIX };

        if (!mkdtemp(tmpdir))
                return -1;
        log_set_max_level(LOG_WARNING);
        snprintf(registry, sizeof registry, "%s/registry", tmpdir);
        if (mkdir(registry, 0700) < 0)
                return -1;
        ManagerParams params = {
                .registry_path = registry,
                .node_name = "unit",
                .node_rank = -1,
                .address = "",
                .host_devices = 1,
                .shm_budget_bytes = 1u << 20,
                .max_builds = 4,
        };
        if (manager_new(&params, &manager, &diag) < 0)
                return -1;

        sock = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s/notify", tmpdir);
        if (sock < 0 || bind(sock, (struct sockaddr *) &sa, sizeof sa) < 0)
                return -1;
        return 0;
}

static int teardown(void **state) {
        char cmd[128];

        manager_free(manager);
        close(sock);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
        return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_disabled_without_notify_socket),
                cmocka_unit_test(test_ready_reload_stopping),
                cmocka_unit_test(test_watchdog),
                cmocka_unit_test(test_fdstore),
        };
        return cmocka_run_group_tests(tests, setup, teardown);
}

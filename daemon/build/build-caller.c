/* build-caller.c: the process behind a call: pid, uid, start time and a pidfd that watches it. */

/*
 * DESIGN: a reference must name one process, not a pid: pids are reused. The kernel's pidfd
 * names one process for good, so the pidfd comes first (SO_PEERPIDFD of the connection when the
 * adapter has it, else pidfd_open() on the SO_PEERCRED pid); the start time read after it is
 * then checked against the pidfd's process still being alive, so it is that process's start
 * time and not a successor's. The start time is what a reference keeps (it can be saved across
 * a restart; a pidfd cannot).
 *
 * Without pidfds (kernels before 5.3; valgrind 3.19, which does not know the calls: ENOSYS) a
 * caller is named by its pid and start time alone, and the watcher polls it
 * (build_caller_alive()): a pid reused between SO_PEERCRED and the read of its start time
 * would go unnoticed there, a window of microseconds.
 */

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "build-holders-keep.h"
#include "handout/socket-cred.h"

static int pidfd_open_(pid_t pid) {
        return (int) syscall(SYS_pidfd_open, pid, 0);
}

static int pidfd_alive(int pidfd, pid_t pid) {
        /* Signal 0 checks the process is there without signalling it. */
        if (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0)
                return 1;
        if (errno == ENOSYS && kill(pid, 0) == 0)
                return 1;
        return errno == EPERM ? 1 : 0;
}

static int unknown(FamilyError *e, int32_t pid, const char *why) {
        return family_error_set(e, FAMILY_STATUS_UNAVAILABLE, "CALLER_UNKNOWN", NULL,
                                "cannot tell which process is calling (pid %d: %s); builds "
                                "are held by processes, so a materialising Build, and a "
                                "ReleaseBuild without force, must come over the Unix socket "
                                "from a process in familyd's pid namespace",
                                (int) pid, why);
}

int build_caller_identify(int32_t pid, uint32_t uid, int caller_pidfd, BuildCaller *ret,
                          int *ret_pidfd, FamilyError *ret_error) {
        _cleanup_close_ int pidfd = caller_pidfd;
        uint64_t start;
        int r;

        if (pid <= 0)
                return unknown(ret_error, pid, "outside familyd's pid namespace");
        if (pidfd < 0)
                pidfd = pidfd_open_(pid);
        if (pidfd < 0 && errno != ENOSYS)
                return unknown(ret_error, pid, "it has exited");
        r = socket_cred_start_time(pid, &start);
        if (r < 0 || (pidfd >= 0 && !pidfd_alive(pidfd, pid)))
                return unknown(ret_error, pid, "it has exited");
        *ret = (BuildCaller) { .pid = pid, .uid = uid, .start_time = start };
        *ret_pidfd = TAKE_FD(pidfd);
        return 0;
}

int build_caller_reopen(const BuildCaller *saved, int *ret_pidfd) {
        _cleanup_close_ int pidfd = -1;
        uint64_t start;

        if (saved->pid <= 0)
                return -ESRCH;
        pidfd = pidfd_open_(saved->pid);
        if (pidfd < 0 && errno != ENOSYS)
                return -ESRCH;
        /* As build_caller_identify(): the start time read after the pidfd, then the pidfd's
         * process still there, so both name the same process (no pidfd: polled). */
        if (socket_cred_start_time(saved->pid, &start) < 0 || start != saved->start_time ||
            (pidfd >= 0 && !pidfd_alive(pidfd, saved->pid)))
                return -ESRCH;
        *ret_pidfd = TAKE_FD(pidfd);
        return 0;
}

bool build_caller_alive(const BuildCaller *c) {
        uint64_t start;

        return socket_cred_start_time(c->pid, &start) >= 0 && start == c->start_time;
}

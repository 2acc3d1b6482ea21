/* socket-cred.c: whether the process at a Unix socket's other end is an admin (API socket and shard socket alike),
 * and which process it is. */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macro.h"
#include "socket-cred.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13 */
#endif
#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif

/* Groups read per client: more than NGROUPS_MAX of any sane system. */
#define PEER_CRED_MAX_GROUPS 65536u

/* Whether the process at fd's other end has gid among its supplementary groups. */
static bool peer_in_group(int fd, gid_t gid) {
        _cleanup_free_ gid_t *groups = NULL;
        socklen_t len = 64 * sizeof(gid_t);

        for (;;) {
                free(groups);
                groups = malloc(len);
                if (!groups)
                        return false;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
                        break;
                /* ERANGE: len now says how much room the list needs. */
                if (errno != ERANGE || len > PEER_CRED_MAX_GROUPS * sizeof(gid_t))
                        return false;
        }
        for (size_t i = 0; i < len / sizeof(gid_t); i++)
                if (groups[i] == gid)
                        return true;
        return false;
}

bool socket_cred_is_admin(int fd, const struct ucred *cred, gid_t admin_gid) {
        if (cred->uid == 0)
                return true;
        if (admin_gid == (gid_t) -1)
                return false;
        return cred->gid == admin_gid || peer_in_group(fd, admin_gid);
}

int socket_cred_start_time(pid_t pid, uint64_t *ret) {
        char path[64], buf[1024];
        unsigned long long start;
        ssize_t n;
        int fd;

        (void) snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return -errno;
        n = read(fd, buf, sizeof buf - 1);
        int r = n < 0 ? -errno : 0;
        safe_close(fd);
        if (r < 0)
                return r;
        buf[n] = 0;
        /* The name (field 2) may hold spaces and parentheses: fields go on after its last ')'. */
        char *p = strrchr(buf, ')');
        if (!p)
                return -EBADMSG;
        p++;
        /* Fields 3..21 are skipped, 22 read. */
        for (int field = 3; field < 22; field++) {
                p = strchr(p + 1, ' ');
                if (!p)
                        return -EBADMSG;
        }
        if (sscanf(p, " %llu", &start) != 1)
                return -EBADMSG;
        *ret = start;
        return 0;
}

int socket_cred_process(int fd, const struct ucred *cred, uint64_t *ret_start_time) {
        _cleanup_close_ int pidfd = -1;
        socklen_t len = sizeof pidfd;
        uint64_t start;

        if (cred->pid <= 0)
                return -ESRCH;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) < 0 || pidfd < 0) {
                pidfd = (int) syscall(SYS_pidfd_open, cred->pid, 0);
                if (pidfd < 0 && errno != ENOSYS)
                        return -ESRCH;
        }
        if (socket_cred_start_time(cred->pid, &start) < 0)
                return -ESRCH;
        /* Signal 0 checks the process is there without signalling it. */
        if (pidfd >= 0 && syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) < 0 &&
            errno != EPERM && errno != ENOSYS)
                return -ESRCH;
        *ret_start_time = start;
        return 0;
}

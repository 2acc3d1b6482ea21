/* listen.c: socket activation and the fd store's way back in: LISTEN_FDS checked by name. */

/*
 * DESIGN: the service manager passes descriptors from fd 3 on, named by LISTEN_FDNAMES. Two
 * kinds share that channel: the listening sockets of familyd.socket and familyd-shard.socket
 * (api, shard), and, on a restart, what familyd itself put in the fd store (shard-*, meta*).
 * Everything is checked once, here, at start: a name we do not know means the units and the
 * binary disagree, and serving anyway would leave a socket nobody answers, so it is an error.
 * The checks happen before anything is bound, and nothing here ever writes to a descriptor.
 * Everything runs on the main thread during start; no locking.
 */

#include <fcntl.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>

#include "listen.h"
#include "common/log.h"

struct ListenFds {
        ListenFd *fds; /* fd -1 and name NULL once taken */
        size_t n;
};

static bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool name_is_fdstore(const char *name) {
        return startswith(name, LISTEN_PREFIX_FDSTORE_SHARD) ||
               startswith(name, LISTEN_PREFIX_FDSTORE_META);
}

static const char *file_type_name(mode_t mode) {
        switch (mode & S_IFMT) {
        case S_IFREG:
                return "a regular file";
        case S_IFDIR:
                return "a directory";
        case S_IFCHR:
                return "a character device";
        case S_IFBLK:
                return "a block device";
        case S_IFIFO:
                return "a pipe";
        case S_IFLNK:
                return "a symbolic link";
        default:
                return "not a socket";
        }
}

static const char *family_name(int family) {
        switch (family) {
        case AF_INET:
                return "an AF_INET socket";
        case AF_INET6:
                return "an AF_INET6 socket";
        case AF_NETLINK:
                return "an AF_NETLINK socket";
        default:
                return "a socket of another family";
        }
}

static const char *type_name(int type) {
        switch (type) {
        case SOCK_DGRAM:
                return "a datagram socket";
        case SOCK_SEQPACKET:
                return "a seqpacket socket";
        default:
                return "not a stream socket";
        }
}

/* 0 when fd is a listening AF_UNIX stream socket; else -EINVAL, logged with what it is. */
static int check_listening_unix_stream(int fd, const char *name) {
        struct stat st;
        int domain = 0, type = 0, listening = 0;
        socklen_t len;
        const char *what = NULL;

        if (fstat(fd, &st) < 0)
                return log_error_errno(-errno, "Inherited descriptor %d ('%s') cannot be "
                                               "examined: %m",
                                       fd, name);
        if (!S_ISSOCK(st.st_mode))
                what = file_type_name(st.st_mode);
        if (!what) {
                len = sizeof domain;
                if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) < 0)
                        return log_error_errno(-errno, "Inherited descriptor %d ('%s'): "
                                                       "SO_DOMAIN: %m",
                                               fd, name);
                if (domain != AF_UNIX)
                        what = family_name(domain);
        }
        if (!what) {
                len = sizeof type;
                if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
                        return log_error_errno(-errno, "Inherited descriptor %d ('%s'): "
                                                       "SO_TYPE: %m",
                                               fd, name);
                if (type != SOCK_STREAM)
                        what = type_name(type);
        }
        if (!what) {
                len = sizeof listening;
                if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0)
                        return log_error_errno(-errno, "Inherited descriptor %d ('%s'): "
                                                       "SO_ACCEPTCONN: %m",
                                               fd, name);
                if (!listening)
                        what = "a stream socket that is not listening";
        }
        if (what)
                return log_error_errno(-EINVAL, "Inherited descriptor %d ('%s') is not a "
                                                "listening AF_UNIX stream socket: it is %s.",
                                       fd, name, what);
        return 0;
}

static ListenFds *listen_fds_alloc(void) {
        return calloc(1, sizeof(ListenFds));
}

/* Checks every descriptor's name and kind; logs each problem. */
static int listen_fds_verify(ListenFds *l, bool named) {
        bool seen_api = false, seen_shard = false;
        int ret = 0;

        for (size_t i = 0; i < l->n; i++) {
                const ListenFd *f = &l->fds[i];
                int r;

                if (!named) {
                        log_error("Descriptor %d was passed without a name (LISTEN_FDS without "
                                  "LISTEN_FDNAMES): name the sockets '" LISTEN_NAME_API
                                  "' and '" LISTEN_NAME_SHARD "' (FileDescriptorName= in the "
                                  "socket units, --fdname= with systemd-socket-activate).",
                                  f->fd);
                        ret = -EINVAL;
                } else if (streq(f->name, LISTEN_NAME_API) || streq(f->name, LISTEN_NAME_SHARD)) {
                        bool *seen = streq(f->name, LISTEN_NAME_API) ? &seen_api : &seen_shard;
                        if (*seen) {
                                log_error("Descriptor %d: a second socket named '%s' was "
                                          "passed; familyd serves one.",
                                          f->fd, f->name);
                                ret = -EINVAL;
                        }
                        *seen = true;
                        r = check_listening_unix_stream(f->fd, f->name);
                        if (r < 0)
                                ret = r;
                } else if (!name_is_fdstore(f->name)) {
                        log_error("Descriptor %d has the unknown name '%s' (LISTEN_FDNAMES); "
                                  "familyd takes '" LISTEN_NAME_API "', '" LISTEN_NAME_SHARD
                                  "' and its own fd-store names (" LISTEN_PREFIX_FDSTORE_SHARD
                                  "*, " LISTEN_PREFIX_FDSTORE_META "*).",
                                  f->fd, f->name);
                        ret = -EINVAL;
                }
        }
        return ret;
}

int listen_fds_new(ListenFds **ret) {
        _cleanup_(listen_fds_freep) ListenFds *l = NULL;
        char **names = NULL;
        /* sd_listen_fds_with_names() names every descriptor "unknown" when LISTEN_FDNAMES is
         * unset, which is also a legal name: ask the environment first. */
        bool named = getenv("LISTEN_FDNAMES") != NULL;
        int n, r;

        l = listen_fds_alloc();
        if (!l)
                return -ENOMEM;

        n = sd_listen_fds_with_names(/* unset_environment= */ true, &names);
        if (n < 0)
                return log_error_errno(n, "Failed to read the descriptors passed by the service "
                                          "manager (LISTEN_FDS): %m");
        if (n > 0) {
                l->fds = calloc((size_t) n, sizeof(ListenFd));
                if (!l->fds) {
                        for (int i = 0; i < n; i++) {
                                safe_close(SD_LISTEN_FDS_START + i);
                                free(names ? names[i] : NULL);
                        }
                        free(names);
                        return -ENOMEM;
                }
                for (int i = 0; i < n; i++)
                        l->fds[l->n++] = (ListenFd) {
                                .fd = SD_LISTEN_FDS_START + i,
                                .name = names ? names[i] : NULL,
                        };
        }
        free(names); /* the strings moved into l->fds */

        for (size_t i = 0; i < l->n; i++)
                if (!l->fds[i].name)
                        return -ENOMEM;

        r = listen_fds_verify(l, named);
        if (r < 0)
                return r;

        for (size_t i = 0; i < l->n; i++)
                log_debug("Inherited descriptor %d named '%s'.", l->fds[i].fd, l->fds[i].name);

        *ret = TAKE_PTR(l);
        return 0;
}

ListenFds *listen_fds_free(ListenFds *l) {
        if (!l)
                return NULL;
        listen_fd_array_free(l->fds, l->n);
        return mfree(l);
}

size_t listen_fds_count(const ListenFds *l) {
        size_t n = 0;
        if (!l)
                return 0;
        for (size_t i = 0; i < l->n; i++)
                n += l->fds[i].fd >= 0;
        return n;
}

int listen_fds_take_socket(ListenFds *l, const char *name, int *ret_fd) {
        if (!l)
                return -ENOENT;
        for (size_t i = 0; i < l->n; i++) {
                ListenFd *f = &l->fds[i];
                if (f->fd < 0 || !streq(f->name, name))
                        continue;

                /* The loops accept until EAGAIN. The flag lives in the open file description
                 * shared with the manager's copy, which is non-blocking already (systemd
                 * creates its listening sockets so). */
                int flags = fcntl(f->fd, F_GETFL);
                if (flags < 0 || fcntl(f->fd, F_SETFL, flags | O_NONBLOCK) < 0)
                        return log_error_errno(-errno, "Failed to make inherited socket '%s' "
                                                       "non-blocking: %m",
                                               name);
                if (fcntl(f->fd, F_SETFD, FD_CLOEXEC) < 0)
                        return log_error_errno(-errno, "Failed to set close-on-exec on "
                                                       "inherited socket '%s': %m",
                                               name);
                *ret_fd = TAKE_FD(f->fd);
                f->name = mfree(f->name);
                return 0;
        }
        return -ENOENT;
}

int listen_fds_take(ListenFds *l, const char *prefix, ListenFd **ret, size_t *ret_n) {
        ListenFd *a = NULL;
        size_t n = 0;

        if (l)
                for (size_t i = 0; i < l->n; i++)
                        n += l->fds[i].fd >= 0 && startswith(l->fds[i].name, prefix);
        if (n > 0) {
                a = calloc(n, sizeof(ListenFd));
                if (!a)
                        return -ENOMEM;
                n = 0;
                for (size_t i = 0; i < l->n; i++) {
                        ListenFd *f = &l->fds[i];
                        if (f->fd < 0 || !startswith(f->name, prefix))
                                continue;
                        a[n++] = (ListenFd) { .name = TAKE_PTR(f->name), .fd = TAKE_FD(f->fd) };
                }
        }
        *ret = a;
        *ret_n = n;
        return 0;
}

void listen_fd_array_free(ListenFd *a, size_t n) {
        for (size_t i = 0; i < n; i++) {
                safe_close(a[i].fd);
                free(a[i].name);
        }
        free(a);
}

int socket_unix_path(int fd, char **ret_path) {
        struct sockaddr_un sa = {};
        socklen_t len = sizeof sa;

        if (getsockname(fd, (struct sockaddr *) &sa, &len) < 0)
                return -errno;
        if (sa.sun_family != AF_UNIX || len <= offsetof(struct sockaddr_un, sun_path) ||
            sa.sun_path[0] == 0)
                return -ENODATA;
        char *p = strndup(sa.sun_path, len - offsetof(struct sockaddr_un, sun_path));
        if (!p)
                return -ENOMEM;
        *ret_path = p;
        return 0;
}

/* listener.c: the API socket, accepted by the daemon's own loop so it can cap connections. */

/*
 * DESIGN: gRPC owns a connection once it has its fd and never says when it closes it. To count
 * live connections without holding a second reference to each socket (which would keep it open
 * after gRPC closes it), the listener remembers each accepted socket's inode and, only when the
 * cap is reached, prunes the ones no longer open in /proc/self/fd.
 */

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "listener.h"
#include "log.h"

struct Listener {
        int fd;
        int lock_fd;
        char *path;
        char *lock_path;
        unsigned max_connections;
        ino_t *inodes; /* accepted sockets, live or since closed by gRPC */
        size_t n_inodes;
        size_t allocated;
};

int listener_new(const char *path, unsigned max_connections, Listener **ret) {
        _cleanup_(listener_freep) Listener *l = NULL;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };

        if (strlen(path) >= sizeof sa.sun_path)
                return log_error_errno(-ENAMETOOLONG, "Socket path %s is too long", path);
        memcpy(sa.sun_path, path, strlen(path));

        l = calloc(1, sizeof *l);
        if (!l)
                return -ENOMEM;
        l->fd = l->lock_fd = -1;
        l->max_connections = max_connections;
        l->path = strdup(path);
        if (!l->path || asprintf(&l->lock_path, "%s.lock", path) < 0)
                return -ENOMEM;

        l->lock_fd = open(l->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
        if (l->lock_fd < 0)
                return log_error_errno(-errno, "Failed to open lock file %s: %m", l->lock_path);
        if (flock(l->lock_fd, LOCK_EX | LOCK_NB) < 0) {
                int r = -errno;
                if (r == -EWOULDBLOCK) {
                        /* Not ours to remove: the running daemon owns both files. */
                        free(l->lock_path);
                        l->lock_path = NULL;
                        free(l->path);
                        l->path = NULL;
                        return log_error_errno(-EBUSY,
                                               "Another familyd is serving %s (it holds %s.lock), "
                                               "refusing to start",
                                               path, path);
                }
                return log_error_errno(r, "Failed to lock %s: %m", l->lock_path);
        }

        l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (l->fd < 0)
                return log_error_errno(-errno, "Failed to create a socket: %m");

        /* We hold the lock, so whatever is at path is a stale socket of a dead daemon. */
        (void) unlink(path);
        if (bind(l->fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                return log_error_errno(-errno, "Failed to bind %s: %m", path);
        if (chmod(path, 0660) < 0)
                return log_error_errno(-errno, "Failed to set the mode of %s: %m", path);
        if (listen(l->fd, SOMAXCONN) < 0)
                return log_error_errno(-errno, "Failed to listen on %s: %m", path);

        *ret = TAKE_PTR(l);
        return 0;
}

int listener_adopt(int fd, unsigned max_connections, Listener **ret) {
        Listener *l = calloc(1, sizeof *l);
        if (!l)
                return -ENOMEM;
        l->fd = fd;
        l->lock_fd = -1;
        l->max_connections = max_connections;
        *ret = l;
        return 0;
}

Listener *listener_free(Listener *l) {
        if (!l)
                return NULL;
        if (l->fd >= 0 && l->path)
                (void) unlink(l->path);
        safe_close(l->fd);
        /* The lock file stays: unlinking it would let a starting daemon lock an orphaned inode
         * while a third one creates a fresh file and locks that too. */
        safe_close(l->lock_fd);
        free(l->path);
        free(l->lock_path);
        free(l->inodes);
        return mfree(l);
}

int listener_fd(const Listener *l) {
        return l->fd;
}

static int inode_cmp(const void *a, const void *b) {
        ino_t x = *(const ino_t *) a, y = *(const ino_t *) b;
        return x < y ? -1 : x > y;
}

/* Drops the inodes of connections gRPC has closed since. */
static void listener_prune(Listener *l) {
        _cleanup_free_ ino_t *live = NULL;
        size_t n_live = 0, allocated = 0;
        DIR *d;

        d = opendir("/proc/self/fd");
        if (!d)
                return;
        for (struct dirent *de; (de = readdir(d));) {
                char link[64];
                unsigned long long ino;
                ssize_t n = readlinkat(dirfd(d), de->d_name, link, sizeof link - 1);
                if (n <= 0)
                        continue;
                link[n] = 0;
                if (sscanf(link, "socket:[%llu]", &ino) != 1)
                        continue;
                if (!GREEDY_REALLOC(live, allocated, n_live + 1))
                        break;
                live[n_live++] = (ino_t) ino;
        }
        closedir(d);

        qsort(live, n_live, sizeof(ino_t), inode_cmp);
        size_t kept = 0;
        for (size_t i = 0; i < l->n_inodes; i++)
                if (bsearch(&l->inodes[i], live, n_live, sizeof(ino_t), inode_cmp))
                        l->inodes[kept++] = l->inodes[i];
        l->n_inodes = kept;
}

int listener_accept(Listener *l, int *ret_fd) {
        _cleanup_close_ int fd = -1;
        struct stat st;

        fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
                return errno == EAGAIN || errno == EINTR || errno == ECONNABORTED ? -EAGAIN
                                                                                   : -errno;

        if (l->n_inodes >= l->max_connections)
                listener_prune(l);
        if (l->n_inodes >= l->max_connections) {
                log_warning("Refusing a connection: %u connections are open, the limit "
                            "(--max-connections)",
                            l->max_connections);
                return -EDQUOT;
        }

        if (fstat(fd, &st) < 0)
                return -errno;
        if (!GREEDY_REALLOC(l->inodes, l->allocated, l->n_inodes + 1))
                return -ENOMEM;
        l->inodes[l->n_inodes++] = st.st_ino;

        *ret_fd = TAKE_FD(fd);
        return 0;
}

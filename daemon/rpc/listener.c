/* listener.c: the API socket, accepted by the daemon's own loop so it can cap connections. */

/*
 * DESIGN: gRPC owns a connection once it has its fd and never says when it closes it. To count
 * live connections without holding a second reference to each socket (which would keep it open
 * after gRPC closes it), the listener remembers each accepted socket's inode and its client's pid
 * and, only when a cap is reached, prunes the ones no longer open in /proc/self/fd.
 *
 * The loop watches the listening socket level-triggered: a connection left in the queue wakes
 * it again at once. So every connection taken off the queue is either handed on or closed, and
 * when the process is out of descriptors a reserve descriptor is given up to accept and close
 * the pending one (the classic reserve-fd trick). Refusals are logged at most once per episode
 * or interval, never once per connection.
 *
 * A connection over a cap (--max-connections, per process, per uid) is not closed bare, which a
 * client reports only as "Socket closed": it is handed to gRPC marked with its refusal, its
 * first call is answered RESOURCE_EXHAUSTED with the reason (rpc/call.c), and then it is closed.
 * At most LISTENER_MAX_REFUSING such connections are open at once; past that, or when the
 * process is out of descriptors, a connection over a cap is closed bare.
 */

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "listener.h"
#include "common/log.h"

/* Refusal lines for one cause: at most one per interval, with a count of those left out. */
#define LISTENER_LOG_INTERVAL_NSEC (10ull * 1000000000ull)

typedef struct LogLimit {
        unsigned long long last_nsec; /* 0: nothing logged yet */
        unsigned suppressed;
} LogLimit;

typedef struct Connection {
        ino_t inode;
        pid_t pid; /* 0: unknown (not a Unix socket, or the client is outside our pid namespace) */
        uid_t uid; /* (uid_t) -1: unknown */
        bool refusing; /* over a cap: answers its first call with the refusal, then closes */
} Connection;

struct Listener {
        int fd;
        int lock_fd;
        int reserve_fd; /* /dev/null, given up to shed a connection when out of descriptors */
        char *path;
        char *lock_path;
        ListenerLimits limits;
        Connection *conns; /* accepted sockets, live or since closed by gRPC */
        size_t n_conns;
        size_t n_refusing; /* of them, marked with a refusal */
        size_t allocated;
        bool out_of_fds;   /* an episode of EMFILE/ENFILE is under way (logged once) */
        unsigned n_shed;   /* connections closed during it */
        LogLimit log_cap;  /* --max-connections refusals */
        LogLimit log_peer; /* --max-connections-per-process refusals */
        LogLimit log_uid;  /* --max-connections-per-uid refusals */
};

static Listener *listener_alloc(const ListenerLimits *limits) {
        Listener *l = calloc(1, sizeof *l);
        if (!l)
                return NULL;
        l->fd = l->lock_fd = -1;
        l->limits = *limits;
        if (l->limits.max_per_uid == 0)
                l->limits.max_per_uid = MAX(l->limits.max_connections / 2, 1u);
        /* Failure is not fatal: listener_accept tries again, and copes without one. */
        l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC | O_NOCTTY);
        return l;
}

/*
 * Takes path.lock (flock), so that a second daemon refuses to start instead of stealing the
 * socket. -EBUSY, logged, when another daemon holds it; then l->lock_path is dropped, so that
 * freeing l does not touch the other daemon's files.
 */
static int listener_lock(Listener *l, const char *path) {
        if (asprintf(&l->lock_path, "%s.lock", path) < 0) {
                l->lock_path = NULL;
                return -ENOMEM;
        }
        l->lock_fd = open(l->lock_path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOCTTY, 0600);
        if (l->lock_fd < 0)
                return log_error_errno(-errno, "Failed to open lock file %s: %m", l->lock_path);
        if (flock(l->lock_fd, LOCK_EX | LOCK_NB) < 0) {
                int r = -errno;
                if (r == -EWOULDBLOCK) {
                        l->lock_path = mfree(l->lock_path);
                        return log_error_errno(-EBUSY,
                                               "Another familyd is serving %s (it holds %s.lock), "
                                               "refusing to start",
                                               path, path);
                }
                return log_error_errno(r, "Failed to lock %s: %m", l->lock_path);
        }
        return 0;
}

int listener_new(const char *path, const ListenerLimits *limits, Listener **ret) {
        _cleanup_(listener_freep) Listener *l = NULL;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int r;

        if (strlen(path) >= sizeof sa.sun_path)
                return log_error_errno(-ENAMETOOLONG, "Socket path %s is too long", path);
        memcpy(sa.sun_path, path, strlen(path));

        l = listener_alloc(limits);
        if (!l)
                return -ENOMEM;

        r = listener_lock(l, path);
        if (r < 0)
                return r;

        l->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (l->fd < 0)
                return log_error_errno(-errno, "Failed to create a socket: %m");

        /* We hold the lock, so whatever is at path is a stale socket of a dead daemon. */
        (void) unlink(path);
        if (bind(l->fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                return log_error_errno(-errno, "Failed to bind %s: %m", path);
        /* Bound: ours to remove from here on. */
        l->path = strdup(path);
        if (!l->path)
                return -ENOMEM;
        if (chmod(path, 0660) < 0)
                return log_error_errno(-errno, "Failed to set the mode of %s: %m", path);
        if (listen(l->fd, SOMAXCONN) < 0)
                return log_error_errno(-errno, "Failed to listen on %s: %m", path);

        *ret = TAKE_PTR(l);
        return 0;
}

int listener_adopt(int fd, const ListenerLimits *limits, Listener **ret) {
        _cleanup_(listener_freep) Listener *l = NULL;
        struct sockaddr_un sa = {};
        socklen_t len = sizeof sa;
        int r;

        l = listener_alloc(limits);
        if (!l) {
                safe_close(fd);
                return -ENOMEM;
        }
        l->fd = fd; /* l->path stays NULL: the socket file belongs to the service manager */

        /* The lock keeps a familyd started by hand on the same path from unlinking the
         * manager's socket. A directory we cannot write only costs that protection. */
        if (getsockname(fd, (struct sockaddr *) &sa, &len) == 0 && sa.sun_family == AF_UNIX &&
            len > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] != 0) {
                char path[sizeof sa.sun_path + 1] = {};
                memcpy(path, sa.sun_path, MIN((size_t) len - offsetof(struct sockaddr_un, sun_path),
                                              sizeof sa.sun_path));
                r = listener_lock(l, path);
                if (r == -EBUSY || r == -ENOMEM)
                        return r;
                if (r < 0) {
                        log_warning_errno(r, "Serving %s without its lock file, ignoring.", path);
                        l->lock_fd = safe_close(l->lock_fd);
                        l->lock_path = mfree(l->lock_path);
                }
        }

        *ret = TAKE_PTR(l);
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
        safe_close(l->reserve_fd);
        free(l->path);
        free(l->lock_path);
        free(l->conns);
        return mfree(l);
}

int listener_fd(const Listener *l) {
        return l->fd;
}

static unsigned long long now_nsec(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (unsigned long long) ts.tv_sec * 1000000000ull + (unsigned long long) ts.tv_nsec;
}

/* True when a line may be logged now, with *ret_suppressed the lines left out since the last. */
static bool log_limit_test(LogLimit *ll, unsigned *ret_suppressed) {
        unsigned long long now = now_nsec();

        if (ll->last_nsec != 0 && now - ll->last_nsec < LISTENER_LOG_INTERVAL_NSEC) {
                ll->suppressed++;
                return false;
        }
        ll->last_nsec = now ? now : 1;
        *ret_suppressed = ll->suppressed;
        ll->suppressed = 0;
        return true;
}

static int inode_cmp(const void *a, const void *b) {
        ino_t x = *(const ino_t *) a, y = *(const ino_t *) b;
        return x < y ? -1 : x > y;
}

/* Drops the connections gRPC has closed since. */
static void listener_prune(Listener *l) {
        _cleanup_free_ ino_t *live = NULL;
        size_t n_live = 0, allocated = 0;
        DIR *d;

        /* Out of descriptors, opendir fails and the stale entries stay: a cap errs on the side
         * of refusing until descriptors are free again. */
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
        size_t kept = 0, refusing = 0;
        for (size_t i = 0; i < l->n_conns; i++)
                if (bsearch(&l->conns[i].inode, live, n_live, sizeof(ino_t), inode_cmp)) {
                        refusing += l->conns[i].refusing;
                        l->conns[kept++] = l->conns[i];
                }
        l->n_conns = kept;
        l->n_refusing = refusing;
}

/* Connections served (not refusing) in all. */
static unsigned listener_count_served(const Listener *l) {
        return (unsigned) (l->n_conns - l->n_refusing);
}

static unsigned listener_count_peer(const Listener *l, pid_t pid) {
        unsigned n = 0;
        for (size_t i = 0; i < l->n_conns; i++)
                n += !l->conns[i].refusing && l->conns[i].pid == pid;
        return n;
}

static unsigned listener_count_uid(const Listener *l, uid_t uid) {
        unsigned n = 0;
        for (size_t i = 0; i < l->n_conns; i++)
                n += !l->conns[i].refusing && l->conns[i].uid == uid;
        return n;
}

static bool listener_peer_at_cap(const Listener *l, pid_t pid) {
        /* Peers whose pid we cannot see share pid 0: capping them together would let one
         * container lock out every other, so only --max-connections bounds them. */
        return pid > 0 && listener_count_peer(l, pid) >= l->limits.max_per_peer;
}

static bool listener_uid_at_cap(const Listener *l, uid_t uid) {
        return uid != (uid_t) -1 && listener_count_uid(l, uid) >= l->limits.max_per_uid;
}

/* The cap a connection from pid/uid is over, if any. */
static RpcRefusal listener_check_caps(const Listener *l, pid_t pid, uid_t uid) {
        if (listener_count_served(l) >= l->limits.max_connections)
                return (RpcRefusal) { RPC_REFUSAL_CONNECTIONS, l->limits.max_connections };
        if (listener_peer_at_cap(l, pid))
                return (RpcRefusal) { RPC_REFUSAL_PEER, l->limits.max_per_peer };
        if (listener_uid_at_cap(l, uid))
                return (RpcRefusal) { RPC_REFUSAL_UID, l->limits.max_per_uid };
        return (RpcRefusal) {};
}

/* One line per cause and interval. */
static void listener_log_refusal(Listener *l, const RpcRefusal *refusal, pid_t pid, uid_t uid) {
        unsigned suppressed;

        switch (refusal->kind) {
        case RPC_REFUSAL_CONNECTIONS:
                if (log_limit_test(&l->log_cap, &suppressed))
                        log_warning("Refusing a connection: %u connections are open, the limit "
                                    "(--max-connections); %u more refused since the last "
                                    "message",
                                    refusal->limit, suppressed);
                break;
        case RPC_REFUSAL_PEER:
                if (log_limit_test(&l->log_peer, &suppressed))
                        log_warning("Refusing a connection from pid %d: it has %u connections "
                                    "open, the limit (--max-connections-per-process); %u more "
                                    "refused since the last message",
                                    (int) pid, refusal->limit, suppressed);
                break;
        case RPC_REFUSAL_UID:
                if (log_limit_test(&l->log_uid, &suppressed))
                        log_warning("Refusing a connection from uid %u: it has %u connections "
                                    "open, the limit (--max-connections-per-uid); %u more "
                                    "refused since the last message",
                                    (unsigned) uid, refusal->limit, suppressed);
                break;
        default:
                break;
        }
}

/*
 * Out of descriptors with a connection waiting: left in the queue, it would wake the
 * level-triggered loop again at once. Give up the reserve descriptor to accept it and close it,
 * so the client learns at once instead of hanging, then take the reserve back.
 */
static int listener_shed(Listener *l, int error) {
        int fd;

        if (!l->out_of_fds) {
                log_warning_errno(error, "Out of file descriptors accepting API connections (%m), "
                                         "closing new connections until some are free again");
                l->out_of_fds = true;
                l->n_shed = 0;
        }
        if (l->reserve_fd < 0)
                return error;

        l->reserve_fd = safe_close(l->reserve_fd);
        fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        int r = fd < 0 ? -errno : 0;
        safe_close(fd);
        l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC | O_NOCTTY);

        if (r == -EAGAIN || r == -EINTR || r == -ECONNABORTED)
                return -EAGAIN;
        if (r < 0)
                /* Another thread took the freed descriptor first: the caller backs off. */
                return error;
        l->n_shed++;
        return -EDQUOT;
}

int listener_accept(Listener *l, int *ret_fd, RpcRefusal *ret_refusal) {
        _cleanup_close_ int fd = -1;
        struct ucred cred = { .uid = (uid_t) -1 };
        socklen_t len = sizeof cred;
        struct stat st;

        if (l->reserve_fd < 0)
                l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC | O_NOCTTY);

        fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
                int r = -errno;
                if (r == -EAGAIN || r == -EINTR || r == -ECONNABORTED)
                        return -EAGAIN;
                if (r == -EMFILE || r == -ENFILE)
                        return listener_shed(l, r);
                return r;
        }

        if (l->out_of_fds) {
                log_info("Accepting API connections again (%u closed while out of file "
                         "descriptors).",
                         l->n_shed);
                l->out_of_fds = false;
        }

        if (fstat(fd, &st) < 0)
                return -errno;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                cred = (struct ucred) { .uid = (uid_t) -1 };

        RpcRefusal refusal = listener_check_caps(l, cred.pid, cred.uid);
        if (refusal.kind != RPC_REFUSAL_NONE) {
                /* Stale entries may hold the cap: count again what gRPC still has open. */
                listener_prune(l);
                refusal = listener_check_caps(l, cred.pid, cred.uid);
        }
        if (refusal.kind != RPC_REFUSAL_NONE) {
                listener_log_refusal(l, &refusal, cred.pid, cred.uid);
                if (l->n_refusing >= LISTENER_MAX_REFUSING)
                        return -EDQUOT;
        }

        if (!GREEDY_REALLOC(l->conns, l->allocated, l->n_conns + 1))
                return -ENOMEM;
        l->conns[l->n_conns++] = (Connection) {
                .inode = st.st_ino,
                .pid = cred.pid,
                .uid = cred.uid,
                .refusing = refusal.kind != RPC_REFUSAL_NONE,
        };
        l->n_refusing += refusal.kind != RPC_REFUSAL_NONE;

        *ret_refusal = refusal;
        *ret_fd = TAKE_FD(fd);
        return 0;
}

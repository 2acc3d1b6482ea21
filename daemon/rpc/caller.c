/* caller.c: each API connection's credentials, refusal and queued reply bytes, from accept on. */

/*
 * DESIGN: gRPC names a call's connection only by "fd:N", and descriptor numbers are reused as
 * soon as gRPC closes a connection. So the credentials are read once, when the main loop
 * accepts the socket and before gRPC has it, and filed under N together with the socket's
 * inode: a lookup answers only for the same socket (same inode at N), and a new connection
 * given N replaces the entry of the closed one, so a reused number never carries the old
 * client's credentials. gRPC keeps N open while a call on it lives, so a call's lookup finds its
 * own connection. The table is indexed by descriptor number: bounded by the open-file limit,
 * nothing to prune.
 *
 * Each entry points to an RpcConnection that the calls on it also hold: the bytes of replies
 * handed to gRPC are counted there and in the table's total from when they are packed until
 * gRPC frees them (rpc/call.c gives each reply a slice whose destructor gives the bytes back),
 * even after a new connection took the number: gRPC completes a send once it has framed the
 * bytes, which for a client that opens a wide window and never reads is long before they leave.
 * A client that stops reading thus holds at most the per-connection bound. When the total falls back to zero
 * after a large episode, the freed heap is returned to the system (malloc_trim): glibc keeps
 * it otherwise, measured with the test client-memory.
 *
 * SO_PEERCRED carries only the primary group; --admin-group is also checked against the
 * supplementary groups (SO_PEERGROUPS), once at accept: a call reads no group list.
 */

#include <malloc.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "caller.h"
#include "common/log.h"
#include "common/macro.h"
#include "handout/socket-cred.h"

/* A total this large since the last trim is worth returning once nothing waits. */
#define CALLER_TRIM_AFTER_BYTES (8ull << 20)

struct RpcConnection {
        atomic_uint n_ref;
        ino_t inode;
        dev_t dev;
        RpcCaller caller;
        RpcRefusal refusal;
        uint64_t queued; /* under the table's lock */
};

typedef struct CallerEntry {
        RpcConnection *conn; /* NULL: nothing filed */
} CallerEntry;

struct CallerTable {
        atomic_uint n_ref;
        pthread_mutex_t lock;
        gid_t admin_gid;
        CallerQueueLimits limits;
        uint64_t queued; /* over all connections */
        uint64_t peak;   /* the largest total since the last trim */
        CallerEntry *entries; /* by descriptor number */
        size_t n_entries;
};

int caller_table_new(gid_t admin_gid, const CallerQueueLimits *limits, CallerTable **ret) {
        CallerTable *t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->n_ref = 1;
        t->admin_gid = admin_gid;
        t->limits = *limits;
        (void) pthread_mutex_init(&t->lock, NULL);
        *ret = t;
        return 0;
}

RpcConnection *rpc_connection_ref(RpcConnection *c) {
        if (c)
                atomic_fetch_add(&c->n_ref, 1);
        return c;
}

RpcConnection *rpc_connection_unref(RpcConnection *c) {
        if (c && atomic_fetch_sub(&c->n_ref, 1) == 1)
                free(c);
        return NULL;
}

CallerTable *caller_table_ref(CallerTable *t) {
        if (t)
                atomic_fetch_add(&t->n_ref, 1);
        return t;
}

CallerTable *caller_table_unref(CallerTable *t) {
        if (!t || atomic_fetch_sub(&t->n_ref, 1) != 1)
                return NULL;
        (void) pthread_mutex_destroy(&t->lock);
        for (size_t i = 0; i < t->n_entries; i++)
                rpc_connection_unref(t->entries[i].conn);
        free(t->entries);
        return mfree(t);
}

static int caller_table_grow(CallerTable *t, int fd) {
        if ((size_t) fd < t->n_entries)
                return 0;
        size_t n = MAX((size_t) fd + 1, 2 * t->n_entries);
        CallerEntry *e = realloc(t->entries, n * sizeof *e);
        if (!e)
                return -ENOMEM;
        memset(e + t->n_entries, 0, (n - t->n_entries) * sizeof *e);
        t->entries = e;
        t->n_entries = n;
        return 0;
}

int caller_table_add(CallerTable *t, int fd, const RpcRefusal *refusal) {
        struct ucred cred = {};
        socklen_t len = sizeof cred;
        struct stat st;
        RpcConnection *c;
        int r;

        if (fd < 0)
                return -EBADF;
        if (fstat(fd, &st) < 0)
                return -errno;
        /* A caller in another pid namespace shows pid 0: known by uid, not as a process. */
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                return -errno;
        c = calloc(1, sizeof *c);
        if (!c)
                return -ENOMEM;
        *c = (RpcConnection) {
                .n_ref = 1,
                .inode = st.st_ino,
                .dev = st.st_dev,
                .caller = { .pid = cred.pid,
                            .uid = cred.uid,
                            .gid = cred.gid,
                            .admin = socket_cred_is_admin(fd, &cred, t->admin_gid) },
                .refusal = refusal ? *refusal : (RpcRefusal) {},
        };

        (void) pthread_mutex_lock(&t->lock);
        r = caller_table_grow(t, fd);
        if (r >= 0) {
                rpc_connection_unref(t->entries[fd].conn);
                t->entries[fd].conn = c;
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0)
                free(c);
        return r;
}

RpcConnection *caller_table_connection(CallerTable *t, int fd) {
        RpcConnection *c = NULL;
        struct stat st;

        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
                return NULL;
        (void) pthread_mutex_lock(&t->lock);
        if ((size_t) fd < t->n_entries && t->entries[fd].conn &&
            t->entries[fd].conn->inode == st.st_ino && t->entries[fd].conn->dev == st.st_dev) {
                c = t->entries[fd].conn;
                atomic_fetch_add(&c->n_ref, 1);
        }
        (void) pthread_mutex_unlock(&t->lock);
        return c;
}

int caller_table_find(CallerTable *t, int fd, RpcCaller *ret) {
        RpcConnection *c = caller_table_connection(t, fd);

        if (!c)
                return -ENOTCONN;
        *ret = c->caller;
        rpc_connection_unref(c);
        return 0;
}

const RpcCaller *rpc_connection_caller(const RpcConnection *c) {
        return &c->caller;
}

const RpcRefusal *rpc_connection_refusal(const RpcConnection *c) {
        return &c->refusal;
}

bool rpc_connection_is_fd(const RpcConnection *c, int fd) {
        struct stat st;
        return fd >= 0 && fstat(fd, &st) >= 0 && st.st_ino == c->inode && st.st_dev == c->dev;
}

int caller_table_queue(CallerTable *t, RpcConnection *c, size_t size, uint64_t *ret_queued,
                       uint64_t *ret_limit) {
        int r = 0;

        (void) pthread_mutex_lock(&t->lock);
        if (c && c->queued + size > t->limits.per_connection) {
                *ret_queued = c->queued;
                *ret_limit = t->limits.per_connection;
                r = CALLER_QUEUE_CONNECTION_FULL;
        } else if (t->queued + size > t->limits.total) {
                *ret_queued = t->queued;
                *ret_limit = t->limits.total;
                r = CALLER_QUEUE_TOTAL_FULL;
        } else {
                if (c)
                        c->queued += size;
                t->queued += size;
                t->peak = MAX(t->peak, t->queued);
        }
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

void caller_table_unqueue(CallerTable *t, RpcConnection *c, size_t size) {
        bool trim = false;

        (void) pthread_mutex_lock(&t->lock);
        if (c)
                c->queued -= MIN(c->queued, (uint64_t) size);
        t->queued -= MIN(t->queued, (uint64_t) size);
        if (t->queued == 0 && t->peak >= CALLER_TRIM_AFTER_BYTES) {
                t->peak = 0;
                trim = true;
        }
        (void) pthread_mutex_unlock(&t->lock);
        if (trim) {
                /* The replies' buffers were freed just now, by gRPC and by our calls. */
                int released = malloc_trim(0);
                log_debug("Reply queue empty again: heap trimmed (%s).",
                          released ? "memory returned" : "nothing to return");
        }
}

unsigned caller_table_shutdown_all(CallerTable *t) {
        unsigned n = 0;

        (void) pthread_mutex_lock(&t->lock);
        for (size_t fd = 0; fd < t->n_entries; fd++) {
                RpcConnection *c = t->entries[fd].conn;

                /* A number gRPC closed and something else reused holds another inode. */
                if (c && rpc_connection_is_fd(c, (int) fd) && shutdown((int) fd, SHUT_RDWR) >= 0)
                        n++;
        }
        (void) pthread_mutex_unlock(&t->lock);
        return n;
}

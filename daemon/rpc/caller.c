/* caller.c: the credentials of each API connection, taken at accept and found by its call. */

/*
 * DESIGN: gRPC names a call's connection only by "fd:N", and descriptor numbers are reused as
 * soon as gRPC closes a connection. So the credentials are read once, when the main loop
 * accepts the socket and before gRPC has it, and filed under N together with the socket's
 * inode: a lookup answers only for the same socket (same inode at N), and a new connection
 * given N replaces the entry of the closed one, so a reused number never carries the old
 * peer's credentials. gRPC keeps N open while a call on it lives, so a call's lookup finds its
 * own connection. The table is indexed by descriptor number: bounded by the open-file limit,
 * nothing to prune.
 *
 * SO_PEERCRED carries only the primary group; --admin-group is also checked against the
 * supplementary groups (SO_PEERGROUPS), once at accept: a call reads no group list.
 */

#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "caller.h"
#include "common/macro.h"
#include "shm/peer-cred.h"

typedef struct CallerEntry {
        ino_t inode; /* 0: nothing filed */
        dev_t dev;
        RpcCaller caller;
} CallerEntry;

struct CallerTable {
        pthread_mutex_t lock;
        gid_t admin_gid;
        CallerEntry *entries; /* by descriptor number */
        size_t n_entries;
};

int caller_table_new(gid_t admin_gid, CallerTable **ret) {
        CallerTable *t = calloc(1, sizeof *t);
        if (!t)
                return -ENOMEM;
        t->admin_gid = admin_gid;
        (void) pthread_mutex_init(&t->lock, NULL);
        *ret = t;
        return 0;
}

CallerTable *caller_table_free(CallerTable *t) {
        if (!t)
                return NULL;
        (void) pthread_mutex_destroy(&t->lock);
        free(t->entries);
        return mfree(t);
}

int caller_table_add(CallerTable *t, int fd) {
        struct ucred cred = {};
        socklen_t len = sizeof cred;
        struct stat st;
        int r = 0;

        if (fd < 0)
                return -EBADF;
        if (fstat(fd, &st) < 0)
                return -errno;
        /* A peer in another pid namespace shows pid 0: known by uid, not as a process. */
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
                return -errno;
        RpcCaller caller = {
                .pid = cred.pid,
                .uid = cred.uid,
                .gid = cred.gid,
                .admin = peer_cred_is_admin(fd, &cred, t->admin_gid),
        };

        (void) pthread_mutex_lock(&t->lock);
        if ((size_t) fd >= t->n_entries) {
                size_t n = MAX((size_t) fd + 1, 2 * t->n_entries);
                CallerEntry *e = realloc(t->entries, n * sizeof *e);
                if (e) {
                        memset(e + t->n_entries, 0, (n - t->n_entries) * sizeof *e);
                        t->entries = e;
                        t->n_entries = n;
                } else
                        r = -ENOMEM;
        }
        if (r >= 0)
                t->entries[fd] = (CallerEntry) { .inode = st.st_ino, .dev = st.st_dev,
                                                 .caller = caller };
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

int caller_table_find(CallerTable *t, int fd, RpcCaller *ret) {
        struct stat st;
        int r = -ENOTCONN;

        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode))
                return -ENOTCONN;
        (void) pthread_mutex_lock(&t->lock);
        if ((size_t) fd < t->n_entries && t->entries[fd].inode != 0 &&
            t->entries[fd].inode == st.st_ino && t->entries[fd].dev == st.st_dev) {
                *ret = t->entries[fd].caller;
                r = 0;
        }
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

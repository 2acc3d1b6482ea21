/* build-released.c: host shards of freed builds that clients still hold, outside --shm-budget. */

/*
 * DESIGN: a freed build's bytes leave --shm-budget at once, but a client that mapped a shard
 * (or keeps its descriptor) keeps the memfd's pages alive: the kernel frees them with the
 * last open file of the inode. The daemon cannot read other processes' mappings (that needs
 * ptrace rights over them), and a descriptor of its own would keep the pages alive by itself.
 * What it can ask the kernel is whether any open file of the inode other than its own is
 * left: a write lease (F_SETLEASE F_WRLCK) is granted only when the inode has no other file
 * open for reading or writing (its i_readcount and i_writecount are the lease-taker's own),
 * and a mapping holds its file open. So at the free, each own host segment of a read-only
 * build is reopened read-only (a file of its own, not a dup) and listed with its bytes; the
 * watcher thread (build-watch.c) probes the list once a second, as does every status read,
 * taking the lease and dropping it at once: granted, the entry goes and its descriptor is
 * closed, so the pages go when the clients' go, at most a second later.
 *
 * Not seen: a writable build's shards, handed out as dups of the memfd the daemon made; that
 * first file (memfd_create's) is not counted by the kernel in either count, so nothing tells
 * when its last holder goes. Such builds are left out, as GPU shards are (their memory is the
 * driver's). A file that refuses leases (another owner, leases off: fs.leases-enable 0) is
 * left out too. The list is bounded; it does not survive a restart.
 */

#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#include "build-private.h"
#include "common/log.h"

/* Segments followed at once; later ones are left out (logged once). */
#define BUILD_RELEASED_MAX 16384u

typedef struct ReleasedSegment {
        int fd;
        uint64_t bytes;
} ReleasedSegment;

struct BuildReleased {
        pthread_mutex_t lock;
        ReleasedSegment *list;
        size_t n, allocated;
        bool warned_full;
};

int build_released_new(BuildReleased **ret) {
        BuildReleased *r = calloc(1, sizeof *r);

        if (!r)
                return -ENOMEM;
        (void) pthread_mutex_init(&r->lock, NULL);
        *ret = r;
        return 0;
}

BuildReleased *build_released_free(BuildReleased *r) {
        if (!r)
                return NULL;
        for (size_t i = 0; i < r->n; i++)
                safe_close(r->list[i].fd);
        free(r->list);
        (void) pthread_mutex_destroy(&r->lock);
        return mfree(r);
}

/* Whether files other than fd are open on its inode: 1 yes, 0 no, negative: cannot tell. */
static int others_hold(int fd) {
        if (fcntl(fd, F_SETLEASE, F_WRLCK) >= 0) {
                (void) fcntl(fd, F_SETLEASE, F_UNLCK);
                return 0;
        }
        return errno == EAGAIN || errno == EBUSY ? 1 : -errno;
}

void build_released_add(BuildReleased *r, const BuildState *b) {
        char path[64];

        if (!r || b->writable)
                return;
        (void) pthread_mutex_lock(&r->lock);
        for (size_t i = 0; i < b->n_ranks; i++) {
                const BuildRankState *rs = &b->ranks[i];
                int fd;

                if (!rs->materialized || rs->replica || !rs->segment ||
                    !shard_segment_is_host(rs->segment))
                        continue;
                if (r->n >= BUILD_RELEASED_MAX) {
                        if (!r->warned_full)
                                log_warning("More than %u freed shards are still held by "
                                            "clients; later ones are left out of "
                                            "shm_released_bytes_held, ignoring.",
                                            BUILD_RELEASED_MAX);
                        r->warned_full = true;
                        break;
                }
                if (!GREEDY_REALLOC(r->list, r->allocated, r->n + 1))
                        break;
                (void) snprintf(path, sizeof path, "/proc/self/fd/%d",
                                shard_segment_fd(rs->segment));
                fd = open(path, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        continue;
                r->list[r->n++] = (ReleasedSegment) { .fd = fd,
                                                      .bytes = shard_segment_size(rs->segment) };
        }
        (void) pthread_mutex_unlock(&r->lock);
}

void build_released_sweep(BuildReleased *r, BuildReleasedUse *ret) {
        BuildReleasedUse use = {};

        if (r) {
                (void) pthread_mutex_lock(&r->lock);
                for (size_t i = 0; i < r->n;) {
                        if (others_hold(r->list[i].fd) > 0) {
                                use.segments++;
                                use.bytes += r->list[i].bytes;
                                i++;
                                continue;
                        }
                        /* Nobody else (or it cannot be told): let the pages go. */
                        safe_close(r->list[i].fd);
                        r->list[i] = r->list[--r->n];
                }
                if (r->n < BUILD_RELEASED_MAX)
                        r->warned_full = false;
                (void) pthread_mutex_unlock(&r->lock);
        }
        if (ret)
                *ret = use;
}

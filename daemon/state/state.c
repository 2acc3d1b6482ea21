/* state.c: the store's modes, names and fd store counts; keeping and letting go of records. */
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "common/log.h"
#include "state-private.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

static const char *const mode_table[_STATE_MODE_MAX] = {
        [STATE_MODE_NONE] = "none",
        [STATE_MODE_DIR] = "state-dir",
        [STATE_MODE_FDSTORE] = "fd-store",
};

const char *state_mode_to_string(StateMode m) {
        return m >= 0 && m < _STATE_MODE_MAX ? mode_table[m] : NULL;
}

int state_name_record(const char *id, char ret[static STATE_NAME_MAX]) {
        int k = snprintf(ret, STATE_NAME_MAX, STATE_PREFIX_RECORD "%s", id);
        return k < 0 || (size_t) k >= STATE_NAME_MAX ? -ENAMETOOLONG : 0;
}

int state_name_segment(const char *id, int64_t n, char ret[static STATE_NAME_MAX]) {
        int k = snprintf(ret, STATE_NAME_MAX, STATE_PREFIX_SEGMENT "%s-%" PRId64, id, n);
        return k < 0 || (size_t) k >= STATE_NAME_MAX ? -ENAMETOOLONG : 0;
}

/* ---- named descriptors ----------------------------------------------------------------- */

void state_fds_done(StateFds *l) {
        if (!l)
                return;
        for (size_t i = 0; i < l->n; i++) {
                free(l->items[i].name);
                safe_close(l->items[i].fd);
        }
        free(l->items);
        *l = (StateFds) {};
}

int state_fds_add(StateFds *l, const char *name, int fd) {
        char *copy = strdup(name);
        if (!copy || !GREEDY_REALLOC(l->items, l->allocated, l->n + 1)) {
                free(copy);
                safe_close(fd);
                return -ENOMEM;
        }
        l->items[l->n++] = (StateFd) { .name = copy, .fd = fd };
        return 0;
}

StateFd *state_fds_find(StateFds *l, const char *name) {
        for (size_t i = 0; i < l->n; i++)
                if (l->items[i].fd >= 0 && streq(l->items[i].name, name))
                        return &l->items[i];
        return NULL;
}

/* ---- the fd store ---------------------------------------------------------------------- */

static int fdstore_push(State *s, const char *name, int fd) {
        int r = s->fdstore_add ? s->fdstore_add(name, fd) : 0;
        if (r == 0)
                return -ENOTCONN; /* NOTIFY_SOCKET went away */
        return r < 0 ? r : 0;
}

static void fdstore_remove(State *s, const char *name) {
        int r = s->fdstore_remove ? s->fdstore_remove(name) : 0;
        if (r < 0)
                log_warning_errno(r, "Failed to remove %s from the fd store, ignoring: %m", name);
}

/* A sealed memfd holding data (the manager keeps it; nobody can change it). */
static int memfd_sealed(const char *name, const uint8_t *data, size_t size) {
        _cleanup_close_ int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING |
                                                            MFD_NOEXEC_SEAL);
        if (fd < 0 && errno == EINVAL)
                fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
                return -errno;
        for (size_t done = 0; done < size;) {
                ssize_t k = write(fd, data + done, size - done);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                done += (size_t) k;
        }
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0)
                return -errno;
        return TAKE_FD(fd);
}

/* ---- the state dir --------------------------------------------------------------------- */

static int dir_put(State *s, const char *name, const uint8_t *data, size_t size) {
        char tmp[STATE_NAME_MAX + sizeof STATE_TMP_SUFFIX];
        int r = 0;

        (void) snprintf(tmp, sizeof tmp, "%s" STATE_TMP_SUFFIX, name);
        _cleanup_close_ int fd = openat(s->dir_fd, tmp,
                                        O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW |
                                                O_NOCTTY,
                                        0600);
        if (fd < 0)
                return -errno;
        /* Allocated first: a full tmpfs fails here, not half way through the write. */
        if (size > 0 && fallocate(fd, 0, 0, (off_t) size) < 0 && errno != EOPNOTSUPP)
                r = -errno;
        for (size_t done = 0; r >= 0 && done < size;) {
                ssize_t k = write(fd, data + done, size - done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        r = -errno;
                else
                        done += (size_t) k;
        }
        /* No fsync: a tmpfs has no disk to reach, and rename is atomic for readers. */
        if (r >= 0 && renameat(s->dir_fd, tmp, s->dir_fd, name) < 0)
                r = -errno;
        if (r < 0)
                (void) unlinkat(s->dir_fd, tmp, 0);
        return r;
}

/* A record under name: a state dir file (temp file, then rename) or a sealed memfd in the fd
 * store. */
int state_put_record(State *s, const char *name, const uint8_t *data, size_t size) {
        if (s->mode == STATE_MODE_DIR)
                return dir_put(s, name, data, size);

        _cleanup_close_ int fd = memfd_sealed(name, data, size);
        if (fd < 0)
                return fd;
        return fdstore_push(s, name, fd);
}

void state_drop(State *s, const char *name) {
        if (!s)
                return;
        if (s->mode == STATE_MODE_DIR) {
                if (unlinkat(s->dir_fd, name, 0) < 0 && errno != ENOENT)
                        log_warning_errno(-errno, "Failed to remove %s/%s, ignoring: %m", s->dir,
                                          name);
        } else if (s->mode == STATE_MODE_FDSTORE)
                fdstore_remove(s, name);
}

/* ---- counts ---------------------------------------------------------------------------- */

int state_reserve(State *s, size_t n, const char *what, FamilyError *ret_error) {
        int r = 0;

        if (!s || s->mode != STATE_MODE_FDSTORE)
                return 0;
        (void) pthread_mutex_lock(&s->lock);
        size_t held = s->fd_used + s->fd_reserved;
        if (n > s->fd_max || held > s->fd_max - n)
                r = family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "FDSTORE_LIMIT",
                                     NULL,
                                     "fd store limit reached: %s needs %zu descriptor%s, %zu of "
                                     "%zu kept (--fdstore-max)",
                                     what, n, n == 1 ? "" : "s", held, s->fd_max);
        else
                s->fd_reserved += n;
        (void) pthread_mutex_unlock(&s->lock);
        return r;
}

void state_unreserve(State *s, size_t n) {
        if (!s || s->mode != STATE_MODE_FDSTORE)
                return;
        (void) pthread_mutex_lock(&s->lock);
        s->fd_reserved -= MIN(n, s->fd_reserved);
        (void) pthread_mutex_unlock(&s->lock);
}

/* A reservation (or, at start, nothing) becomes use. */
void state_fd_commit(State *s, size_t n) {
        if (!s || s->mode != STATE_MODE_FDSTORE)
                return;
        (void) pthread_mutex_lock(&s->lock);
        s->fd_reserved -= MIN(n, s->fd_reserved);
        s->fd_used += n;
        (void) pthread_mutex_unlock(&s->lock);
}

void state_adopt(State *s, size_t n) {
        state_fd_commit(s, n);
}

void state_fd_release(State *s, size_t n) {
        if (!s || s->mode != STATE_MODE_FDSTORE)
                return;
        (void) pthread_mutex_lock(&s->lock);
        s->fd_used -= MIN(n, s->fd_used);
        (void) pthread_mutex_unlock(&s->lock);
}

void state_fd_counts(State *s, size_t *ret_used, size_t *ret_max) {
        size_t used = 0, max = 0;

        if (s && s->mode == STATE_MODE_FDSTORE) {
                (void) pthread_mutex_lock(&s->lock);
                used = s->fd_used;
                max = s->fd_max;
                (void) pthread_mutex_unlock(&s->lock);
        }
        *ret_used = used;
        *ret_max = max;
}

/* ---- keeping --------------------------------------------------------------------------- */

/* From now on a record may be replaced beside id; without memory it may not (its replaces are
 * refused, and logged by their owner). */
static void replaced_register(State *s, const char *id) {
        (void) pthread_mutex_lock(&s->replace_lock);
        if (!state_replaced_find(s, id))
                (void) state_replaced_add(s, id);
        (void) pthread_mutex_unlock(&s->replace_lock);
}

/* The record replaced beside id goes with it, and no replace may bring it back. */
static void replaced_forget(State *s, const char *id) {
        char name[STATE_NAME_MAX];

        (void) pthread_mutex_lock(&s->replace_lock);
        StateReplaced *e = state_replaced_find(s, id);
        if (e) {
                if (e->stored && state_name_replaced(id, s->mode == STATE_MODE_FDSTORE ?
                                                                 e->generation : 0,
                                                     name) >= 0) {
                        state_drop(s, name);
                        state_fd_release(s, 1);
                }
                free(e->id);
                *e = s->replaced[--s->n_replaced];
        }
        (void) pthread_mutex_unlock(&s->replace_lock);
}

int state_keep(State *s, const char *id, const uint8_t *record, size_t size,
               const StateFd *fds, size_t n_fds) {
        char meta[STATE_NAME_MAX];
        size_t pushed = 0;
        int r;

        if (!s || s->mode == STATE_MODE_NONE)
                return 0;
        r = state_name_record(id, meta);
        if (r < 0)
                return r;

        /* The state dir's descriptors are its files already. */
        if (s->mode == STATE_MODE_DIR) {
                r = state_put_record(s, meta, record, size);
                if (r >= 0)
                        replaced_register(s, id);
                return r;
        }

        for (; r >= 0 && pushed < n_fds; pushed++) {
                r = fdstore_push(s, fds[pushed].name, fds[pushed].fd);
                if (r < 0)
                        break;
        }
        if (r >= 0)
                r = state_put_record(s, meta, record, size);
        if (r < 0) {
                for (size_t i = 0; i < pushed; i++)
                        fdstore_remove(s, fds[i].name);
                return r;
        }
        state_fd_commit(s, n_fds + 1);
        replaced_register(s, id);
        return 0;
}

void state_forget(State *s, const char *id, size_t n_fds) {
        char meta[STATE_NAME_MAX];

        if (!s || s->mode == STATE_MODE_NONE)
                return;
        replaced_forget(s, id);
        if (state_name_record(id, meta) >= 0)
                state_drop(s, meta);
        state_fd_release(s, n_fds + 1);
}

void state_discard(State *s, const char *name) {
        /* Only files exist before the record is kept (the fd store gets nothing until then). */
        if (s && s->mode == STATE_MODE_DIR)
                state_drop(s, name);
}

/* ---- start ----------------------------------------------------------------------------- */

static const char *fs_name(long type, char *buf, size_t size) {
        switch ((unsigned long) type) {
        case EXT4_SUPER_MAGIC:
                return "ext2/ext3/ext4";
        case XFS_SUPER_MAGIC:
                return "xfs";
        case BTRFS_SUPER_MAGIC:
                return "btrfs";
        case OVERLAYFS_SUPER_MAGIC:
                return "overlayfs";
        case NFS_SUPER_MAGIC:
                return "nfs";
        default:
                (void) snprintf(buf, size, "a file system of type 0x%lx", (unsigned long) type);
                return buf;
        }
}

/* 1: ready; 0: not a tmpfs or ramfs (said, mode none); < 0: a start failure (logged). */
static int dir_open(State *s, const char *path) {
        struct statfs sf;
        char buf[48];

        if (mkdir(path, 0700) < 0 && errno != EEXIST)
                return log_error_errno(-errno, "Failed to create the state dir %s: %m", path);
        _cleanup_close_ int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(-errno, "Failed to open the state dir %s: %m", path);
        if (fstatfs(fd, &sf) < 0)
                return log_error_errno(-errno, "Failed to examine the state dir %s: %m", path);
        if ((unsigned long) sf.f_type != TMPFS_MAGIC && (unsigned long) sf.f_type != RAMFS_MAGIC) {
                log_warning("--state-dir %s is on %s, not a tmpfs or ramfs: shards kept there "
                            "would be written to disk. Nothing is kept across restarts; use a "
                            "directory on a tmpfs (under /run or /dev/shm).",
                            path, fs_name((long) sf.f_type, buf, sizeof buf));
                return 0;
        }
        /* Taking over the kept state drops what no record names: two daemons on one dir would
         * delete each other's shards. */
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                if (errno == EWOULDBLOCK)
                        return log_error_errno(-EBUSY, "Another familyd uses the state dir %s, "
                                                       "refusing to start.",
                                               path);
                return log_error_errno(-errno, "Failed to lock the state dir %s: %m", path);
        }
        s->dir = strdup(path);
        if (!s->dir)
                return log_error_errno(-ENOMEM, "Out of memory.");
        s->dir_fd = TAKE_FD(fd);
        return 1;
}

/* The fd store's size from the manager itself ($FDSTORE, systemd 254 and later). */
static size_t fdstore_max_of(unsigned configured) {
        size_t max = configured > 0 ? configured : STATE_FDSTORE_MAX_DEFAULT;
        const char *e = getenv("FDSTORE");
        unsigned long v;
        char *end;

        if (isempty(e))
                return max;
        errno = 0;
        v = strtoul(e, &end, 10);
        if (errno != 0 || *end != 0)
                return max;
        if (v < max) {
                log_warning("The service manager keeps at most %lu descriptors "
                            "(FileDescriptorStoreMax=), fewer than --fdstore-max %zu: using %lu.",
                            v, max, v);
                return v;
        }
        return max;
}

int state_new(StateParams *p, State **ret) {
        _cleanup_(state_freep) State *s = NULL;
        int r;

        s = calloc(1, sizeof *s);
        if (!s) {
                state_fds_done(&p->records);
                state_fds_done(&p->segments);
                return log_error_errno(-ENOMEM, "Out of memory.");
        }
        (void) pthread_mutex_init(&s->lock, NULL);
        (void) pthread_mutex_init(&s->replace_lock, NULL);
        s->dir_fd = -1;
        s->records = p->records;
        s->segments = p->segments;
        p->records = p->segments = (StateFds) {};
        s->fdstore_add = p->fdstore_add;
        s->fdstore_remove = p->fdstore_remove;

        if (p->under_manager) {
                s->mode = STATE_MODE_FDSTORE;
                s->fd_max = fdstore_max_of(p->fdstore_max);
                if (p->state_dir)
                        log_info("Under a service manager: builds are kept in its fd store "
                                 "(at most %zu descriptors), --state-dir %s is not used.",
                                 s->fd_max, p->state_dir);
                else
                        log_info("Under a service manager: builds are kept in its fd store "
                                 "(at most %zu descriptors).",
                                 s->fd_max);
        } else if (p->state_dir) {
                r = dir_open(s, p->state_dir);
                if (r < 0)
                        return r;
                s->mode = r > 0 ? STATE_MODE_DIR : STATE_MODE_NONE;
                if (r > 0)
                        log_info("Builds are kept in the state dir %s; its shards are handed "
                                 "out read-only.",
                                 p->state_dir);
        }

        *ret = TAKE_PTR(s);
        return 0;
}

State *state_free(State *s) {
        if (!s)
                return NULL;
        state_fds_done(&s->records);
        state_fds_done(&s->segments);
        state_fds_done(&s->replaced_kept);
        state_replaced_free_all(s);
        (void) pthread_mutex_destroy(&s->replace_lock);
        free(s->dir);
        safe_close(s->dir_fd);
        (void) pthread_mutex_destroy(&s->lock);
        return mfree(s);
}

StateMode state_mode(const State *s) {
        return s ? s->mode : STATE_MODE_NONE;
}

const char *state_dir(const State *s) {
        return s && s->mode == STATE_MODE_DIR ? s->dir : NULL;
}

int state_segment_dir(const State *s) {
        return s && s->mode == STATE_MODE_DIR ? s->dir_fd : -1;
}

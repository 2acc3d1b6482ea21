/* state.c: the state adapter's modes, names, fd store counts, and the save/forget of builds and meshes. */
#include <fcntl.h>
#include <inttypes.h>
#include <linux/magic.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>

#include "common/log.h"
#include "sd/notify.h"
#include "record.h"
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

uint64_t state_now_ns(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

size_t state_build_segments(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized;
        return n;
}

bool state_build_has_gpu_shards(const BuildState *b) {
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized &&
                    streq_ptr(b->ranks[i].device_kind, SHARD_SEGMENT_DEVICE_KIND_CUDA))
                        return true;
        return false;
}

int state_name_meta(const char *id, char ret[static STATE_NAME_MAX]) {
        int k = snprintf(ret, STATE_NAME_MAX, STATE_PREFIX_META "%s", id);
        return k < 0 || (size_t) k >= STATE_NAME_MAX ? -ENAMETOOLONG : 0;
}

int state_name_shard(const char *build_id, int64_t rank, char ret[static STATE_NAME_MAX]) {
        int k = snprintf(ret, STATE_NAME_MAX, STATE_PREFIX_SHARD "%s-%" PRId64, build_id, rank);
        return k < 0 || (size_t) k >= STATE_NAME_MAX ? -ENAMETOOLONG : 0;
}

/* ---- the fd store ---------------------------------------------------------------------- */

static int fdstore_push(const char *name, int fd) {
        int r = notify_fdstore_add(name, &fd, 1);
        if (r == 0)
                return -ENOTCONN; /* NOTIFY_SOCKET went away */
        return r < 0 ? r : 0;
}

static void fdstore_remove(const char *name) {
        int r = notify_fdstore_remove(name);
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

int state_put_record(State *s, const char *name, const uint8_t *data, size_t size) {
        if (s->mode == STATE_MODE_DIR)
                return dir_put(s, name, data, size);

        _cleanup_close_ int fd = memfd_sealed(name, data, size);
        if (fd < 0)
                return fd;
        return fdstore_push(name, fd);
}

void state_drop(State *s, const char *name) {
        if (!s)
                return;
        if (s->mode == STATE_MODE_DIR) {
                if (unlinkat(s->dir_fd, name, 0) < 0 && errno != ENOENT)
                        log_warning_errno(-errno, "Failed to remove %s/%s, ignoring: %m", s->dir,
                                          name);
        } else if (s->mode == STATE_MODE_FDSTORE)
                fdstore_remove(name);
}

/* ---- counts ---------------------------------------------------------------------------- */

int state_fd_reserve(State *s, size_t n, const char *what, FamilyError *ret_error) {
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

void state_fd_unreserve(State *s, size_t n) {
        if (!s || s->mode != STATE_MODE_FDSTORE)
                return;
        (void) pthread_mutex_lock(&s->lock);
        s->fd_reserved -= MIN(n, s->fd_reserved);
        (void) pthread_mutex_unlock(&s->lock);
}

void state_fd_commit(State *s, size_t n) {
        if (!s || s->mode != STATE_MODE_FDSTORE)
                return;
        (void) pthread_mutex_lock(&s->lock);
        s->fd_reserved -= MIN(n, s->fd_reserved);
        s->fd_used += n;
        (void) pthread_mutex_unlock(&s->lock);
}

void state_fd_release(State *s, size_t n) {
        if (!s || s->mode != STATE_MODE_FDSTORE)
                return;
        (void) pthread_mutex_lock(&s->lock);
        s->fd_used -= MIN(n, s->fd_used);
        (void) pthread_mutex_unlock(&s->lock);
}

/* ---- builds ---------------------------------------------------------------------------- */

/* GPU shards are never kept (state.h): such a build reserves, saves and forgets nothing. */
int state_build_reserve(State *s, const BuildState *b, FamilyError *ret_error) {
        if (state_build_has_gpu_shards(b))
                return 0;
        return state_fd_reserve(s, state_build_segments(b) + 1, "build", ret_error);
}

void state_build_unreserve(State *s, const BuildState *b) {
        if (!state_build_has_gpu_shards(b))
                state_fd_unreserve(s, state_build_segments(b) + 1);
}

int state_segment_new(State *s, const char *build_id, int64_t rank, uint64_t size, int device,
                      ShardSegment **ret) {
        char name[STATE_NAME_MAX], memfd_name[STATE_NAME_MAX + 8];
        int r;

        r = state_name_shard(build_id, rank, name);
        if (r < 0)
                return r;
        if (s && s->mode == STATE_MODE_DIR)
                return shard_segment_new_file(s->dir_fd, name, size, device, ret);
        /* Shows in /proc/PID/fd and maps as memfd:familyd-shard-bld-...-RANK. */
        (void) snprintf(memfd_name, sizeof memfd_name, "familyd-%s", name);
        return shard_segment_new_host(memfd_name, size, device, ret);
}

int state_dir_full_error(State *s, uint64_t bytes, FamilyError *ret_error) {
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "STATE_DIR_FULL",
                                NULL,
                                "no space left in the state dir %s for the build's %" PRIu64
                                " bytes of shards; nothing was kept",
                                s && s->dir ? s->dir : "", bytes);
}

static int fdstore_save_build(State *s, const char *id, const BuildState *b, const char *meta,
                              const uint8_t *data, size_t size) {
        size_t pushed = 0;
        char name[STATE_NAME_MAX];
        int r = 0;

        for (size_t i = 0; r >= 0 && i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized)
                        continue;
                r = state_name_shard(id, b->layout.ranks[i].rank, name);
                if (r >= 0)
                        r = fdstore_push(name, shard_segment_fd(b->ranks[i].segment));
                if (r >= 0)
                        pushed = i + 1;
        }
        if (r >= 0)
                r = state_put_record(s, meta, data, size);
        if (r >= 0)
                return 0;

        for (size_t i = 0; i < pushed; i++)
                if (b->ranks[i].materialized &&
                    state_name_shard(id, b->layout.ranks[i].rank, name) >= 0)
                        fdstore_remove(name);
        return r;
}

int state_build_save(State *s, const char *id, const BuildState *b, FamilyError *ret_error) {
        _cleanup_free_ uint8_t *data = NULL;
        char meta[STATE_NAME_MAX];
        size_t size;
        int r;

        if (!s || s->mode == STATE_MODE_NONE)
                return 0;
        if (state_build_has_gpu_shards(b)) {
                log_struct(LOG_NOTICE, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, id)),
                           "Build %s holds shards in GPU memory, which are not kept across "
                           "restarts (%s mode keeps host shards only).",
                           id, state_mode_to_string(s->mode));
                return 0;
        }

        r = state_name_meta(id, meta);
        if (r < 0)
                return r;
        r = state_record_encode_build(id, b, state_now_ns(), &data, &size);
        if (r < 0)
                return r;

        if (s->mode == STATE_MODE_DIR) {
                r = state_put_record(s, meta, data, size);
                if (r == -ENOSPC || r == -EDQUOT)
                        return state_dir_full_error(s, b->layout.total_bytes, ret_error);
                if (r < 0) {
                        log_error_errno(r, "Failed to write %s/%s: %m", s->dir, meta);
                        return family_error_set(ret_error, FAMILY_STATUS_INTERNAL, "STATE_DIR",
                                                NULL,
                                                "cannot write the build's record in the state "
                                                "dir %s: %s; nothing was kept",
                                                s->dir, strerror(-r));
                }
                return 0;
        }

        r = fdstore_save_build(s, id, b, meta, data, size);
        if (r < 0) {
                log_error_errno(r, "Failed to put build %s into the fd store: %m", id);
                return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "FDSTORE", NULL,
                                        "the service manager's fd store cannot keep the build: "
                                        "%s; nothing was kept",
                                        strerror(-r));
        }
        state_fd_commit(s, state_build_segments(b) + 1);
        return 0;
}

static void drop_segments(State *s, const char *id, const BuildState *b) {
        char name[STATE_NAME_MAX];

        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized &&
                    state_name_shard(id, b->layout.ranks[i].rank, name) >= 0)
                        state_drop(s, name);
}

void state_build_discard(State *s, const char *id, const BuildState *b) {
        /* Only files exist before the save (the fd store gets nothing until then). */
        if (s && s->mode == STATE_MODE_DIR && !state_build_has_gpu_shards(b))
                drop_segments(s, id, b);
}

void state_build_forget(State *s, const char *id, const BuildState *b) {
        char meta[STATE_NAME_MAX];

        if (!s || s->mode == STATE_MODE_NONE || state_build_has_gpu_shards(b))
                return;
        /* The record first: a crash in between leaves only segments, dropped at the next
         * start, never a record without its bytes. */
        if (state_name_meta(id, meta) >= 0)
                state_drop(s, meta);
        drop_segments(s, id, b);
        state_fd_release(s, state_build_segments(b) + 1);
}

/* ---- meshes ---------------------------------------------------------------------------- */

int state_mesh_save(State *s, const Mesh *m, FamilyError *ret_error) {
        _cleanup_free_ uint8_t *data = NULL;
        char meta[STATE_NAME_MAX];
        size_t size;
        int r;

        if (!s || s->mode == STATE_MODE_NONE)
                return 0;

        r = state_fd_reserve(s, 1, "mesh", ret_error);
        if (r < 0)
                return r;
        r = state_name_meta(m->id, meta);
        if (r >= 0)
                r = state_record_encode_mesh(m, state_now_ns(), &data, &size);
        if (r >= 0)
                r = state_put_record(s, meta, data, size);
        if (r < 0) {
                state_fd_unreserve(s, 1);
                if (s->mode == STATE_MODE_DIR && (r == -ENOSPC || r == -EDQUOT))
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "STATE_DIR_FULL", NULL,
                                                "no space left in the state dir %s for the "
                                                "mesh's record; nothing was kept",
                                                s->dir);
                log_error_errno(r, "Failed to keep mesh %s (%s): %m", m->id,
                                state_mode_to_string(s->mode));
                if (s->mode == STATE_MODE_DIR)
                        return family_error_set(ret_error, FAMILY_STATUS_INTERNAL, "STATE_DIR",
                                                NULL,
                                                "cannot write the mesh's record in the state "
                                                "dir %s: %s; nothing was kept",
                                                s->dir, strerror(-r));
                return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "FDSTORE", NULL,
                                        "the service manager's fd store cannot keep the mesh: "
                                        "%s; nothing was kept",
                                        strerror(-r));
        }
        state_fd_commit(s, 1);
        return 0;
}

static int mesh_added(const Mesh *m, void *userdata, FamilyError *ret_error) {
        return state_mesh_save(userdata, m, ret_error);
}

static void mesh_removed(const Mesh *m, void *userdata) {
        State *s = userdata;
        char meta[STATE_NAME_MAX];

        if (state_name_meta(m->id, meta) >= 0)
                state_drop(s, meta);
        state_fd_release(s, 1);
}

void state_install_mesh_hooks(State *s, MeshTable *meshes) {
        if (!s || s->mode == STATE_MODE_NONE)
                return;
        mesh_table_set_hooks(meshes, &(MeshTableHooks) {
                                             .added = mesh_added,
                                             .removed = mesh_removed,
                                             .userdata = s,
                                     });
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
        /* Re-adoption deletes what no record names: two daemons on one dir would delete each
         * other's shards. */
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

int state_new(const StateParams *p, State **ret) {
        _cleanup_(state_freep) State *s = NULL;
        int r;

        s = calloc(1, sizeof *s);
        if (!s) {
                listen_fd_array_free(p->metas, p->n_metas);
                listen_fd_array_free(p->shards, p->n_shards);
                return log_error_errno(-ENOMEM, "Out of memory.");
        }
        (void) pthread_mutex_init(&s->lock, NULL);
        s->dir_fd = -1;
        s->metas = p->metas;
        s->n_metas = p->n_metas;
        s->shards = p->shards;
        s->n_shards = p->n_shards;

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
        listen_fd_array_free(s->metas, s->n_metas);
        listen_fd_array_free(s->shards, s->n_shards);
        free(s->dir);
        safe_close(s->dir_fd);
        (void) pthread_mutex_destroy(&s->lock);
        return mfree(s);
}

StateMode state_mode(const State *s) {
        return s ? s->mode : STATE_MODE_NONE;
}

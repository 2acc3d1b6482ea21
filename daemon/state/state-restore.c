/* state-restore.c: re-adopting the builds and meshes a previous run kept, at start. */

/*
 * DESIGN: both modes come down to two lists of named descriptors, records ("meta-*") and
 * segments ("shard-*"): the fd store hands them over as LISTEN_FDS, the state dir is read
 * into the same shape (opened read-only: nothing here ever writes, truncates or rewrites a
 * kept file). Records are decoded, meshes put back first, then builds in creation order, each
 * with its segments found by name. What cannot be put back (a damaged or unknown record, a
 * build whose segments are missing or have the wrong size, a segment no record names) is
 * logged and dropped: unlinked, or removed from the store. A trainer that maps such a segment
 * keeps its mapping; only the daemon lets go.
 */

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>

#include "common/log.h"
#include "record.h"
#include "state-private.h"

typedef struct Item {
        char *name;
        int fd;
} Item;

typedef struct Items {
        Item *items;
        size_t n, allocated;
} Items;

static void items_done(Items *l) {
        for (size_t i = 0; i < l->n; i++) {
                free(l->items[i].name);
                safe_close(l->items[i].fd);
        }
        free(l->items);
        *l = (Items) {};
}

static bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool endswith(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);
        return n >= k && streq(s + n - k, suffix);
}

/* Takes name (a copy) and fd (always: closed on failure). */
static int items_add(Items *l, const char *name, int fd) {
        char *copy = strdup(name);
        if (!copy || !GREEDY_REALLOC(l->items, l->allocated, l->n + 1)) {
                free(copy);
                safe_close(fd);
                return -ENOMEM;
        }
        l->items[l->n++] = (Item) { .name = copy, .fd = fd };
        return 0;
}

/* The first untaken item named name, or NULL. */
static Item *items_find(Items *l, const char *name) {
        for (size_t i = 0; i < l->n; i++)
                if (l->items[i].fd >= 0 && streq(l->items[i].name, name))
                        return &l->items[i];
        return NULL;
}

/* Takes every descriptor of a; inherited ones come without close-on-exec. */
static int collect_fdstore(ListenFd *a, size_t n, Items *into) {
        int r = 0;

        for (size_t i = 0; i < n; i++) {
                int fd = TAKE_FD(a[i].fd);

                (void) fcntl(fd, F_SETFD, FD_CLOEXEC);
                if (r < 0)
                        safe_close(fd);
                else
                        r = items_add(into, a[i].name, fd);
        }
        return r;
}

static int collect_dir(State *s, Items *metas, Items *shards) {
        _cleanup_close_ int fd = -1;
        DIR *d;
        int r = 0;

        fd = openat(s->dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0)
                return log_error_errno(-errno, "Failed to read the state dir %s: %m", s->dir);
        d = fdopendir(fd);
        if (!d)
                return log_error_errno(-errno, "Failed to read the state dir %s: %m", s->dir);
        TAKE_FD(fd);

        for (struct dirent *de; r >= 0 && (errno = 0, de = readdir(d));) {
                bool meta = startswith(de->d_name, STATE_PREFIX_META),
                     shard = startswith(de->d_name, STATE_PREFIX_SHARD);

                if (!meta && !shard)
                        continue; /* not ours: left alone */
                if (endswith(de->d_name, STATE_TMP_SUFFIX)) {
                        /* A record being written when the daemon stopped. */
                        log_info("Removing %s/%s, a record never completed.", s->dir, de->d_name);
                        (void) unlinkat(s->dir_fd, de->d_name, 0);
                        continue;
                }
                int f = openat(s->dir_fd, de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW |
                                                              O_NOCTTY | O_NONBLOCK);
                if (f < 0) {
                        log_warning_errno(-errno, "Failed to open %s/%s, ignoring: %m", s->dir,
                                          de->d_name);
                        continue;
                }
                r = items_add(meta ? metas : shards, de->d_name, f);
        }
        if (r >= 0 && errno != 0)
                r = log_error_errno(-errno, "Failed to read the state dir %s: %m", s->dir);
        (void) closedir(d);
        return r;
}

static int read_all(int fd, uint8_t **ret, size_t *ret_size) {
        struct stat st;

        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADFD;
        if (st.st_size > (off_t) (STATE_RECORD_MAX_BYTES + STATE_RECORD_HEADER_SIZE))
                return -EFBIG;

        size_t size = (size_t) st.st_size;
        _cleanup_free_ uint8_t *buf = malloc(size ? size : 1);
        if (!buf)
                return -ENOMEM;
        for (size_t done = 0; done < size;) {
                ssize_t k = pread(fd, buf + done, size - done, (off_t) done);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                if (k == 0)
                        return -EIO;
                done += (size_t) k;
        }
        *ret = TAKE_PTR(buf);
        *ret_size = size;
        return 0;
}

typedef struct Restore {
        State *state;
        Manager *manager;
        ShardTable *shards;
        Items metas, segments;
        StateRecord *records;
        size_t n_records, allocated;
        unsigned builds, meshes, dropped;
} Restore;

static void restore_done(Restore *x) {
        items_done(&x->metas);
        items_done(&x->segments);
        for (size_t i = 0; i < x->n_records; i++)
                state_record_done(&x->records[i]);
        free(x->records);
}

/* Lets go of a record or a segment the daemon will not keep. */
static void drop_name(Restore *x, const char *name) {
        state_drop(x->state, name);
        x->dropped++;
}

static int read_records(Restore *x) {
        char why[256], want[STATE_NAME_MAX];

        for (size_t i = 0; i < x->metas.n; i++) {
                Item *it = &x->metas.items[i];
                _cleanup_free_ uint8_t *data = NULL;
                StateRecord rec = {};
                size_t size = 0;
                int r;

                r = read_all(it->fd, &data, &size);
                it->fd = safe_close(it->fd);
                if (r == -ENOMEM)
                        return log_error_errno(r, "Out of memory.");
                if (r < 0) {
                        log_warning_errno(r, "Dropping the state record %s: cannot read it: %m",
                                          it->name);
                        drop_name(x, it->name);
                        continue;
                }
                r = state_record_decode(data, size, &rec, why, sizeof why);
                if (r == -ENOMEM)
                        return log_error_errno(r, "Out of memory.");
                if (r >= 0 && (state_name_meta(rec.id, want) < 0 || !streq(want, it->name))) {
                        (void) snprintf(why, sizeof why, "it describes %.64s", rec.id);
                        state_record_done(&rec);
                        r = -EBADMSG;
                }
                if (r < 0) {
                        log_warning("Dropping the state record %s: %s%s.", it->name,
                                    r == -EPROTONOSUPPORT ? "written by another familyd: " : "",
                                    why);
                        drop_name(x, it->name);
                        continue;
                }
                if (!GREEDY_REALLOC(x->records, x->allocated, x->n_records + 1)) {
                        state_record_done(&rec);
                        return log_error_errno(-ENOMEM, "Out of memory.");
                }
                x->records[x->n_records++] = rec;
        }
        return 0;
}

/* Meshes before builds; each in creation order. */
static int record_cmp(const void *a, const void *b) {
        const StateRecord *x = a, *y = b;

        if (x->kind != y->kind)
                return x->kind == STATE_RECORD_MESH ? -1 : 1;
        if (x->created_ns != y->created_ns)
                return x->created_ns < y->created_ns ? -1 : 1;
        return strcmp(x->id, y->id);
}

static void restore_mesh(Restore *x, StateRecord *rec) {
        char name[STATE_NAME_MAX];
        int r;

        (void) state_name_meta(rec->id, name);
        r = mesh_table_restore(x->manager->meshes, rec->mesh, NULL);
        if (r < 0) {
                log_struct(LOG_WARNING, r, LOG_FIELDS(LOG_FIELD(LOG_FIELD_MESH_ID, rec->id)),
                           "Dropping the state record %s: cannot put mesh %s back: %m", name,
                           rec->id);
                drop_name(x, name);
                return;
        }
        state_fd_commit(x->state, 1);
        x->meshes++;
}

/* The build's mesh from the table, counted; put back from the build's own copy when the mesh
 * record was lost. -ESTALE: a different mesh has that id. */
static int build_mesh(Restore *x, StateRecord *rec, Mesh **ret) {
        MeshTable *t = x->manager->meshes;
        FamilyError e = FAMILY_ERROR_NULL;
        Mesh *m = NULL;
        int r;

        r = mesh_table_acquire(t, rec->mesh->id, &m, &e);
        family_error_done(&e);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                r = mesh_table_restore(t, rec->mesh, NULL);
                if (r < 0)
                        return r;
                log_struct(LOG_NOTICE, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_MESH_ID, rec->mesh->id)),
                           "Mesh %s had no record of its own; put back from build %s.",
                           rec->mesh->id, rec->id);
                r = state_mesh_save(x->state, rec->mesh, &e);
                if (r < 0)
                        log_warning("Mesh %s is served but not kept across the next restart: "
                                    "%s",
                                    rec->mesh->id, strempty(e.message));
                family_error_done(&e);
                r = mesh_table_acquire(t, rec->mesh->id, &m, &e);
                family_error_done(&e);
                if (r < 0)
                        return r;
        }
        if (!mesh_spec_equal(&m->spec, &rec->mesh->spec)) {
                mesh_build_release(m);
                mesh_unref(m);
                return -ESTALE;
        }
        *ret = m;
        return 0;
}

/* 0, or a negative errno with why filled: the build is not put back. */
static int restore_build_one(Restore *x, StateRecord *rec, char *why, size_t why_size) {
        BuildState *b = rec->build;
        char name[STATE_NAME_MAX];
        int r;

        if (rec->mesh) {
                r = build_mesh(x, rec, &b->counted_mesh);
                if (r < 0) {
                        (void) snprintf(why, why_size, "its mesh %s cannot be put back: %s",
                                        rec->mesh->id, strerror(-r));
                        return r;
                }
                b->plan.mesh = mesh_ref(b->counted_mesh);
        }

        /* Adopted as duplicates: the list keeps its descriptors until the build is in, so
         * that a build given up on leaves its segments there, to be dropped with the orphans. */
        for (size_t i = 0; i < b->n_ranks; i++) {
                const RankLayout *rl = &b->layout.ranks[i];
                Item *it;
                int fd;

                if (!b->ranks[i].materialized)
                        continue;
                r = state_name_shard(rec->id, rl->rank, name);
                it = r >= 0 ? items_find(&x->segments, name) : NULL;
                if (!it) {
                        (void) snprintf(why, why_size, "its shard %s is missing", name);
                        return -ENOENT;
                }
                fd = fcntl(it->fd, F_DUPFD_CLOEXEC, 3);
                if (fd < 0) {
                        r = -errno;
                        (void) snprintf(why, why_size, "its shard %s cannot be used: %s", name,
                                        strerror(-r));
                        return r;
                }
                r = shard_segment_adopt(fd, b->ranks[i].local_device, &b->ranks[i].segment);
                if (r < 0) {
                        safe_close(fd);
                        (void) snprintf(why, why_size, "its shard %s cannot be used: %s", name,
                                        strerror(-r));
                        return r;
                }
                if (shard_segment_size(b->ranks[i].segment) != rl->size_bytes) {
                        (void) snprintf(why, why_size,
                                        "its shard %s has %" PRIu64 " bytes, not %" PRIu64, name,
                                        shard_segment_size(b->ranks[i].segment), rl->size_bytes);
                        return -EBADMSG;
                }
        }

        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized)
                        continue;
                r = shard_table_restore(x->shards, b->group.hex, b->ranks[i].segment,
                                        b->ranks[i].token.hex);
                if (r < 0) {
                        (void) shard_table_remove_group(x->shards, b->group.hex);
                        (void) snprintf(why, why_size, "its token of rank %" PRId64 " %s",
                                        b->layout.ranks[i].rank,
                                        r == -EEXIST ? "is another build's" : strerror(-r));
                        return r;
                }
        }

        r = build_table_restore(x->manager->builds, rec->id, rec->bytes, b, build_state_free,
                                NULL);
        if (r < 0) {
                (void) shard_table_remove_group(x->shards, b->group.hex);
                (void) snprintf(why, why_size, "%s",
                                r == -EEXIST ? "its id is taken" : strerror(-r));
                return r;
        }
        rec->build = NULL; /* the table's now */

        for (size_t i = 0; i < b->n_ranks; i++) {
                Item *it;
                if (b->ranks[i].materialized &&
                    state_name_shard(rec->id, b->layout.ranks[i].rank, name) >= 0 &&
                    (it = items_find(&x->segments, name)))
                        it->fd = safe_close(it->fd);
        }
        return 0;
}

static int restore_build(Restore *x, StateRecord *rec) {
        char why[256] = "", name[STATE_NAME_MAX];
        size_t n_segments = state_build_segments(rec->build);
        uint64_t bytes = rec->bytes;
        int r;

        r = restore_build_one(x, rec, why, sizeof why);
        if (r == -ENOMEM)
                return log_error_errno(r, "Out of memory.");
        if (r < 0) {
                log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                           "Dropping build %s kept by an earlier run: %s.", rec->id, why);
                (void) state_name_meta(rec->id, name);
                drop_name(x, name);
                /* Its segments stay in the list: dropped with the orphans. */
                return 0;
        }
        state_fd_commit(x->state, n_segments + 1);
        x->builds++;
        log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                   "Re-adopted build %s: %zu shard%s, %" PRIu64 " bytes.", rec->id, n_segments,
                   n_segments == 1 ? "" : "s", bytes);
        return 0;
}

int state_restore(State *s, Manager *m, ShardTable *shards) {
        _cleanup_(restore_done) Restore x = { .state = s, .manager = m, .shards = shards };
        int r;

        if (!s || s->mode == STATE_MODE_NONE)
                return 0;

        if (s->mode == STATE_MODE_DIR)
                r = collect_dir(s, &x.metas, &x.segments);
        else {
                r = collect_fdstore(s->metas, s->n_metas, &x.metas);
                if (r >= 0)
                        r = collect_fdstore(s->shards, s->n_shards, &x.segments);
        }
        if (r < 0)
                return log_error_errno(r, "Failed to take over the kept state: %m");

        r = read_records(&x);
        if (r < 0)
                return r;
        if (x.n_records > 0)
                qsort(x.records, x.n_records, sizeof(StateRecord), record_cmp);

        for (size_t i = 0; i < x.n_records; i++) {
                StateRecord *rec = &x.records[i];
                if (rec->kind == STATE_RECORD_MESH)
                        restore_mesh(&x, rec);
                else {
                        r = restore_build(&x, rec);
                        if (r < 0)
                                return r;
                }
        }

        /* Segments no kept build took: a build dropped above, or one whose record was never
         * written (a crash while it was made). */
        for (size_t i = 0; i < x.segments.n; i++) {
                Item *it = &x.segments.items[i];
                bool twice = false;

                if (it->fd < 0)
                        continue;
                for (size_t j = 0; j < x.segments.n && !twice; j++)
                        twice = j != i && streq(x.segments.items[j].name, it->name);
                it->fd = safe_close(it->fd);
                if (twice) {
                        /* Removing the name would take the other descriptor too. */
                        log_warning("%s was handed back twice; closing one.", it->name);
                        continue;
                }
                log_info("Dropping %s: no kept build names it.", it->name);
                drop_name(&x, it->name);
        }

        state_install_mesh_hooks(s, m->meshes);

        log_info("Re-adopted %u build%s and %u mesh%s from the %s%s%s; dropped %u item%s.",
                 x.builds, x.builds == 1 ? "" : "s", x.meshes, x.meshes == 1 ? "" : "es",
                 s->mode == STATE_MODE_DIR ? "state dir" : "fd store",
                 s->mode == STATE_MODE_DIR ? " " : "", strempty(s->dir), x.dropped,
                 x.dropped == 1 ? "" : "s");
        if (s->mode == STATE_MODE_FDSTORE && s->fd_used > s->fd_max)
                log_warning("The fd store holds %zu of familyd's descriptors, more than "
                            "--fdstore-max %zu: new builds are refused until some are released.",
                            s->fd_used, s->fd_max);
        return 0;
}

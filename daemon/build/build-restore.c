/* build-restore.c: re-adopting the builds and meshes a previous run kept, at start. */

/*
 * DESIGN: the store hands over what the previous run kept as two lists of named descriptors,
 * records ("meta-*") and segments ("shard-*"), without knowing what they hold. Records are
 * decoded (codec/codec-record.h), meshes put back first, then builds in creation order, each
 * turned from its record's plain data into a live build with its segments found by name. What
 * cannot be put back (a damaged or unknown record, a build whose segments are missing or have
 * the wrong size, a segment no record names) is logged and dropped: unlinked, or removed from
 * the store. A trainer that maps such a segment keeps its mapping; only the daemon lets go.
 */

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>

#include "build-private.h"
#include "codec/codec-record.h"
#include "common/log.h"

typedef struct Restore {
        const Builder *builder;
        StateFds metas, segments;
        StateRecord *records;
        size_t n_records, allocated;
        unsigned builds, meshes, dropped;
} Restore;

static void restore_done(Restore *x) {
        state_fds_done(&x->metas);
        state_fds_done(&x->segments);
        for (size_t i = 0; i < x->n_records; i++)
                codec_record_done(&x->records[i]);
        free(x->records);
}

/* Lets go of a record or a segment the daemon will not keep. */
static void drop_name(Restore *x, const char *name) {
        state_drop(x->builder->state, name);
        x->dropped++;
}

static int read_records(Restore *x) {
        char why[256], want[STATE_NAME_MAX];

        for (size_t i = 0; i < x->metas.n; i++) {
                StateFd *it = &x->metas.items[i];
                _cleanup_free_ uint8_t *data = NULL;
                StateRecord rec = {};
                size_t size = 0;
                int r;

                r = state_read_record(it->fd, STATE_RECORD_MAX_BYTES + STATE_RECORD_HEADER_SIZE,
                                      &data, &size);
                it->fd = safe_close(it->fd);
                if (r == -ENOMEM)
                        return log_error_errno(r, "Out of memory.");
                if (r < 0) {
                        log_warning_errno(r, "Dropping the state record %s: cannot read it: %m",
                                          it->name);
                        drop_name(x, it->name);
                        continue;
                }
                r = codec_record_decode(data, size, &rec, why, sizeof why);
                if (r == -ENOMEM)
                        return log_error_errno(r, "Out of memory.");
                if (r >= 0 && (state_name_record(rec.id, want) < 0 || !streq(want, it->name))) {
                        (void) snprintf(why, sizeof why, "it describes %.64s", rec.id);
                        codec_record_done(&rec);
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
                        codec_record_done(&rec);
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

        (void) state_name_record(rec->id, name);
        r = mesh_table_restore(x->builder->manager->meshes, rec->mesh, NULL);
        if (r < 0) {
                log_struct(LOG_WARNING, r, LOG_FIELDS(LOG_FIELD(LOG_FIELD_MESH_ID, rec->id)),
                           "Dropping the state record %s: cannot put mesh %s back: %m", name,
                           rec->id);
                drop_name(x, name);
                return;
        }
        state_adopt(x->builder->state, 1);
        x->meshes++;
}

/* The build's mesh from the table, counted; put back from the build's own copy when the mesh
 * record was lost. -ESTALE: a different mesh has that id. */
static int build_mesh(Restore *x, StateRecord *rec, Mesh **ret) {
        MeshTable *t = x->builder->manager->meshes;
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
                /* Counted like a mesh put back from its own record: ListMeshes shows both. */
                x->meshes++;
                log_struct(LOG_NOTICE, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_MESH_ID, rec->mesh->id)),
                           "Mesh %s had no record of its own; put back from build %s.",
                           rec->mesh->id, rec->id);
                r = mesh_keep_save(x->builder->state, rec->mesh, &e);
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

/* A live build of a kept one's plain data (taken from rb): no mesh, no segments yet. */
static int build_state_of_record(RecordBuild *rb, BuildState **ret) {
        _cleanup_(build_state_freep) BuildState *b = NULL;
        MaterializeOptions *m;

        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        b->ranks = calloc(rb->n_ranks + 1, sizeof(BuildRankState));
        if (!b->ranks)
                return -ENOMEM;
        for (size_t i = 0; i < rb->n_ranks; i++) {
                const RecordBuildRank *k = &rb->ranks[i];
                BuildRankState *rs = &b->ranks[i];

                rs->node = TAKE_PTR(rb->ranks[i].node);
                b->n_ranks++;
                rs->local_device = k->local_device;
                rs->device_kind = streq(k->device_kind, CODEC_DEVICE_KIND_CUDA)
                                          ? SHARD_SEGMENT_DEVICE_KIND_CUDA
                                          : SHARD_SEGMENT_DEVICE_KIND_HOST;
                if (isempty(k->token))
                        continue;
                rs->materialized = true;
                rs->allocation_bytes = k->size_bytes;
                memcpy(rs->token.hex, k->token, SHARD_TOKEN_LENGTH + 1);
                rs->replica = k->replica;
                rs->primary = k->primary;
        }
        b->plan = rb->plan;
        rb->plan = (BuildPlan) {};
        b->layout = rb->layout;
        rb->layout = (Layout) {};
        b->dtype = rb->dtype;
        b->seed = rb->seed;
        b->writable = rb->writable;
        memcpy(b->registry_digest, rb->registry_digest, sizeof b->registry_digest);
        memcpy(b->group.hex, rb->group, SHARD_TOKEN_LENGTH + 1);

        m = &b->plan.materialize;
        m->enabled = rb->bytes > 0;
        m->has_seed = true;
        m->seed = b->seed;
        m->dtype = strdup(dtype_to_string(b->dtype));
        if (!m->dtype)
                return -ENOMEM;

        *ret = TAKE_PTR(b);
        return 0;
}

/* Rank i's segment: its own, found by name in the list (a duplicate of it), or a replica's
 * (its primary's, adopted before it: primaries come first in layout order). */
static int adopt_segment(Restore *x, const char *id, BuildState *b, size_t i, char *why,
                         size_t why_size) {
        const RankLayout *rl = &b->layout.ranks[i];
        BuildRankState *rs = &b->ranks[i];
        char name[STATE_NAME_MAX];
        StateFd *it;
        int fd, r;

        if (rs->replica) {
                /* The record says which rank it shares; the layout must agree, or it would be
                 * served another rank's bytes. */
                if (!build_ranks_same_bytes(&b->layout, rs->primary, i)) {
                        (void) snprintf(why, why_size,
                                        "its rank %" PRId64 " is kept as a replica of rank %" PRId64
                                        ", whose slices differ",
                                        rl->rank, b->layout.ranks[rs->primary].rank);
                        return -EBADMSG;
                }
                r = build_replica_segment(b, i);
                if (r < 0)
                        (void) snprintf(why, why_size, "its rank %" PRId64 " cannot share rank %"
                                        PRId64 "'s shard: %s",
                                        rl->rank, b->layout.ranks[rs->primary].rank,
                                        strerror(-r));
                return r;
        }

        r = state_name_segment(id, rl->rank, name);
        it = r >= 0 ? state_fds_find(&x->segments, name) : NULL;
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
        r = shard_segment_adopt(fd, rs->local_device, &rs->segment);
        if (r < 0) {
                safe_close(fd);
                (void) snprintf(why, why_size, "its shard %s cannot be used: %s", name,
                                strerror(-r));
                return r;
        }
        /* A build of init: module is kept writable, and its record is not written again when
         * it is published (nor does it hold the parameters' inits): a write-sealed memfd says
         * it was published before the stop; a writable one without final seals (only such a
         * build keeps them open, build.c) is still its filler's to publish. */
        int seals = b->writable ? shard_segment_seals(rs->segment) : -EINVAL;
        if (seals >= 0 && (seals & F_SEAL_WRITE))
                b->writable = false;
        if (b->writable)
                shard_segment_allow_writes(rs->segment);
        if (b->writable && seals >= 0 && !(seals & F_SEAL_SEAL)) {
                b->module_init_pending = true;
                r = shard_segment_finish_unsealed(rs->segment);
        } else
                /* Kept before its seals were final, or by a daemon that sealed at creation:
                 * final either way now. */
                r = shard_segment_seal(rs->segment);
        if (r < 0) {
                (void) snprintf(why, why_size, "its shard %s cannot be sealed: %s", name,
                                strerror(-r));
                return r;
        }
        /* On huge pages the segment is the rank's bytes rounded up to whole pages. */
        if (!shard_segment_fits(rs->segment, rl->size_bytes)) {
                (void) snprintf(why, why_size, "its shard %s has %" PRIu64 " bytes, not %" PRIu64,
                                name, shard_segment_size(rs->segment), rl->size_bytes);
                return -EBADMSG;
        }
        rs->allocation_bytes = shard_segment_size(rs->segment); /* rounded, as when made */
        return 0;
}

/* 0, or a negative errno with why filled: the build is not put back. */
static int restore_build_one(Restore *x, StateRecord *rec, char *why, size_t why_size) {
        const Builder *builder = x->builder;
        _cleanup_(build_state_freep) BuildState *b = NULL;
        char name[STATE_NAME_MAX];
        int r;

        r = build_state_of_record(rec->build, &b);
        if (r < 0)
                return r;

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
                if (!b->ranks[i].materialized)
                        continue;
                r = adopt_segment(x, rec->id, b, i, why, why_size);
                if (r < 0)
                        return r;
        }

        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized)
                        continue;
                r = shard_table_restore(builder->shards, b->group.hex, b->ranks[i].segment,
                                        b->ranks[i].token.hex);
                if (r < 0) {
                        (void) shard_table_remove_group(builder->shards, b->group.hex);
                        (void) snprintf(why, why_size, "its token of rank %" PRId64 " %s",
                                        b->layout.ranks[i].rank,
                                        r == -EEXIST ? "is another build's" : strerror(-r));
                        return r;
                }
        }

        _cleanup_(build_record_unrefp) BuildRecord *restored = NULL;
        r = build_table_restore(builder->manager->builds, rec->id, rec->build->bytes, b,
                                build_state_free, &restored);
        if (r < 0) {
                (void) shard_table_remove_group(builder->shards, b->group.hex);
                (void) snprintf(why, why_size, "%s",
                                r == -EEXIST ? "its id is taken" : strerror(-r));
                return r;
        }
        BuildState *adopted = TAKE_PTR(b); /* the table's now */
        /* A materialised build is held by processes as a new one is. Its holders, pin and
         * sharing key come back from their own record with the sharing (build_sharing_start(),
         * build-holders-keep.c); without them it starts its grace period there. */
        build_table_init_holding(builder->manager->builds, restored, &(BuildRecordInit) {
                                         .referenced = build_state_segments(adopted) > 0,
                                         .writable = adopted->writable,
                                         .created_ms = build_now_ms(),
                                 });

        for (size_t i = 0; i < adopted->n_ranks; i++) {
                StateFd *it;
                if (adopted->ranks[i].materialized && !adopted->ranks[i].replica &&
                    state_name_segment(rec->id, adopted->layout.ranks[i].rank, name) >= 0 &&
                    (it = state_fds_find(&x->segments, name)))
                        it->fd = safe_close(it->fd);
        }
        return 0;
}

/* The segments kept for rb: one per materialised rank that is no replica. */
static size_t record_segments(const RecordBuild *rb) {
        size_t n = 0;
        for (size_t i = 0; i < rb->n_ranks; i++)
                n += !isempty(rb->ranks[i].token) && !rb->ranks[i].replica;
        return n;
}

static int restore_build(Restore *x, StateRecord *rec) {
        char why[256] = "", name[STATE_NAME_MAX];
        size_t n_segments = record_segments(rec->build);
        uint64_t bytes = rec->build->bytes;
        int r;

        r = restore_build_one(x, rec, why, sizeof why);
        if (r == -ENOMEM)
                return log_error_errno(r, "Out of memory.");
        if (r < 0) {
                log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                           "Dropping build %s kept by an earlier run: %s.", rec->id, why);
                (void) state_name_record(rec->id, name);
                drop_name(x, name);
                /* Its segments stay in the list: dropped with the orphans. */
                return 0;
        }
        state_adopt(x->builder->state, n_segments + 1);
        x->builds++;
        log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                   "Re-adopted build %s: %zu shard%s, %" PRIu64 " bytes.", rec->id, n_segments,
                   n_segments == 1 ? "" : "s", bytes);
        return 0;
}

int build_restore(const Builder *builder) {
        _cleanup_(restore_done) Restore x = { .builder = builder };
        State *s = builder->state;
        StateMode mode = state_mode(s);
        size_t used, max;
        int r;

        if (mode == STATE_MODE_NONE)
                return 0;

        r = state_take_kept(s, &x.metas, &x.segments);
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
                StateFd *it = &x.segments.items[i];
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

        mesh_keep_install(s, builder->manager->meshes);

        log_info("Re-adopted %u build%s and %u mesh%s from the %s%s%s; dropped %u item%s.",
                 x.builds, x.builds == 1 ? "" : "s", x.meshes, x.meshes == 1 ? "" : "es",
                 mode == STATE_MODE_DIR ? "state dir" : "fd store",
                 mode == STATE_MODE_DIR ? " " : "", strempty(state_dir(s)), x.dropped,
                 x.dropped == 1 ? "" : "s");
        state_fd_counts(s, &used, &max);
        if (mode == STATE_MODE_FDSTORE && used > max)
                log_warning("The fd store holds %zu of familyd's descriptors, more than "
                            "--fdstore-max %zu: new builds are refused until some are released.",
                            used, max);
        return 0;
}

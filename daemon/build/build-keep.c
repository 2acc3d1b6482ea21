/* build-keep.c: what builds and meshes leave in the store (daemon/state/) to outlive the daemon. */

/*
 * DESIGN: a build is kept as its shards' descriptors ("shard-<build id>-<rank>") and its record
 * ("meta-<build id>", codec/codec-record.h), a mesh as its record alone ("meta-<mesh id>"). The
 * store (state.h) keeps the descriptors before the record and lets go of the record first.
 *
 * A replica (build_group_replicas()) has no descriptor of its own there: its memory is its
 * primary's, kept once under the primary's name (the fd store would ignore the same
 * descriptor under a second name anyway), and the record lists which rank each replica
 * shares. Fd store room, the descriptors kept and those let go of count segments, not ranks.
 *
 * GPU shards (a build with a rank materialised in GPU memory) are never kept, in any mode:
 * the driver documents that an exported descriptor keeps its allocation alive while it is
 * open, but not that the allocation survives the process that made it (its context goes with
 * the process), nor that another process may re-export it; a descriptor re-adopted after a
 * restart could not be told from a live one until a trainer's import failed. So such a build
 * reserves no fd store room, writes no record and no segment (logged once, when it would have
 * been saved), and a record that names a GPU shard anyway is dropped at start
 * (codec-record.c): re-adoption never takes a descriptor for a memfd it is not.
 */

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#include "build-private.h"
#include "codec/codec-record.h"
#include "common/log.h"

uint64_t build_keep_now_ns(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_REALTIME, &ts);
        return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* ---- builds ---------------------------------------------------------------------------- */

/* GPU shards are never kept (DESIGN): such a build reserves, saves and forgets nothing. */
int build_keep_reserve(State *s, const BuildState *b, FamilyError *ret_error) {
        if (build_state_has_gpu_shards(b))
                return 0;
        return state_reserve(s, build_state_own_segments(b) + 1, "build", ret_error);
}

void build_keep_unreserve(State *s, const BuildState *b) {
        if (!build_state_has_gpu_shards(b))
                state_unreserve(s, build_state_own_segments(b) + 1);
}

int build_keep_segment_new(State *s, const char *id, int64_t rank, uint64_t size, int device,
                           ShardSegment **ret) {
        char name[STATE_NAME_MAX], memfd_name[STATE_NAME_MAX + 8];
        int dir_fd = state_segment_dir(s), r;

        r = state_name_segment(id, rank, name);
        if (r < 0)
                return r;
        if (dir_fd >= 0)
                return shard_segment_new_file(dir_fd, name, size, device, ret);
        /* Shows in /proc/PID/fd and maps as memfd:familyd-shard-bld-...-RANK. */
        (void) snprintf(memfd_name, sizeof memfd_name, "familyd-%s", name);
        return shard_segment_new_host(memfd_name, size, device, ret);
}

int build_keep_dir_full_error(State *s, uint64_t bytes, FamilyError *ret_error) {
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "STATE_DIR_FULL",
                                NULL,
                                "no space left in the state dir %s for the build's %" PRIu64
                                " bytes of shards; nothing was kept",
                                strempty(state_dir(s)), bytes);
}

static int build_record(const char *id, const BuildState *b, uint8_t **ret, size_t *ret_size) {
        _cleanup_(arena_done) Arena a;
        RecordReplica *replicas;
        CodecBuild view;
        size_t n = 0;
        int r;

        arena_init(&a);
        r = build_state_describe(b, &a, &view);
        if (r < 0)
                return r;
        replicas = arena_alloc_array(&a, b->n_ranks ? b->n_ranks : 1, sizeof(RecordReplica));
        if (!replicas)
                return -ENOMEM;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && b->ranks[i].replica) {
                        if (i > UINT32_MAX)
                                return -E2BIG;
                        replicas[n++] = (RecordReplica) { (uint32_t) i,
                                                          (uint32_t) b->ranks[i].primary };
                }
        return codec_record_encode_build(id, &view, replicas, n, build_keep_now_ns(), ret,
                                         ret_size);
}

/* b's shards' descriptors under their names (names: a slot per segment). */
static int build_segments(const char *id, const BuildState *b, char (*names)[STATE_NAME_MAX],
                          StateFd *fds, size_t *ret_n) {
        size_t n = 0;
        int r;

        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized || b->ranks[i].replica)
                        continue;
                r = state_name_segment(id, b->layout.ranks[i].rank, names[n]);
                if (r < 0)
                        return r;
                fds[n] = (StateFd) { .name = names[n],
                                     .fd = shard_segment_fd(b->ranks[i].segment) };
                n++;
        }
        *ret_n = n;
        return 0;
}

int build_keep_save(State *s, const char *id, const BuildState *b, FamilyError *ret_error) {
        _cleanup_free_ uint8_t *data = NULL;
        _cleanup_free_ char(*names)[STATE_NAME_MAX] = NULL;
        _cleanup_free_ StateFd *fds = NULL;
        size_t n_segments = build_state_own_segments(b), n = 0, size = 0;
        StateMode mode = state_mode(s);
        char meta[STATE_NAME_MAX];
        int r;

        if (mode == STATE_MODE_NONE)
                return 0;
        if (build_state_has_gpu_shards(b)) {
                log_struct(LOG_NOTICE, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, id)),
                           "Build %s holds shards in GPU memory, which are not kept across "
                           "restarts (%s mode keeps host shards only).",
                           id, state_mode_to_string(mode));
                return 0;
        }

        r = state_name_record(id, meta);
        if (r < 0)
                return r;
        r = build_record(id, b, &data, &size);
        if (r < 0)
                return r;

        if (mode == STATE_MODE_DIR) {
                /* The segments are files there already. */
                r = state_keep(s, id, data, size, NULL, 0);
                if (r == -ENOSPC || r == -EDQUOT)
                        return build_keep_dir_full_error(s, build_host_bytes(b), ret_error);
                if (r < 0) {
                        log_error_errno(r, "Failed to write %s/%s: %m", state_dir(s), meta);
                        return family_error_set(ret_error, FAMILY_STATUS_INTERNAL, "STATE_DIR",
                                                NULL,
                                                "cannot write the build's record in the state "
                                                "dir %s: %s; nothing was kept",
                                                state_dir(s), strerror(-r));
                }
                return 0;
        }

        names = calloc(n_segments + 1, sizeof *names);
        fds = calloc(n_segments + 1, sizeof *fds);
        if (!names || !fds)
                return -ENOMEM;
        r = build_segments(id, b, names, fds, &n);
        if (r >= 0)
                r = state_keep(s, id, data, size, fds, n);
        if (r < 0) {
                log_error_errno(r, "Failed to put build %s into the fd store: %m", id);
                return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "FDSTORE", NULL,
                                        "the service manager's fd store cannot keep the build: "
                                        "%s; nothing was kept",
                                        strerror(-r));
        }
        return 0;
}

void build_keep_discard(State *s, const char *id, const BuildState *b) {
        char name[STATE_NAME_MAX];

        if (build_state_has_gpu_shards(b))
                return;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !b->ranks[i].replica &&
                    state_name_segment(id, b->layout.ranks[i].rank, name) >= 0)
                        state_discard(s, name);
}

void build_keep_forget(State *s, const char *id, const BuildState *b) {
        char name[STATE_NAME_MAX];

        if (state_mode(s) == STATE_MODE_NONE || build_state_has_gpu_shards(b))
                return;
        /* The record first (state.h), then the segments. */
        state_forget(s, id, build_state_own_segments(b));
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !b->ranks[i].replica &&
                    state_name_segment(id, b->layout.ranks[i].rank, name) >= 0)
                        state_drop(s, name);
}

/* ---- meshes ---------------------------------------------------------------------------- */

int mesh_keep_save(State *s, const Mesh *m, FamilyError *ret_error) {
        _cleanup_free_ uint8_t *data = NULL;
        char meta[STATE_NAME_MAX];
        StateMode mode = state_mode(s);
        size_t size;
        int r;

        if (mode == STATE_MODE_NONE)
                return 0;

        r = state_reserve(s, 1, "mesh", ret_error);
        if (r < 0)
                return r;
        r = state_name_record(m->id, meta);
        if (r >= 0)
                r = codec_record_encode_mesh(m, build_keep_now_ns(), &data, &size);
        if (r >= 0)
                r = state_keep(s, m->id, data, size, NULL, 0);
        if (r < 0) {
                state_unreserve(s, 1);
                if (mode == STATE_MODE_DIR && (r == -ENOSPC || r == -EDQUOT))
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "STATE_DIR_FULL", NULL,
                                                "no space left in the state dir %s for the "
                                                "mesh's record; nothing was kept",
                                                state_dir(s));
                log_error_errno(r, "Failed to keep mesh %s (%s): %m", m->id,
                                state_mode_to_string(mode));
                if (mode == STATE_MODE_DIR)
                        return family_error_set(ret_error, FAMILY_STATUS_INTERNAL, "STATE_DIR",
                                                NULL,
                                                "cannot write the mesh's record in the state "
                                                "dir %s: %s; nothing was kept",
                                                state_dir(s), strerror(-r));
                return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "FDSTORE", NULL,
                                        "the service manager's fd store cannot keep the mesh: "
                                        "%s; nothing was kept",
                                        strerror(-r));
        }
        return 0;
}

static int mesh_added(const Mesh *m, void *userdata, FamilyError *ret_error) {
        return mesh_keep_save(userdata, m, ret_error);
}

static void mesh_removed(const Mesh *m, void *userdata) {
        state_forget(userdata, m->id, 0);
}

void mesh_keep_install(State *s, MeshTable *meshes) {
        if (state_mode(s) == STATE_MODE_NONE)
                return;
        mesh_table_set_hooks(meshes, &(MeshTableHooks) {
                                             .added = mesh_added,
                                             .removed = mesh_removed,
                                             .userdata = s,
                                     });
}

/* build.c: Build and ReleaseBuild: plan, layout, reserve, materialise, publish, keep, commit. */
#include <inttypes.h>
#include <stdio.h>

#include "build-holders-keep.h"
#include "build-private.h"
#include "codec/codec-build.h"
#include "common/log.h"
#include "core/resource-limits.h"
#include "shm/huge-pages.h"

struct BuildDraft {
        Builder builder;
        BuildState *state;
        uint64_t bytes; /* host bytes reserved in the build table */
        struct BuildDraftShare share; /* a materialising Build's flight, or none */
        char *progress_tag;           /* BuildRequest.progress_tag, or NULL */
};

/* The reply is known in full before anything is materialised (tokens and ids have fixed
 * lengths): a Build whose reply no client could receive is refused before it costs anything. */
static int check_reply_size(BuildState *b, const char *shard_socket, FamilyError *ret_error) {
        _cleanup_(arena_done) Arena a;
        CodecBuild view;
        size_t size = 0;
        int r;

        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized)
                        memset(b->ranks[i].token.hex, '0', SHARD_TOKEN_LENGTH);
        arena_init(&a);
        r = build_state_describe(b, &a, &view);
        if (r >= 0)
                r = codec_build_packed_size("bld-00000000-00000000000000000000", &view,
                                            shard_socket, &size);
        /* The BuildResponse around it, and the message's framing. */
        size += 16;
        for (size_t i = 0; i < b->n_ranks; i++)
                b->ranks[i].token = (ShardToken) {};
        if (r < 0)
                return r;
        if (size <= FAMILYD_MAX_REPLY_BYTES)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "REPLY_LIMIT", NULL,
                                "the Build reply would be %zu bytes, more than the limit of %u "
                                "bytes (%zu ranks)",
                                size, FAMILYD_MAX_REPLY_BYTES, b->n_ranks);
}

/* Steps 1-5 and the reply check: b is complete, nothing reserved yet. */
int build_draft_prepare(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                        int64_t uid, BuildState **ret, FamilyError *ret_error) {
        Manager *m = builder->manager;
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        _cleanup_(topology_unrefp) Topology *topo = manager_topology(m);
        _cleanup_(build_state_freep) BuildState *b = NULL;
        int r;

        b = calloc(1, sizeof *b);
        if (!b)
                return -ENOMEM;
        r = build_plan(reg, m->meshes, req, &b->plan, ret_error);
        if (r < 0)
                return r;
        r = build_dtype_of(&b->plan, &b->dtype, ret_error);
        if (r < 0)
                return r;
        b->seed = b->plan.materialize.has_seed ? b->plan.materialize.seed : 0;
        b->writable = req->writable;
        r = build_compute_layout(b, ret_error);
        if (r < 0)
                return r;
        r = build_place_ranks(b, topo, builder->accel, ret_error);
        if (r < 0)
                return r;
        r = build_group_replicas(b);
        if (r < 0)
                return r;
        r = build_checkpoint_prepare(builder, b, req, uid, ret_error);
        if (r < 0)
                return r;
        if (b->plan.mesh) {
                r = manager_check_registry_agreement(m, reg, topo, b->plan.mesh, ret_error);
                if (r < 0)
                        return r;
        }
        r = manager_registry_digest_of(m, reg, b->registry_digest);
        if (r < 0)
                return r;
        r = check_reply_size(b, shard_socket, ret_error);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(b);
        return 0;
}

/* Builds in their grace period that would help a Build refused for lack of shard room (their
 * tokens), of GPU memory (their device allocations), or of anything else (any build: host
 * bytes, a slot, fd store room). */
static bool holds_shards(const void *payload) {
        return build_state_segments(payload) > 0;
}

static bool holds_gpu_memory(const void *payload) {
        return build_state_has_gpu_shards(payload);
}

typedef int (*ReserveStep)(const Builder *builder, BuildState *b, uint64_t bytes,
                           FamilyError *ret_error);

/* Which builds in their grace period give way to a refusal of reason; NULL: none does. */
static bool evictable(const FamilyError *e, bool (**ret_match)(const void *payload)) {
        *ret_match = NULL;
        if (streq_ptr(e->reason, "SHARD_LIMIT"))
                *ret_match = holds_shards;
        else if (streq_ptr(e->reason, "DEVICE_BUDGET"))
                *ret_match = holds_gpu_memory;
        else if (!streq_ptr(e->reason, "SHM_BUDGET") && !streq_ptr(e->reason, "BUILD_LIMIT") &&
                 !streq_ptr(e->reason, "FDSTORE_LIMIT"))
                return false;
        return true;
}

/* step, and while it is refused for what builds in their grace period hold, frees the oldest
 * such build and tries again. */
static int reserve_evicting(const Builder *builder, BuildState *b, uint64_t bytes,
                            ReserveStep step, FamilyError *ret_error) {
        for (;;) {
                FamilyError e = FAMILY_ERROR_NULL;
                bool (*match)(const void *payload);
                int r = step(builder, b, bytes, &e);

                if (r >= 0)
                        return 0;
                /* Refused for its uid's use: only that uid's builds in their grace period
                 * give way. */
                bool of_uid = streq_ptr(e.reason, "UID_BUILD_LIMIT") ||
                              streq_ptr(e.reason, "UID_SHM_BUDGET");
                if (!family_error_is_set(&e) ||
                    (of_uid ? build_evict_one_of_uid(builder, b->charge.uid) < 0
                            : !evictable(&e, &match) || build_evict_one(builder, match) < 0)) {
                        if (ret_error) {
                                family_error_done(ret_error);
                                *ret_error = e;
                        } else
                                family_error_done(&e);
                        return r;
                }
                family_error_done(&e);
        }
}

static int step_shard_room(const Builder *builder, BuildState *b, uint64_t bytes,
                           FamilyError *ret_error) {
        return build_check_shard_room(b, builder->shards, ret_error);
}

static int step_devices(const Builder *builder, BuildState *b, uint64_t bytes,
                        FamilyError *ret_error) {
        return b->device_memory ? 0 : build_reserve_devices(b, builder->accel, ret_error);
}

/* The fd store's room and the table's slot and bytes. */
static int step_room(const Builder *builder, BuildState *b, uint64_t bytes,
                     FamilyError *ret_error) {
        int r = build_keep_reserve(builder->state, b, ret_error);
        if (r < 0)
                return r;
        r = build_table_reserve_for(builder->manager->builds, &b->charge, bytes, ret_error);
        if (r < 0)
                build_keep_unreserve(builder->state, b);
        return r;
}

/* Reserves what b takes: its mesh's count, shard room, GPU memory, fd store room, its bytes and
 * slot in the build table. On failure b holds what b's destructor gives back. */
int build_draft_reserve(const Builder *builder, BuildState *b, BuildDraft **ret,
                         FamilyError *ret_error) {
        Manager *m = builder->manager;
        _cleanup_free_ BuildDraft *d = calloc(1, sizeof *d);
        int r;

        if (!d)
                return -ENOMEM;
        r = build_module_init_check(b, ret_error);
        if (r < 0)
                return r;
        r = shard_token_new(&b->group);
        if (r < 0)
                return r;
        /* Counted on its mesh now, so a DeleteMesh racing this Build is refused. */
        if (b->plan.mesh && !b->counted_mesh) {
                r = mesh_table_acquire(m->meshes, b->plan.mesh->id, &b->counted_mesh, ret_error);
                if (r < 0)
                        return r;
        }
        d->bytes = build_host_bytes(b);
        r = reserve_evicting(builder, b, d->bytes, step_shard_room, ret_error);
        if (r >= 0)
                r = reserve_evicting(builder, b, d->bytes, step_devices, ret_error);
        if (r >= 0)
                r = reserve_evicting(builder, b, d->bytes, step_room, ret_error);
        if (r < 0)
                return r;
        d->builder = *builder;
        d->state = b;
        *ret = TAKE_PTR(d);
        return 0;
}

int build_draft(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                const BuildActor *actor, BuildDraft **ret, FamilyError *ret_error) {
        _cleanup_(build_state_freep) BuildState *b = NULL;
        int r;

        r = build_draft_prepare(builder, req, shard_socket, actor ? (int64_t) actor->uid : -1, &b,
                                ret_error);
        if (r < 0)
                return r;
        if (actor)
                b->charge = (BuildCharge) { .charged = true,
                                            .exempt = actor->admin,
                                            .uid = actor->uid };
        r = build_draft_reserve(builder, b, ret, ret_error);
        if (r < 0)
                return r;
        TAKE_PTR(b); /* the draft's */
        return 0;
}

void build_draft_set_flight(BuildDraft *d, BuildFlight *f) {
        d->share.flight = f;
}

BuildFlight *build_draft_flight(const BuildDraft *d) {
        return d->share.flight;
}

const Builder *build_draft_builder(const BuildDraft *d) {
        return &d->builder;
}

bool build_draft_fills(const BuildDraft *d) {
        return build_state_segments(d->state) > 0;
}

int build_draft_set_progress_tag(BuildDraft *d, const char *tag) {
        char *s = NULL;

        if (!isempty(tag) && !(s = strdup(tag)))
                return -ENOMEM;
        free(d->progress_tag);
        d->progress_tag = s;
        return 0;
}

/* The bytes build_draft_finish() fills here: each segment of its own once (replicas share). */
static uint64_t draft_fill_bytes(const BuildState *b) {
        uint64_t total = 0;

        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !b->ranks[i].replica)
                        total += b->layout.ranks[i].size_bytes;
        return total;
}

void build_draft_abandon(BuildDraft *d) {
        if (!d)
                return;
        free(d->progress_tag);
        build_keep_unreserve(d->builder.state, d->state);
        build_table_cancel_for(d->builder.manager->builds, &d->state->charge, d->bytes);
        build_state_free(d->state);
        free(d);
}

static int materialize_all(const Builder *builder, BuildState *b, const char *id,
                           BuildProgress *progress, bool (*expired)(void *userdata),
                           void *userdata, FamilyError *ret_error) {
        uint64_t done = 0;

        for (size_t i = 0; i < b->n_ranks; i++) {
                const RankLayout *rl = &b->layout.ranks[i];
                BuildRankState *rs = &b->ranks[i];
                int r;

                if (!rs->materialized)
                        continue;
                /* Nobody would learn this build's id: stop, and keep nothing. */
                if (expired(userdata))
                        return -ETIMEDOUT;
                if (rs->replica) {
                        /* Its primary, earlier in layout order, is filled: nothing to fill. */
                        r = build_replica_segment(b, i);
                        if (r < 0)
                                return r;
                        rs->allocation_bytes = shard_segment_size(rs->segment);
                        continue;
                }
                if (build_rank_on_gpu(rs)) {
                        char name[96];
                        (void) snprintf(name, sizeof name, "shard-%s-%" PRId64, id, rl->rank);
                        r = accel_segment_new(builder->accel, rs->local_device, name,
                                              rl->size_bytes, &rs->segment, ret_error);
                } else
                        r = build_keep_segment_new(builder->state, id, rl->rank, rl->size_bytes,
                                                   rs->local_device, &rs->segment);
                if (r < 0)
                        return r;
                rs->allocation_bytes = shard_segment_size(rs->segment);
                build_count_fill(builder, rl->size_bytes);
                /* Stopped between chunks once nobody waits for it (-ECANCELED). */
                build_fill_bind(builder, rs->local_device, build_progress_fill(progress), expired,
                                userdata);
                r = b->checkpoint ? build_checkpoint_fill_rank(builder, b, i, progress, expired,
                                                               userdata, ret_error)
                                  : accel_fill(builder->accel, rs->segment, &b->plan, &b->layout,
                                               rl, b->dtype, b->seed, ret_error);
                if (r < 0)
                        return r;
                done += rl->size_bytes;
                build_progress_advance(progress, done);
        }
        return 0;
}

static int materialize(const Builder *builder, BuildState *b, const char *id,
                       BuildProgress *progress, bool (*expired)(void *userdata), void *userdata,
                       FamilyError *ret_error) {
        int r;

        r = materialize_all(builder, b, id, progress, expired, userdata, ret_error);
        if (r >= 0 && b->checkpoint)
                r = build_checkpoint_fill_bands(builder, b, progress, expired, userdata,
                                                ret_error);
        if (b->checkpoint)
                build_checkpoint_unmap(b);
        return r;
}

static int publish_tokens(BuildState *b, ShardTable *shards, FamilyError *ret_error) {
        int r;

        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized)
                        continue;
                /* Before anyone can fetch it: only a writable build's bytes are everyone's;
                 * every other segment is sealed against writes, for root too. */
                if (b->writable)
                        shard_segment_allow_writes(b->ranks[i].segment);
                /* init: module: sealed against writes when its filler publishes it. */
                if (b->writable && build_module_init_parameter(b))
                        r = shard_segment_finish_unsealed(b->ranks[i].segment);
                else
                        r = shard_segment_seal(b->ranks[i].segment);
                if (r < 0)
                        return r;
                r = shard_table_add(shards, b->group.hex, b->ranks[i].segment,
                                    &b->ranks[i].token);
                if (r == SHARD_TABLE_FULL)
                        return build_check_shard_room(b, shards, ret_error) < 0
                                       ? -EINVAL
                                       : family_error_set(ret_error,
                                                          FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                          "SHARD_LIMIT", NULL,
                                                          "shard limit reached");
                if (r < 0)
                        return r;
        }
        /* A training handout's tokens are its maker's from the first: nobody knows them before
         * the commit, and from then on only its process may trade them. */
        if (b->binding.bound)
                shard_table_set_access(shards, b->group.hex,
                                       &(ShardAccess) { .bound = true,
                                                        .pid = b->binding.pid,
                                                        .start_time = b->binding.start_time });
        return 0;
}

/* Gives back everything a Build took before its commit: tokens, the segments it made where
 * they outlive the daemon, its fd store room, its reservation; then frees it. */
static void draft_abandon_made(BuildDraft *d, const char *id) {
        (void) shard_table_remove_group(d->builder.shards, d->state->group.hex);
        build_keep_discard(d->builder.state, id, d->state);
        build_draft_abandon(d);
}

static int draft_finish(BuildDraft *d, const char *id, BuildProgress *progress,
                        bool (*expired)(void *userdata), void *userdata, BuildRecord **ret,
                        FamilyError *ret_error) {
        const Builder *builder = &d->builder;
        Manager *m = builder->manager;
        BuildState *b = d->state;
        uint64_t bytes = d->bytes;
        BuildRecord *rec = NULL;
        int r;

        r = materialize(builder, b, id, progress, expired, userdata, ret_error);
        if (r >= 0 && expired(userdata))
                r = -ETIMEDOUT;
        /* Read: its files are the client's again (a deleted one's space comes back). */
        b->checkpoint = build_checkpoint_free(b->checkpoint);
        if (r < 0) {
                State *state = builder->state;
                draft_abandon_made(d, id);
                if (family_error_is_set(ret_error))
                        return r; /* a backend's own answer (GPU memory, the CUDA driver) */
                if (r == -ETIMEDOUT || r == -ECANCELED)
                        return family_error_set(ret_error, FAMILY_STATUS_DEADLINE_EXCEEDED,
                                                "DEADLINE", NULL,
                                                "the call ended (deadline or shutdown) while "
                                                "materialising; nothing was kept");
                if (r == -EMFILE || r == -ENFILE)
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "FD_LIMIT", NULL,
                                                "out of file descriptors for shard memory");
                if ((r == -ENOSPC || r == -EDQUOT) && state_mode(state) == STATE_MODE_DIR)
                        return build_keep_dir_full_error(state, bytes, ret_error);
                if (r == -ENOMEM && huge_pages_mode() == HUGE_PAGES_REQUIRE)
                        return huge_pages_error(bytes, ret_error);
                if (r == -ENOMEM || r == -ENOSPC)
                        return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                "SHM_EXHAUSTED", NULL,
                                                "out of shared memory for %" PRIu64 " bytes",
                                                bytes);
                return r;
        }
        r = publish_tokens(b, builder->shards, ret_error);
        if (r >= 0)
                r = build_keep_save(builder->state, id, b, ret_error);
        if (r < 0) {
                draft_abandon_made(d, id);
                return r;
        }

        r = build_table_commit_id_for(m->builds, &b->charge, id, bytes, b, build_state_free,
                                      &rec);
        if (r < 0) {
                /* Saved: its fd store room is in use now, and forgetting gives it back. */
                (void) shard_table_remove_group(builder->shards, b->group.hex);
                build_keep_forget(builder->state, id, b);
                build_table_cancel_for(m->builds, &b->charge, bytes);
                build_state_free(b);
                free(d);
                return r;
        }
        /* b lives on as rec's payload. A shared draft's record gets its holding when its flight
         * lands (build_draft_run()); any other is held as before references. */
        if (!d->share.flight)
                build_table_init_holding(m->builds, rec,
                                         &(BuildRecordInit) {
                                                 .created_ms = build_now_ms(),
                                                 .has_owner = b->charge.charged,
                                                 .owner_uid = b->charge.uid,
                                         });
        free(d);
        char gpu_bytes_text[64] = "", replicas_text[96] = "";
        if (b->device_memory)
                (void) snprintf(gpu_bytes_text, sizeof gpu_bytes_text,
                                ", %" PRIu64 " bytes in GPU memory", build_gpu_bytes(b));
        if (build_state_replicas(b) > 0)
                (void) snprintf(replicas_text, sizeof replicas_text,
                                " (%zu ranks in %zu segments: replicas share)",
                                build_state_segments(b), build_state_own_segments(b));
        log_struct(LOG_INFO, 0,
                   LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id),
                              LOG_FIELD(LOG_FIELD_FAMILY, b->plan.resolved.family),
                              LOG_FIELD(LOG_FIELD_MESH_ID, b->plan.mesh ? b->plan.mesh->id : NULL)),
                   "Build %s created: %s as %s, %zu ranks, %" PRIu64
                   " bytes of shards held%s%s.",
                   rec->id, b->plan.resolved.family, b->plan.resolved.variant, b->n_ranks, bytes,
                   replicas_text, gpu_bytes_text);
        *ret = rec;
        return 0;
}

int build_draft_finish(BuildDraft *d, bool (*expired)(void *userdata), void *userdata,
                       BuildRecord **ret, FamilyError *ret_error) {
        BuildProgress *progress = NULL;
        char id[BUILD_TABLE_ID_MAX];
        int r;

        build_table_next_id(d->builder.manager->builds, id);
        /* Followed from here, by id and tag, while this thread fills (a failure to follow it
         * costs the watchers, not the Build). */
        if (d->builder.progress && build_draft_fills(d))
                (void) build_progress_start(d->builder.progress, id, d->progress_tag,
                                            d->state->plan.resolved.family,
                                            draft_fill_bytes(d->state), &progress);
        build_progress_reading(progress, d->state->checkpoint_bytes);
        free(d->progress_tag);
        d->progress_tag = NULL;
        r = draft_finish(d, id, progress, expired, userdata, ret, ret_error);
        fill_context_bind(NULL);
        build_progress_end(progress, r, ret_error);
        return r;
}

int build_free(const Builder *builder, const char *id, BuildTakeMode mode, int64_t now_ms,
               const char *why, FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        int r;

        r = build_table_take(builder->manager->builds, id, mode, now_ms, &rec, ret_error);
        if (r < 0)
                return r;
        /* Out of the table: nobody finds it any more; then no new descriptor is handed out. */
        BuildState *b = rec->payload;
        (void) shard_table_remove_group(builder->shards, b->group.hex);
        /* Its mesh is free now, not when the last reference to the record goes (a Build's
         * thread may still hold one after its caller was answered and released it). */
        if (b->counted_mesh) {
                mesh_build_release(b->counted_mesh);
                b->counted_mesh = mesh_unref(b->counted_mesh);
        }
        /* Only the caller whose take succeeded gets here: forgotten once. */
        build_keep_forget(builder->state, rec->id, b);
        /* Its shards leave the budget now; what clients still hold of them stays shown. */
        build_released_add(build_sharing_released(builder), b);
        build_watch_kick(build_sharing_watch(builder));
        log_struct(LOG_INFO, 0,
                   LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id),
                              LOG_FIELD(LOG_FIELD_FAMILY, b->plan.resolved.family),
                              LOG_FIELD(LOG_FIELD_MESH_ID, b->plan.mesh ? b->plan.mesh->id : NULL)),
                   "Build %s %s: %" PRIu64 " bytes of shards let go.", rec->id, why, rec->bytes);
        return 0;
}

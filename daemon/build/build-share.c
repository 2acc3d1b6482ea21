/* build-share.c: one build per request: the sharing key, Builds in flight, references, grace. */

/*
 * DESIGN: a materialising Build is found by its sharing key: the Build message the build would
 * be (plan, layout, dtypes: whatever the message describes counts, new fields included) and
 * what the message leaves out (mesh id, seed, the ranks materialised here, writability, the
 * caller's uid, the registry digest, the source_config fields a replacement's inits took). The
 * lock of BuildSharing makes "find a live build, else a Build in flight, else reserve and become
 * one" a single step, so two callers with the same request get one build and one fill: the
 * second joins the first's flight and is answered when it lands. A flight's fill goes on while
 * any waiter still waits; its landing gives every waiter still there a reference, in the same
 * step that makes the build findable by key.
 *
 * References belong to processes (build-caller.c); the watcher thread (build-watch.c) drops a
 * process's references when its pidfd says it exited, and frees builds whose grace period
 * ended. Every change of a build's holders is saved after it, outside both locks
 * (build-holders-keep.c), before the call that made it is answered. Lock order: the sharing
 * lock, then the build table's; the keep lock is taken under neither; nothing here calls into
 * gRPC.
 */

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "build-holders-keep.h"
#include "codec/codec-build-holders.h"
#include "common/log.h"

struct BuildFlight {
        BuildFlight *next;
        uint8_t *key; /* NULL: private, never joined */
        size_t key_size;
        bool writable, private_build;
        uint32_t owner_uid; /* the uid of the Build that made it */
        bool share_group;
        BuildBinding binding; /* a training handout: the process of the Build that made it */
        BuildWaiter *waiters; /* the first is the Build that made the flight */
        size_t n_waiters;
};

struct BuildSharing {
        pthread_mutex_t lock; /* flights */
        BuildFlight *flights;
        uint64_t grace_ms;
        atomic_uint_fast64_t fills_started;
        atomic_uint_fast64_t bytes_filled;
        atomic_uint_fast64_t checkpoint_ranks, checkpoint_bytes_read, checkpoint_reads;
        Builder builder; /* a copy, sharing included, for the watcher */
        BuildWatch *watch;
        pthread_mutex_t keep_lock; /* one save of holders at a time (build-holders-keep.c) */
        BuildReleased *released;   /* freed builds' shards clients still hold */
};

int64_t build_now_ms(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_REALTIME, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void build_count_fill(const Builder *builder, uint64_t bytes) {
        if (!builder->sharing)
                return;
        atomic_fetch_add(&builder->sharing->fills_started, 1);
        atomic_fetch_add(&builder->sharing->bytes_filled, bytes);
}

void build_count_checkpoint_read(const Builder *builder, unsigned ranks, uint64_t bytes,
                                 uint64_t calls) {
        if (!builder->sharing)
                return;
        atomic_fetch_add(&builder->sharing->checkpoint_ranks, ranks);
        atomic_fetch_add(&builder->sharing->checkpoint_bytes_read, bytes);
        atomic_fetch_add(&builder->sharing->checkpoint_reads, calls);
}

void build_counters(const Builder *builder, BuildCounters *ret) {
        *ret = (BuildCounters) {};
        if (!builder || !builder->sharing)
                return;
        ret->fills_started = atomic_load(&builder->sharing->fills_started);
        ret->bytes_filled = atomic_load(&builder->sharing->bytes_filled);
        ret->checkpoint_ranks = atomic_load(&builder->sharing->checkpoint_ranks);
        ret->checkpoint_bytes_read = atomic_load(&builder->sharing->checkpoint_bytes_read);
        ret->checkpoint_reads = atomic_load(&builder->sharing->checkpoint_reads);
        ret->builds_in_grace = build_table_count_idle(builder->manager->builds);
}

uint64_t build_sharing_grace_ms(const Builder *builder) {
        return builder->sharing ? builder->sharing->grace_ms : 0;
}

pthread_mutex_t *build_sharing_keep_lock(const Builder *builder) {
        return builder->sharing ? &builder->sharing->keep_lock : NULL;
}

BuildReleased *build_sharing_released(const Builder *builder) {
        return builder->sharing ? builder->sharing->released : NULL;
}

void build_released_use(const Builder *builder, BuildReleasedUse *ret) {
        build_released_sweep(builder ? build_sharing_released(builder) : NULL, ret);
}

BuildWatch *build_sharing_watch(const Builder *builder) {
        return builder->sharing ? builder->sharing->watch : NULL;
}

int build_sharing_start(Builder *builder, uint64_t grace_ms) {
        BuildSharing *s = calloc(1, sizeof *s);
        int r;

        if (!s)
                return -ENOMEM;
        /* A shell that did not start the fill threads with its own size gets the default. */
        r = build_fill_start(builder, 0);
        if (r < 0) {
                free(s);
                return r;
        }
        r = build_released_new(&s->released);
        if (r < 0) {
                free(s);
                return r;
        }
        (void) pthread_mutex_init(&s->lock, NULL);
        (void) pthread_mutex_init(&s->keep_lock, NULL);
        s->grace_ms = grace_ms;
        builder->sharing = s;
        s->builder = *builder;
        r = build_watch_new(&s->builder, &s->watch);
        if (r < 0) {
                builder->sharing = NULL;
                (void) pthread_mutex_destroy(&s->keep_lock);
                (void) pthread_mutex_destroy(&s->lock);
                build_released_free(s->released);
                free(s);
                return log_error_errno(r, "Failed to start the build watcher: %m");
        }
        /* Restored builds get back the processes that held them and still live; those left
         * with no holder (and no pin) wait a grace period for their trainers. */
        build_holders_put_back(&s->builder);
        (void) build_table_start_grace(builder->manager->builds, build_now_ms(), grace_ms);
        build_watch_kick(s->watch);
        return 0;
}

void build_sharing_stop(Builder *builder) {
        BuildSharing *s = builder->sharing;

        /* The server and the Build threads have stopped: no fill runs any more. */
        build_fill_stop(builder);
        if (!s)
                return;
        /* The server has drained: no flight is left. */
        build_watch_free(s->watch);
        builder->sharing = NULL;
        build_released_free(s->released);
        (void) pthread_mutex_destroy(&s->keep_lock);
        (void) pthread_mutex_destroy(&s->lock);
        free(s);
}

int build_evict_one(const Builder *builder, bool (*match)(const void *payload)) {
        char id[BUILD_TABLE_ID_MAX];

        for (;;) {
                int r = build_table_oldest_idle_where(builder->manager->builds, match, id);
                if (r < 0)
                        return r;
                r = build_free(builder, id, BUILD_TAKE_IDLE, 0,
                               "freed in its grace period to make room for a new Build", NULL);
                if (r != -EBUSY) /* -EBUSY: a process took it back meanwhile; the next one */
                        return r;
        }
}

int build_evict_one_of_uid(const Builder *builder, uint32_t uid) {
        char id[BUILD_TABLE_ID_MAX];

        for (;;) {
                int r = build_table_oldest_idle_of_uid(builder->manager->builds, uid, id);
                if (r < 0)
                        return r;
                r = build_free(builder, id, BUILD_TAKE_IDLE, 0,
                               "freed in its grace period to make room for a new Build of its "
                               "uid",
                               NULL);
                if (r != -EBUSY)
                        return r;
        }
}

int64_t build_sharing_expire(const Builder *builder) {
        BuildTable *t = builder->manager->builds;

        for (;;) {
                char id[BUILD_TABLE_ID_MAX];
                int64_t next = build_table_next_deadline(t), now = build_now_ms();
                if (next == 0 || next > now)
                        return next;
                if (build_table_oldest_idle(t, id) < 0)
                        return 0;
                (void) build_free(builder, id, BUILD_TAKE_EXPIRED, now,
                                  "freed: nothing held it for its grace period", NULL);
        }
}

void build_sharing_grace_changed(const Builder *builder) {
        if (!builder->sharing)
                return;
        if (builder->sharing->grace_ms == 0)
                (void) build_sharing_expire(builder);
        build_watch_kick(builder->sharing->watch);
}

void build_sharing_process_gone(const Builder *builder, const BuildCaller *caller) {
        BuildRecord **list = NULL;
        size_t n_list = 0;
        size_t n = build_table_drop_process_list(builder->manager->builds, caller->pid,
                                                 caller->start_time, build_now_ms(),
                                                 build_sharing_grace_ms(builder), &list, &n_list);
        build_holders_save_list(builder, list, n_list);
        build_list_free(list, n_list);
        if (n > 0)
                log_debug("Process %d exited: %zu build%s it held now nothing holds.",
                          (int) caller->pid, n, n == 1 ? "" : "s");
        if (n > 0 && build_sharing_grace_ms(builder) == 0)
                (void) build_sharing_expire(builder);
}

static BuildHolder holder_of(const BuildCaller *c) {
        return (BuildHolder) { .pid = c->pid, .uid = c->uid, .start_time = c->start_time,
                               .since_ms = build_now_ms() };
}

static int holder_limit(FamilyError *e) {
        return family_error_set(e, FAMILY_STATUS_RESOURCE_EXHAUSTED, "HOLDER_LIMIT", NULL,
                                "holder limit reached: %u processes", BUILD_TABLE_MAX_HOLDERS);
}

static BuildFlight *flight_find(BuildSharing *s, const uint8_t *key, size_t size) {
        for (BuildFlight *f = s->flights; f; f = f->next)
                if (f->key && f->key_size == size && memcmp(f->key, key, size) == 0)
                        return f;
        return NULL;
}

static int flight_add_waiter(BuildFlight *f, const BuildWaiter *w) {
        BuildWaiter *n = reallocarray(f->waiters, f->n_waiters + 1, sizeof *n);
        if (!n)
                return -ENOMEM;
        f->waiters = n;
        f->waiters[f->n_waiters] = *w;
        f->waiters[f->n_waiters].pidfd = -1; /* the watcher has it */
        f->n_waiters++;
        return 0;
}

static void flight_free(BuildFlight *f) {
        if (!f)
                return;
        free(f->key);
        free(f->waiters);
        free(f);
}

/* Under s->lock: a live build with the key, now held by w too: answered. 0: none. */
static int share_live(const Builder *builder, const uint8_t *key, size_t size,
                      const BuildWaiter *w, BuildRecord **ret, FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        BuildHolder h = holder_of(&w->caller);
        int r;

        if (build_table_find_key(builder->manager->builds, key, size, &rec) < 0)
                return 0;
        r = build_table_hold(builder->manager->builds, rec, &h);
        if (r == -ESTALE) /* freed meanwhile (its grace ended): as if not found */
                return 0;
        if (r == -E2BIG)
                return holder_limit(ret_error);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(rec);
        return 1;
}

int build_draft_share(const Builder *builder, const BuildRequest *req, const char *shard_socket,
                      BuildWaiter *w, BuildDraft **ret, FamilyError *ret_error) {
        BuildSharing *s = builder->sharing;
        _cleanup_(build_state_freep) BuildState *b = NULL;
        _cleanup_(build_record_unrefp) BuildRecord *live = NULL;
        _cleanup_free_ uint8_t *key = NULL;
        BuildFlight *f = NULL;
        size_t key_size = 0;
        int r;

        r = build_watch_add(s->watch, &w->caller, TAKE_FD(w->pidfd));
        if (r == -E2BIG)
                return holder_limit(ret_error);
        if (r < 0)
                return r;
        r = build_draft_prepare(builder, req, shard_socket, w->caller.uid, &b, ret_error);
        if (r < 0)
                return r;
        b->charge = (BuildCharge) { .charged = true, .exempt = w->admin, .uid = w->caller.uid };
        /* A training handout: private and writable, its bytes are its maker's alone. */
        if (req->private_build && req->writable)
                b->binding = (BuildBinding) { .bound = true,
                                              .pid = w->caller.pid,
                                              .start_time = w->caller.start_time };
        if (!req->private_build) {
                r = build_share_key(b, req->writable, w->caller.uid, w->share_group, &key,
                                    &key_size);
                if (r < 0)
                        return r;
        }

        (void) pthread_mutex_lock(&s->lock);
        if (key) {
                r = share_live(builder, key, key_size, w, &live, ret_error);
                if (r != 0)
                        goto unlock;
                f = flight_find(s, key, key_size);
                if (f) {
                        r = flight_add_waiter(f, w);
                        if (r >= 0)
                                r = BUILD_SHARE_JOINED;
                        goto unlock;
                }
        }
        f = calloc(1, sizeof *f);
        r = f ? flight_add_waiter(f, w) : -ENOMEM;
        if (r >= 0)
                r = build_draft_reserve(builder, b, ret, ret_error);
        if (r >= 0) {
                f->binding = b->binding;
                TAKE_PTR(b); /* the draft's */
                f->key = TAKE_PTR(key);
                f->key_size = key_size;
                f->writable = req->writable;
                f->private_build = req->private_build;
                f->owner_uid = w->caller.uid;
                f->share_group = w->share_group;
                f->next = s->flights;
                s->flights = f;
                build_draft_set_flight(*ret, TAKE_PTR(f));
                r = BUILD_SHARE_NEW;
        }
        flight_free(f);
unlock:
        (void) pthread_mutex_unlock(&s->lock);
        if (live) {
                /* Kept before the answer: a trainer answered is a holder a restart knows. */
                build_holders_save(builder, live);
                w->done(w->userdata, live, true, NULL);
                return BUILD_SHARE_ANSWERED;
        }
        return r;
}

bool build_flight_abandoned(const Builder *builder, BuildFlight *f) {
        bool all = true;

        (void) pthread_mutex_lock(&builder->sharing->lock);
        for (size_t i = 0; i < f->n_waiters && all; i++)
                all = f->waiters[i].expired(f->waiters[i].userdata);
        (void) pthread_mutex_unlock(&builder->sharing->lock);
        return all;
}

static void flight_unlist(BuildSharing *s, BuildFlight *f) {
        for (BuildFlight **p = &s->flights; *p; p = &(*p)->next)
                if (*p == f) {
                        *p = f->next;
                        return;
                }
}

int build_error_copy(const FamilyError *from, FamilyError *to) {
        FamilyError e = { .status = from->status, .reason = from->reason };

        e.field = from->field ? strdup(from->field) : NULL;
        e.message = strdup(strempty(from->message));
        if ((from->field && !e.field) || !e.message) {
                family_error_done(&e);
                return -ENOMEM;
        }
        family_error_done(to);
        *to = e;
        return -EINVAL;
}

void build_set_shard_access(const Builder *builder, const BuildRecord *rec, bool has_owner,
                            uint32_t owner_uid, bool share_group, const BuildBinding *binding) {
        const BuildState *b = rec->payload;
        bool bound = binding && binding->bound;

        if (!builder->shards || (!has_owner && !bound) || !b)
                return;
        shard_table_set_access(builder->shards, b->group.hex,
                               &(ShardAccess) { .restricted = has_owner && !share_group,
                                                .owner_uid = owner_uid,
                                                .bound = bound,
                                                .pid = bound ? binding->pid : 0,
                                                .start_time = bound ? binding->start_time : 0 });
}

void build_flight_land(const Builder *builder, BuildFlight *f, BuildRecord *rec,
                       const FamilyError *error) {
        BuildSharing *s = builder->sharing;
        BuildTable *t = builder->manager->builds;
        bool *held;

        (void) pthread_mutex_lock(&s->lock);
        /* Under the lock: waiters join until the flight is unlisted. */
        held = calloc(f->n_waiters ? f->n_waiters : 1, sizeof(bool));
        if (rec) {
                /* Held by processes only once its waiters hold it: until then nothing may
                 * take it for idle (a grace of 0 would free it at once). */
                BuildRecordInit init = {
                        .referenced = false,
                        .writable = f->writable,
                        .private_build = f->private_build,
                        .has_owner = true,
                        .owner_uid = f->owner_uid,
                        .share_group = f->share_group,
                        .binding = f->binding,
                        .created_ms = build_now_ms(),
                        .key = TAKE_PTR(f->key),
                        .key_size = f->key_size,
                };
                build_table_init_holding(t, rec, &init);
                build_set_shard_access(builder, rec, true, f->owner_uid, f->share_group,
                                       &f->binding);
                for (size_t i = 0; i < f->n_waiters && held; i++) {
                        BuildWaiter *w = &f->waiters[i];
                        BuildHolder h = holder_of(&w->caller);
                        held[i] = !w->expired(w->userdata) && build_table_hold(t, rec, &h) >= 0;
                }
                build_table_set_referenced(t, rec);
        }
        flight_unlist(s, f);
        (void) pthread_mutex_unlock(&s->lock);
        if (rec)
                build_holders_save(builder, rec);

        for (size_t i = 0; i < f->n_waiters; i++) {
                BuildWaiter *w = &f->waiters[i];
                FamilyError e = FAMILY_ERROR_NULL;

                if (rec && held && held[i]) {
                        w->done(w->userdata, rec, i > 0, NULL);
                        continue;
                }
                if (!rec)
                        (void) build_error_copy(error, &e);
                else
                        (void) family_error_set(&e, FAMILY_STATUS_DEADLINE_EXCEEDED, "DEADLINE",
                                                NULL,
                                                "the call ended (deadline or shutdown) while "
                                                "materialising; nothing was kept");
                w->done(w->userdata, NULL, false, &e);
                family_error_done(&e);
        }
        free(held);
        flight_free(f);
        /* Every waiter gone before its reference: the build waits out its grace period. */
        if (rec) {
                (void) build_table_start_grace(t, build_now_ms(), s->grace_ms);
                build_sharing_grace_changed(builder);
        }
}

typedef struct RunContext {
        const Builder *builder;
        BuildFlight *flight;
        bool (*stopping)(void *userdata);
        void *userdata;
} RunContext;

static bool run_expired(void *userdata) {
        RunContext *x = userdata;
        return x->stopping(x->userdata) || build_flight_abandoned(x->builder, x->flight);
}

void build_draft_run(BuildDraft *d, bool (*stopping)(void *userdata), void *userdata) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        Builder builder = *build_draft_builder(d);
        RunContext x = { &builder, build_draft_flight(d), stopping, userdata };
        int r;

        r = build_draft_finish(d, run_expired, &x, &rec, &e);
        if (r < 0 && !family_error_is_set(&e))
                (void) family_error_set(&e, r == -ENOMEM ? FAMILY_STATUS_RESOURCE_EXHAUSTED
                                                         : FAMILY_STATUS_INTERNAL,
                                        r == -ENOMEM ? "OUT_OF_MEMORY" : "INTERNAL", NULL,
                                        r == -ENOMEM ? "familyd is out of memory"
                                                     : "internal error: %s",
                                        strerror(-r));
        build_flight_land(&builder, x.flight, r < 0 ? NULL : rec, &e);
}

int build_release_held(const Builder *builder, const char *id, const BuildCaller *caller,
                       const BuildActor *actor, bool force, bool *ret_freed,
                       FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        BuildTable *t = builder->manager->builds;
        int r;

        r = build_table_get(t, id, &rec, ret_error);
        if (r < 0)
                return r;
        if (force || !rec->holding.referenced || !builder->sharing) {
                _cleanup_(build_holding_done) BuildHolding h = {};

                r = build_table_holding(t, rec, &h);
                if (r < 0)
                        return r;
                /* Without references, a release frees: only its owner's uid or an admin. */
                if (!force && actor && !actor->admin && h.has_owner && h.owner_uid != actor->uid)
                        return family_error_set(ret_error, FAMILY_STATUS_PERMISSION_DENIED,
                                                "RELEASE_NOT_ALLOWED", "build_id",
                                                "ReleaseBuild of a build that no process holds "
                                                "frees it, which needs its owner (uid %" PRIu32
                                                ") or an admin; uid %" PRIu32 " is neither",
                                                h.owner_uid, actor->uid);
                r = build_free(builder, id, BUILD_TAKE_ANY, 0,
                               force ? "released by force" : "released", ret_error);
                if (r < 0)
                        return r;
                *ret_freed = true;
                return 0;
        }
        if (!caller)
                return -ENOTCONN;
        r = build_table_unhold(t, rec, caller->pid, caller->start_time, build_now_ms(),
                               build_sharing_grace_ms(builder), ret_error);
        if (r < 0)
                return r;
        *ret_freed = false;
        build_holders_save(builder, rec);
        if (r > 0 && build_sharing_grace_ms(builder) == 0)
                *ret_freed = build_free(builder, id, BUILD_TAKE_EXPIRED, build_now_ms(),
                                        "released by its last holder", NULL) >= 0;
        else if (r > 0)
                build_sharing_grace_changed(builder);
        return 0;
}

int build_pin(const Builder *builder, const char *id, const BuildActor *actor, bool pin,
              BuildRecord **ret, FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        BuildTable *t = builder->manager->builds;
        BuildPinner p = { .uid = actor->uid, .admin = actor->admin };
        uint64_t grace_ms = build_sharing_grace_ms(builder);
        int r;

        r = build_table_get(t, id, &rec, ret_error);
        if (r < 0)
                return r;
        r = build_table_pin_as(t, rec, &p, pin, build_now_ms(), grace_ms, ret_error);
        if (r < 0)
                return r;
        build_holders_save(builder, rec);
        if (r > 0)
                build_sharing_grace_changed(builder);
        *ret = TAKE_PTR(rec);
        return 0;
}

void build_draft_fail(BuildDraft *d, const FamilyError *error) {
        Builder builder = *build_draft_builder(d);
        BuildFlight *f = build_draft_flight(d);

        build_draft_abandon(d);
        build_flight_land(&builder, f, NULL, error);
}

/* build-state.c: a live build's state: freeing it, and describing it to the codecs; the
 * progress of builds being filled (WatchBuild). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "build.h"
#include "build-state.h"

_Static_assert(SHARD_TOKEN_LENGTH == CODEC_TOKEN_LENGTH, "a token is a token");

void build_state_free(void *p) {
        BuildState *b = p;

        if (!b)
                return;
        for (size_t i = 0; i < b->n_ranks; i++) {
                free(b->ranks[i].node);
                shard_segment_unref(b->ranks[i].segment);
        }
        free(b->ranks);
        accel_reservation_free(b->device_memory);
        layout_done(&b->layout);
        if (b->counted_mesh) {
                mesh_build_release(b->counted_mesh);
                mesh_unref(b->counted_mesh);
        }
        build_plan_done(&b->plan);
        build_checkpoint_free(b->checkpoint);
        free(b->checkpoint_prefix);
        free(b);
}

int build_state_describe(const BuildState *b, Arena *a, CodecBuild *ret) {
        CodecBuildRank *ranks = arena_alloc_array(a, b->n_ranks ? b->n_ranks : 1,
                                                  sizeof(CodecBuildRank));

        if (!ranks)
                return -ENOMEM;
        for (size_t i = 0; i < b->n_ranks; i++) {
                const BuildRankState *rs = &b->ranks[i];
                ranks[i] = (CodecBuildRank) {
                        .node = rs->node,
                        .local_device = rs->local_device,
                        .device_kind = rs->device_kind,
                        .allocation_bytes = rs->materialized ? rs->allocation_bytes : 0,
                        .token = rs->materialized ? rs->token.hex : NULL,
                };
        }
        *ret = (CodecBuild) {
                .plan = &b->plan,
                .layout = &b->layout,
                .dtype = b->dtype,
                .seed = b->seed,
                .group = b->group.hex,
                .ranks = ranks,
                .n_ranks = b->n_ranks,
                .writable = b->writable,
                .registry_digest = b->registry_digest,
        };
        return 0;
}

size_t build_state_segments(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized;
        return n;
}

size_t build_state_own_segments(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized && !b->ranks[i].replica;
        return n;
}

size_t build_state_replicas(const BuildState *b) {
        size_t n = 0;
        for (size_t i = 0; i < b->n_ranks; i++)
                n += b->ranks[i].materialized && b->ranks[i].replica;
        return n;
}

bool build_rank_on_gpu(const BuildRankState *rs) {
        return streq_ptr(rs->device_kind, SHARD_SEGMENT_DEVICE_KIND_CUDA);
}

bool build_state_has_gpu_shards(const BuildState *b) {
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && build_rank_on_gpu(&b->ranks[i]))
                        return true;
        return false;
}

/* ---- progress of materialising builds ---------------------------------------------------- */

struct BuildProgress {
        BuildProgressTable *table;
        struct BuildProgress *next;
        char id[BUILD_TABLE_ID_MAX];
        char *tag;    /* NULL: none */
        char *family;
        uint64_t total_bytes;
        FillProgress fill;
        /* A Build from a checkpoint: the bytes to read from its files, and read so far. */
        atomic_uint_fast64_t read_total, read_bytes;
        atomic_uint_fast64_t last_tick_usec; /* CLOCK_MONOTONIC: changed() last called */
        uint64_t started_usec;               /* CLOCK_MONOTONIC */
        int64_t started_unix_ms;
        /* Under the table's lock: */
        bool ended, failed;
        uint64_t ended_usec;
        char *error;
};

struct BuildProgressTable {
        pthread_mutex_t lock;
        BuildProgress *list; /* oldest first */
        /* Held while changed() runs, so that clearing it waits for the calls under way. */
        pthread_mutex_t hook_lock;
        void (*changed)(void *userdata);
        void *userdata;
};

static uint64_t progress_now_usec(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static BuildProgress *progress_free(BuildProgress *p) {
        if (!p)
                return NULL;
        free(p->tag);
        free(p->family);
        free(p->error);
        free(p);
        return NULL;
}

int build_progress_table_new(void (*changed)(void *userdata), void *userdata,
                             BuildProgressTable **ret) {
        BuildProgressTable *t = calloc(1, sizeof *t);

        if (!t)
                return -ENOMEM;
        (void) pthread_mutex_init(&t->lock, NULL);
        (void) pthread_mutex_init(&t->hook_lock, NULL);
        t->changed = changed;
        t->userdata = userdata;
        *ret = t;
        return 0;
}

BuildProgressTable *build_progress_table_free(BuildProgressTable *t) {
        if (!t)
                return NULL;
        while (t->list) {
                BuildProgress *p = t->list;
                t->list = p->next;
                progress_free(p);
        }
        (void) pthread_mutex_destroy(&t->lock);
        (void) pthread_mutex_destroy(&t->hook_lock);
        free(t);
        return NULL;
}

void build_progress_table_set_changed(BuildProgressTable *t, void (*changed)(void *userdata),
                                      void *userdata) {
        if (!t)
                return;
        (void) pthread_mutex_lock(&t->hook_lock);
        t->changed = changed;
        t->userdata = userdata;
        (void) pthread_mutex_unlock(&t->hook_lock);
}

/* Under the lock: ended builds past BUILD_PROGRESS_KEEP_MS, and the oldest ended ones past
 * BUILD_PROGRESS_KEEP_ENDED, go. */
static void progress_prune(BuildProgressTable *t, uint64_t now) {
        size_t n_ended = 0;

        for (BuildProgress *p = t->list; p; p = p->next)
                n_ended += p->ended;
        for (BuildProgress **pp = &t->list; *pp;) {
                BuildProgress *p = *pp;
                if (p->ended && (n_ended > BUILD_PROGRESS_KEEP_ENDED ||
                                 now - p->ended_usec > BUILD_PROGRESS_KEEP_MS * 1000ull)) {
                        *pp = p->next;
                        progress_free(p);
                        n_ended--;
                        continue;
                }
                pp = &p->next;
        }
}

static void progress_changed(BuildProgressTable *t) {
        (void) pthread_mutex_lock(&t->hook_lock);
        if (t->changed)
                t->changed(t->userdata);
        (void) pthread_mutex_unlock(&t->hook_lock);
}

/* On a fill thread after each chunk: tells the watchers, at most every tick. */
static void progress_on_chunk(FillProgress *f) {
        BuildProgress *p = container_of(f, BuildProgress, fill);
        uint64_t now = progress_now_usec();
        uint_fast64_t last = atomic_load_explicit(&p->last_tick_usec, memory_order_relaxed);

        if (now - last < BUILD_PROGRESS_TICK_MS * 1000ull)
                return;
        if (atomic_compare_exchange_strong(&p->last_tick_usec, &last, now))
                progress_changed(p->table);
}

int build_progress_start(BuildProgressTable *t, const char *id, const char *tag,
                         const char *family, uint64_t total_bytes, BuildProgress **ret) {
        BuildProgress *p = calloc(1, sizeof *p);
        struct timespec ts;

        if (!p)
                return -ENOMEM;
        p->table = t;
        (void) snprintf(p->id, sizeof p->id, "%s", id);
        p->tag = isempty(tag) ? NULL : strdup(tag);
        p->family = strdup(strempty(family));
        if ((!isempty(tag) && !p->tag) || !p->family) {
                progress_free(p);
                return -ENOMEM;
        }
        p->total_bytes = total_bytes;
        p->fill.on_chunk = progress_on_chunk;
        p->started_usec = progress_now_usec();
        atomic_init(&p->last_tick_usec, p->started_usec);
        (void) clock_gettime(CLOCK_REALTIME, &ts);
        p->started_unix_ms = (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;

        (void) pthread_mutex_lock(&t->lock);
        progress_prune(t, p->started_usec);
        BuildProgress **pp = &t->list;
        while (*pp)
                pp = &(*pp)->next;
        *pp = p;
        (void) pthread_mutex_unlock(&t->lock);
        progress_changed(t);
        *ret = p;
        return 0;
}

FillProgress *build_progress_fill(BuildProgress *p) {
        return p ? &p->fill : NULL;
}

void build_progress_advance(BuildProgress *p, uint64_t done) {
        if (!p)
                return;
        uint_fast64_t cur = atomic_load(&p->fill.bytes);
        while (cur < done && !atomic_compare_exchange_weak(&p->fill.bytes, &cur, done))
                ;
}

void build_progress_reading(BuildProgress *p, uint64_t total) {
        if (p)
                atomic_store(&p->read_total, total);
}

void build_progress_add_read(BuildProgress *p, uint64_t bytes) {
        if (!p)
                return;
        atomic_fetch_add(&p->read_bytes, bytes);
        progress_on_chunk(&p->fill);
}

void build_progress_end(BuildProgress *p, int r, const FamilyError *error) {
        if (!p)
                return;
        BuildProgressTable *t = p->table;
        char *text = NULL;

        if (r < 0)
                text = strdup(error && family_error_is_set(error) ? strempty(error->message)
                                                                  : strerror(-r));
        (void) pthread_mutex_lock(&t->lock);
        p->ended = true;
        p->failed = r < 0;
        p->ended_usec = progress_now_usec();
        p->error = text;
        if (r >= 0)
                build_progress_advance(p, p->total_bytes);
        (void) pthread_mutex_unlock(&t->lock);
        progress_changed(t);
}

/* Under the lock: p as the messages carry it, strings copied into a. */
static int progress_view(const BuildProgress *p, Arena *a, uint64_t now, CodecBuildProgress *ret) {
        uint64_t end = p->ended ? p->ended_usec : now;
        uint64_t elapsed_usec = end > p->started_usec ? end - p->started_usec : 0;
        uint64_t bytes = MIN((uint64_t) atomic_load(&p->fill.bytes), p->total_bytes);

        *ret = (CodecBuildProgress) {
                .build_id = arena_strdup(a, p->id),
                .progress_tag = p->tag ? arena_strdup(a, p->tag) : NULL,
                .family = arena_strdup(a, p->family),
                .error = p->error ? arena_strdup(a, p->error) : NULL,
                .state = !p->ended   ? CODEC_BUILD_PROGRESS_FILLING
                         : p->failed ? CODEC_BUILD_PROGRESS_FAILED
                                     : CODEC_BUILD_PROGRESS_DONE,
                .bytes_filled = bytes,
                .bytes_total = p->total_bytes,
                .bytes_per_second = elapsed_usec > 0
                                            ? (uint64_t) ((double) bytes * 1e6 /
                                                          (double) elapsed_usec)
                                            : 0,
                .elapsed_ms = elapsed_usec / 1000u,
                .started_unix_ms = p->started_unix_ms,
                .bytes_read = atomic_load(&p->read_bytes),
                .bytes_to_read = atomic_load(&p->read_total),
        };
        if (!ret->build_id || !ret->family || (p->tag && !ret->progress_tag) ||
            (p->error && !ret->error))
                return -ENOMEM;
        return 0;
}

int build_progress_find(BuildProgressTable *t, const char *id, const char *tag, Arena *a,
                        CodecBuildProgress *ret) {
        const BuildProgress *found = NULL;
        uint64_t now = progress_now_usec();
        int r = -ENOENT;

        (void) pthread_mutex_lock(&t->lock);
        progress_prune(t, now);
        for (const BuildProgress *p = t->list; p; p = p->next)
                if (isempty(id) ? streq_ptr(p->tag, tag) : streq(p->id, id))
                        found = p; /* the latest */
        if (found)
                r = progress_view(found, a, now, ret);
        (void) pthread_mutex_unlock(&t->lock);
        return r;
}

int build_progress_list(BuildProgressTable *t, Arena *a, CodecBuildProgress **ret,
                        size_t *ret_n) {
        CodecBuildProgress *list = NULL;
        uint64_t now = progress_now_usec();
        size_t n = 0;
        int r = 0;

        (void) pthread_mutex_lock(&t->lock);
        for (const BuildProgress *p = t->list; p; p = p->next)
                n += !p->ended;
        if (n > 0 && !(list = arena_alloc(a, n * sizeof *list)))
                r = -ENOMEM;
        n = 0;
        for (const BuildProgress *p = t->list; r >= 0 && p; p = p->next)
                if (!p->ended)
                        r = progress_view(p, a, now, &list[n++]);
        (void) pthread_mutex_unlock(&t->lock);
        if (r < 0)
                return r;
        *ret = list;
        *ret_n = n;
        return 0;
}

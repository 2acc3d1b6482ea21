/* fill-share.c: equal host fills computed once: a fill that finds an equal one under way copies it. */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "common/populate.h"
#include "fill-share.h"

/* How often a waiting follower asks whether its own fill is cancelled. */
#define FILL_SHARE_POLL_MS 5

typedef enum LeaderState {
        LEADER_FILLING,
        LEADER_FILLED,
        LEADER_FAILED,
} LeaderState;

typedef struct Leader {
        struct Leader *next;
        ShardSegment *seg;              /* mapped until every follower has copied */
        const MaterializeSlice *slices; /* borrowed: the leader's call keeps them */
        size_t n;
        LeaderState state;
        unsigned followers; /* waiting for the fill, or copying */
} Leader;

struct FillShare {
        pthread_mutex_t lock;
        pthread_cond_t changed; /* a leader's state or follower count */
        Leader *leaders;
        unsigned waiting;
};

int fill_share_new(FillShare **ret) {
        pthread_condattr_t attr;
        FillShare *s;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        (void) pthread_mutex_init(&s->lock, NULL);
        (void) pthread_condattr_init(&attr);
        (void) pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        (void) pthread_cond_init(&s->changed, &attr);
        (void) pthread_condattr_destroy(&attr);
        *ret = s;
        return 0;
}

FillShare *fill_share_free(FillShare *s) {
        if (!s)
                return NULL;
        (void) pthread_cond_destroy(&s->changed);
        (void) pthread_mutex_destroy(&s->lock);
        return mfree(s);
}

static bool dims_equal(const int64_t *a, const int64_t *b, size_t n) {
        return n == 0 || memcmp(a, b, n * sizeof(int64_t)) == 0;
}

/* Equal specs give equal values: the value of an element depends on the spec's fields only. */
static bool spec_equal(const FillSpec *a, const FillSpec *b) {
        return a->kind == b->kind && memcmp(&a->a, &b->a, sizeof a->a) == 0 &&
               memcmp(&a->b, &b->b, sizeof a->b) == 0 && a->seed == b->seed &&
               a->name_hash == b->name_hash && a->dtype == b->dtype;
}

static bool slice_equal(const MaterializeSlice *a, const MaterializeSlice *b) {
        return spec_equal(a->fill.spec, b->fill.spec) && a->fill.rank == b->fill.rank &&
               dims_equal(a->fill.shape, b->fill.shape, a->fill.rank) &&
               dims_equal(a->fill.local_shape, b->fill.local_shape, a->fill.rank) &&
               dims_equal(a->fill.global_offset, b->fill.global_offset, a->fill.rank) &&
               a->byte_offset == b->byte_offset && a->byte_length == b->byte_length;
}

static bool slices_equal(const MaterializeSlice *a, size_t n_a, const MaterializeSlice *b, size_t n_b) {
        if (n_a != n_b)
                return false;
        for (size_t i = 0; i < n_a; i++)
                if (!slice_equal(&a[i], &b[i]))
                        return false;
        return true;
}

/* A leader filling slices equal to these, or NULL. Under the lock. */
static Leader *leader_find(FillShare *s, const MaterializeSlice *slices, size_t n) {
        for (Leader *l = s->leaders; l; l = l->next)
                if (l->state == LEADER_FILLING && slices_equal(l->slices, l->n, slices, n))
                        return l;
        return NULL;
}

static void leader_unlink(FillShare *s, Leader *l) {
        for (Leader **p = &s->leaders; *p; p = &(*p)->next)
                if (*p == l) {
                        *p = l->next;
                        return;
                }
}

static void wait_poll(FillShare *s) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += FILL_SHARE_POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
        }
        (void) pthread_cond_timedwait(&s->changed, &s->lock, &ts);
}

/* Copies the leader's slices into seg (its bounds checked as materialize_host_write's). */
static int copy_slices(const Leader *l, ShardSegment *seg, const MaterializeSlice *slices, size_t n) {
        const uint8_t *from = shard_segment_data(l->seg);
        uint8_t *to = shard_segment_data(seg);

        if (!from || !to)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                if (slices[i].byte_length > shard_segment_size(seg) ||
                    slices[i].byte_offset > shard_segment_size(seg) - slices[i].byte_length)
                        return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                (void) memory_populate_write(to + slices[i].byte_offset, slices[i].byte_length);
                memcpy(to + slices[i].byte_offset, from + slices[i].byte_offset,
                       slices[i].byte_length);
                fill_bound_progress_add(slices[i].byte_length);
        }
        return 0;
}

/*
 * As a follower of l (the lock held, l->followers counted): waits for its fill, then copies.
 * Returns FILL_SHARE_COPIED, -ECANCELED (this fill was cancelled while waiting), -EAGAIN (the
 * leader failed: fill alone) or copy_slices()'s error. Returns with the lock held.
 */
static int follow(FillShare *s, Leader *l, ShardSegment *seg, const MaterializeSlice *slices, size_t n) {
        int r;

        s->waiting++;
        (void) pthread_cond_broadcast(&s->changed);
        while (l->state == LEADER_FILLING) {
                bool cancelled;

                /* The binding's callback runs without our lock: it may take its own. */
                (void) pthread_mutex_unlock(&s->lock);
                cancelled = fill_bound_cancelled();
                (void) pthread_mutex_lock(&s->lock);
                if (cancelled) {
                        s->waiting--;
                        return -ECANCELED;
                }
                if (l->state != LEADER_FILLING)
                        break;
                wait_poll(s);
        }
        s->waiting--;
        if (l->state == LEADER_FAILED)
                return -EAGAIN;
        /* The leader waits for us: its mapping stays, and nobody else writes it. */
        (void) pthread_mutex_unlock(&s->lock);
        r = copy_slices(l, seg, slices, n);
        (void) pthread_mutex_lock(&s->lock);
        return r < 0 ? r : FILL_SHARE_COPIED;
}

int fill_share_host_fill(FillShare *s, ShardSegment *seg, const MaterializeSlice *slices, size_t n) {
        Leader me = { .seg = seg, .slices = slices, .n = n, .state = LEADER_FILLING };
        Leader *l;
        int r;

        if (!s || n == 0) {
                r = materialize_host_fill(seg, slices, n);
                return r < 0 ? r : FILL_SHARE_FILLED;
        }

        (void) pthread_mutex_lock(&s->lock);
        l = leader_find(s, slices, n);
        if (l) {
                l->followers++;
                r = follow(s, l, seg, slices, n);
                l->followers--;
                (void) pthread_cond_broadcast(&s->changed);
                (void) pthread_mutex_unlock(&s->lock);
                if (r == -EAGAIN) /* the leader failed: fill alone */
                        r = materialize_host_write(seg, slices, n);
                if (r < 0)
                        return r;
                shard_segment_unmap(seg);
                return r == FILL_SHARE_COPIED ? FILL_SHARE_COPIED : FILL_SHARE_FILLED;
        }
        me.next = s->leaders;
        s->leaders = &me;
        (void) pthread_mutex_unlock(&s->lock);

        r = materialize_host_write(seg, slices, n);

        (void) pthread_mutex_lock(&s->lock);
        me.state = r < 0 ? LEADER_FAILED : LEADER_FILLED;
        (void) pthread_cond_broadcast(&s->changed);
        while (me.followers > 0)
                (void) pthread_cond_wait(&s->changed, &s->lock);
        leader_unlink(s, &me);
        (void) pthread_mutex_unlock(&s->lock);
        if (r < 0)
                return r;
        shard_segment_unmap(seg);
        return FILL_SHARE_FILLED;
}

unsigned fill_share_waiting(FillShare *s) {
        unsigned n;

        if (!s)
                return 0;
        (void) pthread_mutex_lock(&s->lock);
        n = s->waiting;
        (void) pthread_mutex_unlock(&s->lock);
        return n;
}

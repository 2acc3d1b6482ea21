/* state-replace.c: records replaced whole beside a kept record (a build's holders), atomically. */

/*
 * DESIGN (state.h, "Replaced records"): the state dir renames a temporary file over the old
 * record, which readers see whole or not at all. The fd store cannot replace a descriptor
 * under its name (FDSTOREREMOVE=1 removes every descriptor of a name), so each write goes
 * under a new name, "metarep-<id>.<generation>", pushed before the old generation is removed:
 * whatever the crash, one whole generation survives, and at start the newest one a record
 * takes wins (state_take_replaced()), older ones are dropped.
 *
 * replace_lock guards the list of ids that may have one and is held through each write: the
 * writes of one id are in order, and state_forget() (which takes it too) cannot slip between
 * a replace's check and its write.
 */

#include <inttypes.h>
#include <stdio.h>

#include "common/log.h"
#include "state-private.h"

int state_name_replaced(const char *id, uint64_t generation, char ret[static STATE_NAME_MAX]) {
        int k;

        /* The generation is what follows the last '.': an id has none. */
        if (isempty(id) || strchr(id, '.') || strchr(id, '/') || strchr(id, ':'))
                return -EINVAL;
        if (generation == 0)
                k = snprintf(ret, STATE_NAME_MAX, STATE_PREFIX_REPLACED "%s", id);
        else
                k = snprintf(ret, STATE_NAME_MAX, STATE_PREFIX_REPLACED "%s.%" PRIu64, id,
                             generation);
        return k < 0 || (size_t) k >= STATE_NAME_MAX ? -ENAMETOOLONG : 0;
}

/* The id and generation a kept name stands for; -EINVAL for a name that is not one. */
static int name_parse(const char *name, char id[static STATE_NAME_MAX], uint64_t *ret_generation) {
        const char *p = name + strlen(STATE_PREFIX_REPLACED), *dot = strrchr(p, '.');
        uint64_t generation = 0;
        size_t len = dot ? (size_t) (dot - p) : strlen(p);

        if (strncmp(name, STATE_PREFIX_REPLACED, strlen(STATE_PREFIX_REPLACED)) != 0 ||
            len == 0 || len >= STATE_NAME_MAX)
                return -EINVAL;
        if (dot) {
                if (dot[1] == 0)
                        return -EINVAL;
                for (const char *q = dot + 1; *q; q++) {
                        if (*q < '0' || *q > '9' || generation > (UINT64_MAX - 9) / 10)
                                return -EINVAL;
                        generation = generation * 10 + (uint64_t) (*q - '0');
                }
        }
        memcpy(id, p, len);
        id[len] = 0;
        *ret_generation = generation;
        return 0;
}

StateReplaced *state_replaced_find(State *s, const char *id) {
        for (size_t i = 0; i < s->n_replaced; i++)
                if (streq(s->replaced[i].id, id))
                        return &s->replaced[i];
        return NULL;
}

StateReplaced *state_replaced_add(State *s, const char *id) {
        char *copy = strdup(id);

        if (!copy || !GREEDY_REALLOC(s->replaced, s->allocated_replaced, s->n_replaced + 1)) {
                free(copy);
                return NULL;
        }
        s->replaced[s->n_replaced] = (StateReplaced) { .id = copy };
        return &s->replaced[s->n_replaced++];
}

void state_replaced_free_all(State *s) {
        for (size_t i = 0; i < s->n_replaced; i++)
                free(s->replaced[i].id);
        s->replaced = mfree(s->replaced);
        s->n_replaced = s->allocated_replaced = 0;
}

/* Room for one more descriptor of ours in the fd store, taken as in use; -ENOSPC. */
static int fd_take_one(State *s) {
        int r = 0;

        (void) pthread_mutex_lock(&s->lock);
        if (s->fd_used + s->fd_reserved >= s->fd_max)
                r = -ENOSPC;
        else
                s->fd_used++;
        (void) pthread_mutex_unlock(&s->lock);
        return r;
}

/* Under replace_lock. */
static int replace_locked(State *s, StateReplaced *e, const uint8_t *data, size_t size) {
        char name[STATE_NAME_MAX], old[STATE_NAME_MAX];
        int r;

        if (s->mode == STATE_MODE_DIR) {
                r = state_name_replaced(e->id, 0, name);
                if (r >= 0)
                        r = state_put_record(s, name, data, size);
                if (r >= 0)
                        e->stored = true;
                return r;
        }

        /* The new generation and the old one are both in the store for a moment. */
        r = state_name_replaced(e->id, e->generation + 1, name);
        if (r >= 0 && e->stored)
                r = state_name_replaced(e->id, e->generation, old);
        if (r < 0)
                return r;
        r = fd_take_one(s);
        if (r < 0)
                return r;
        r = state_put_record(s, name, data, size);
        if (r < 0) {
                state_fd_release(s, 1);
                return r;
        }
        if (e->stored) {
                state_drop(s, old);
                state_fd_release(s, 1);
        }
        e->generation++;
        e->stored = true;
        return 0;
}

int state_replace(State *s, const char *id, const uint8_t *data, size_t size) {
        int r = -ESTALE;

        if (!s || s->mode == STATE_MODE_NONE)
                return 0;
        (void) pthread_mutex_lock(&s->replace_lock);
        StateReplaced *e = state_replaced_find(s, id);
        if (e)
                r = replace_locked(s, e, data, size);
        (void) pthread_mutex_unlock(&s->replace_lock);
        return r;
}

/* Under replace_lock: the newest kept generation of id (its index in replaced_kept), the
 * others dropped; -ENOENT when none. */
static ssize_t take_newest_locked(State *s, const char *id) {
        char kid[STATE_NAME_MAX];
        ssize_t best = -1;
        uint64_t best_generation = 0;

        for (size_t i = 0; i < s->replaced_kept.n; i++) {
                StateFd *it = &s->replaced_kept.items[i];
                uint64_t generation;

                if (it->fd < 0 || name_parse(it->name, kid, &generation) < 0 ||
                    !streq(kid, id))
                        continue;
                if (best >= 0 && generation <= best_generation) {
                        it->fd = safe_close(it->fd);
                        state_drop(s, it->name);
                        continue;
                }
                if (best >= 0) {
                        StateFd *was = &s->replaced_kept.items[best];
                        was->fd = safe_close(was->fd);
                        state_drop(s, was->name);
                }
                best = (ssize_t) i;
                best_generation = generation;
        }
        return best >= 0 ? best : -ENOENT;
}

int state_take_replaced(State *s, const char *id, size_t max, uint8_t **ret, size_t *ret_size) {
        char kid[STATE_NAME_MAX];
        int r;

        if (!s || s->mode == STATE_MODE_NONE)
                return -ENOENT;
        (void) pthread_mutex_lock(&s->replace_lock);
        StateReplaced *e = state_replaced_find(s, id);
        if (!e)
                e = state_replaced_add(s, id);
        if (!e) {
                (void) pthread_mutex_unlock(&s->replace_lock);
                return -ENOMEM;
        }
        ssize_t i = take_newest_locked(s, id);
        if (i < 0) {
                (void) pthread_mutex_unlock(&s->replace_lock);
                return -ENOENT;
        }
        StateFd *it = &s->replaced_kept.items[i];
        r = state_read_record(it->fd, max, ret, ret_size);
        it->fd = safe_close(it->fd);
        if (r == -ENOMEM) {
                (void) pthread_mutex_unlock(&s->replace_lock);
                return r;
        }
        if (r < 0)
                /* Unreadable: it goes; the next replace writes a whole one. */
                state_drop(s, it->name);
        else {
                (void) name_parse(it->name, kid, &e->generation);
                e->stored = true;
                state_fd_commit(s, 1);
        }
        (void) pthread_mutex_unlock(&s->replace_lock);
        return r;
}

void state_drop_untaken_replaced(State *s) {
        if (!s)
                return;
        (void) pthread_mutex_lock(&s->replace_lock);
        for (size_t i = 0; i < s->replaced_kept.n; i++) {
                StateFd *it = &s->replaced_kept.items[i];
                if (it->fd < 0)
                        continue;
                it->fd = safe_close(it->fd);
                log_info("Dropping %s: no kept record names it.", it->name);
                state_drop(s, it->name);
        }
        state_fds_done(&s->replaced_kept);
        (void) pthread_mutex_unlock(&s->replace_lock);
}

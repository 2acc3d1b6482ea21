/* state-private.h: what state.c and state-kept.c share: the State itself. */
#pragma once

#include <pthread.h>

#include "state.h"

#define STATE_TMP_SUFFIX ".tmp"

/* A kept record that may have a record replaced beside it (state_replace()). */
typedef struct StateReplaced {
        char *id;
        uint64_t generation; /* fd store: the name's suffix of the one stored */
        bool stored;
} StateReplaced;

struct State {
        StateMode mode;
        pthread_mutex_t lock;   /* guards the counts */
        size_t fd_max;          /* fd store: our descriptors the manager keeps at most */
        size_t fd_used;         /* ... kept now */
        size_t fd_reserved;     /* ... promised to what is under way */
        char *dir;              /* dir: the state dir */
        int dir_fd;             /* dir: open, flock'ed against a second familyd */
        StateFds records, segments; /* fd store: given back at this start, until taken */
        int (*fdstore_add)(const char *name, int fd);
        int (*fdstore_remove)(const char *name);
        pthread_mutex_t replace_lock; /* the list below, held through each write */
        StateReplaced *replaced;
        size_t n_replaced, allocated_replaced;
        StateFds replaced_kept; /* replaced records given back at this start, until taken */
};

/* state.c for state-kept.c */
int state_put_record(State *s, const char *name, const uint8_t *data, size_t size);
void state_fd_commit(State *s, size_t n);
void state_fd_release(State *s, size_t n);
/* Under replace_lock: the entry of id, or NULL. */
StateReplaced *state_replaced_find(State *s, const char *id);
/* Under replace_lock: a new entry for id (stored: false). */
StateReplaced *state_replaced_add(State *s, const char *id);
void state_replaced_free_all(State *s);
/* "metarep-<id>" (generation 0) or "metarep-<id>.<generation>". */
int state_name_replaced(const char *id, uint64_t generation, char ret[static STATE_NAME_MAX]);

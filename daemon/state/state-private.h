/* state-private.h: what state.c and state-kept.c share: the State itself. */
#pragma once

#include <pthread.h>

#include "state.h"

#define STATE_TMP_SUFFIX ".tmp"

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
};

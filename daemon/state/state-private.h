/* state-private.h: what state.c and state-restore.c share: the State and its name helpers. */
#pragma once

#include <pthread.h>

#include "state.h"

#define STATE_PREFIX_META "meta-"
#define STATE_PREFIX_SHARD "shard-"
#define STATE_TMP_SUFFIX ".tmp"
/* "shard-" + a build id + "-" + a rank: far below STATE_FDNAME_MAX. */
#define STATE_NAME_MAX 96u

struct State {
        StateMode mode;
        pthread_mutex_t lock;   /* guards the counts */
        size_t fd_max;          /* fd store: our descriptors the manager keeps at most */
        size_t fd_used;         /* ... kept now */
        size_t fd_reserved;     /* ... promised to Builds under way */
        char *dir;              /* dir: the state dir */
        int dir_fd;             /* dir: open, flock'ed against a second familyd */
        ListenFd *metas, *shards; /* fd store: given back at this start, until restored */
        size_t n_metas, n_shards;
};

int state_name_meta(const char *id, char ret[static STATE_NAME_MAX]);
int state_name_shard(const char *build_id, int64_t rank, char ret[static STATE_NAME_MAX]);

/* Keeps a record under name: a state dir file (temp file, then rename) or a sealed memfd in
 * the fd store. */
int state_put_record(State *s, const char *name, const uint8_t *data, size_t size);
/* Lets go of name: unlinks the file, or FDSTOREREMOVE. Missing is fine. */
void state_drop(State *s, const char *name);

/* fd store counts. */
int state_fd_reserve(State *s, size_t n, const char *what, FamilyError *ret_error);
void state_fd_unreserve(State *s, size_t n);
void state_fd_commit(State *s, size_t n);
void state_fd_release(State *s, size_t n);

/* The mesh table hooks. */
void state_install_mesh_hooks(State *s, MeshTable *meshes);
/* Keeps a mesh record (CreateMesh, or a build's mesh found without its own record). */
int state_mesh_save(State *s, const Mesh *m, FamilyError *ret_error);

uint64_t state_now_ns(void);
size_t state_build_segments(const BuildState *b);
/* A rank of b materialised here lives in GPU memory: the build is never kept (state.h). */
bool state_build_has_gpu_shards(const BuildState *b);

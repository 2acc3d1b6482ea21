/* shard-table.h: live shard tokens, each naming a segment, grouped by the build that made them. */
#pragma once

/*
 * DESIGN: the one map from a capability to memory, shared by the gRPC workers (Build adds,
 * ReleaseBuild removes a group) and the shard socket's thread (lookups), hence one mutex and
 * an atomic reference count. Tokens are secrets, so lookups never compare them with memcmp or
 * hash them with a function an attacker could steer: buckets come from SipHash-2-4 under a
 * random per-table key, and candidates are compared in constant time. A lookup of many tokens
 * happens under one lock, so a concurrent release yields all of them or none.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"
#include "shm/segment.h"
#include "token.h"

/* Live tokens in one daemon (one per local shard per build): the default cap. */
#define SHARD_TABLE_MAX_TOKENS 65536u
/* A group (a build id) names tokens; longer ones are refused (-EINVAL). */
#define SHARD_TABLE_MAX_GROUP_LENGTH 255u

/* Outcomes a caller handles (see STYLE.md): positive, beside 0 and negative errnos. */
enum {
        SHARD_TABLE_NOT_FOUND = 1, /* an unknown or released token */
        SHARD_TABLE_FULL = 2,      /* the table holds its maximum of tokens */
        SHARD_TABLE_DENIED = 3,    /* a token of a build the asking uid may not map */
        SHARD_TABLE_OTHER_PROCESS = 4, /* a token bound to another process than the asker */
};

/* Who may trade a group's tokens for descriptors. Tokens start open to everyone who can reach
 * the shard socket; a build with an owner restricts them (shard_table_set_access()), and a
 * training handout binds them to the one process that made it: no other process, admins
 * included, gets them. */
typedef struct ShardAccess {
        bool restricted; /* only owner_uid's processes and admins */
        uint32_t owner_uid;
        bool bound; /* only the process (pid, start_time) */
        int32_t pid;
        uint64_t start_time;
} ShardAccess;

/* The asker of a lookup: its uid, whether it is an admin (root, --admin-group), and its
 * process: pid (0: it cannot be named) and start time (field 22 of /proc/PID/stat). */
typedef struct ShardAsker {
        uint32_t uid;
        bool admin;
        int32_t pid;
        uint64_t start_time;
} ShardAsker;

typedef struct ShardTable ShardTable;

/* max_tokens 0: SHARD_TABLE_MAX_TOKENS. */
int shard_table_new(size_t max_tokens, ShardTable **ret);
ShardTable *shard_table_ref(ShardTable *t);
ShardTable *shard_table_unref(ShardTable *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(ShardTable *, shard_table_unref);

/*
 * Files a new reference to segment under a fresh token in group (a build id, not empty).
 * 0 and *ret_token; SHARD_TABLE_FULL; or a negative errno.
 */
int shard_table_add(ShardTable *t, const char *group, ShardSegment *segment,
                    ShardToken *ret_token);

/*
 * Files segment under a token it had before a restart (32 lowercase hex characters, else
 * -EINVAL): -EEXIST when the token is live. The cap does not refuse it: the descriptor is
 * open already, and a table over its cap only refuses new tokens.
 */
int shard_table_restore(ShardTable *t, const char *group, ShardSegment *segment,
                        const char *token);

/* 0 and a new reference in *ret; SHARD_TABLE_NOT_FOUND. token may be anything, even NULL. */
int shard_table_lookup(ShardTable *t, const char *token, ShardSegment **ret);
/* Sets the access of every token of group (a build's, once it has an owner). */
void shard_table_set_access(ShardTable *t, const char *group, const ShardAccess *access);
/* As shard_table_lookup_many(), for asker: SHARD_TABLE_OTHER_PROCESS when a token is bound to
 * another process, else SHARD_TABLE_DENIED when asker's uid may not map it (*ret_bad_index the
 * first such token); nothing is referenced then. */
int shard_table_lookup_many_as(ShardTable *t, const char *const *tokens, size_t n,
                               const ShardAsker *asker, ShardSegment **ret,
                               size_t *ret_bad_index);

/*
 * All or nothing: 0 and n new references in ret[0..n-1]; or SHARD_TABLE_NOT_FOUND with
 * *ret_bad_index the first token not found, and ret untouched.
 */
int shard_table_lookup_many(ShardTable *t, const char *const *tokens, size_t n, ShardSegment **ret,
                            size_t *ret_bad_index);

/* 0, or SHARD_TABLE_NOT_FOUND. */
int shard_table_remove(ShardTable *t, const char *token);
/* Removes every token of group; returns how many. */
size_t shard_table_remove_group(ShardTable *t, const char *group);

size_t shard_table_size(ShardTable *t);
size_t shard_table_max(ShardTable *t);

/* build-table.h: live builds by id, with the build limit and the shared-memory budget. */
#pragma once

/*
 * DESIGN: a Build reserves its bytes and a slot before anything is materialised, so two
 * concurrent Builds cannot both pass the budget check and overshoot it; the reservation either
 * becomes a committed record or is returned. Records are reference-counted: GetBuild may hold
 * one while ReleaseBuild drops the table's hold. What a record carries (plan, layout, shard
 * tokens) is opaque here, released by its own destructor.
 */

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "error.h"

/* "bld-" 8 hex digits "-" a decimal serial, NUL included. */
#define BUILD_TABLE_ID_MAX 40

typedef struct BuildRecord {
        atomic_uint n_ref;
        char id[BUILD_TABLE_ID_MAX];
        uint64_t bytes; /* shared memory held for this build */
        void *payload;
        void (*payload_free)(void *payload);
} BuildRecord;

BuildRecord *build_record_ref(BuildRecord *r);
BuildRecord *build_record_unref(BuildRecord *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(BuildRecord *, build_record_unref);

typedef struct BuildTable BuildTable;

/* boot_tag distinguishes this daemon's ids from an earlier run's ("bld-<tag>-<n>"). */
int build_table_new(unsigned max_builds, uint64_t budget_bytes, uint32_t boot_tag,
                    BuildTable **ret);
BuildTable *build_table_free(BuildTable *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(BuildTable *, build_table_free);

/*
 * Reserves a slot and bytes: RESOURCE_EXHAUSTED `build limit reached: N builds` (reason
 * BUILD_LIMIT) or `shm budget exceeded: build needs B bytes, U of T in use` (SHM_BUDGET).
 * Every successful reserve is followed by exactly one commit or cancel.
 */
int build_table_reserve(BuildTable *t, uint64_t bytes, FamilyError *ret_error);
void build_table_cancel(BuildTable *t, uint64_t bytes);
/* Turns a reservation of `bytes` into a record (taking payload); *ret is a new reference. */
int build_table_commit(BuildTable *t, uint64_t bytes, void *payload,
                       void (*payload_free)(void *payload), BuildRecord **ret);

/*
 * For a build that needs its id before it is committed (its shards are named after it where
 * they outlive the daemon): a fresh id, never handed out before by this table (a build that
 * fails after drawing one leaves a gap in the serials). build_table_commit_id() then commits
 * the reservation under it (-EEXIST if a record has it).
 */
void build_table_next_id(BuildTable *t, char ret_id[static BUILD_TABLE_ID_MAX]);
int build_table_commit_id(BuildTable *t, const char *id, uint64_t bytes, void *payload,
                          void (*payload_free)(void *payload), BuildRecord **ret);

/*
 * Re-adopts a build kept across a restart under its old id (taking payload): no reservation,
 * and neither the build limit nor the budget can refuse it, since its memory exists already;
 * its bytes count from now on. -EEXIST for an id in use, -EINVAL for one that is not "bld-...".
 * Ids drawn later never repeat it. *ret (may be NULL) is a new reference.
 */
int build_table_restore(BuildTable *t, const char *id, uint64_t bytes, void *payload,
                        void (*payload_free)(void *payload), BuildRecord **ret);

/* NOT_FOUND `build 'ID' not found` (BUILD_NOT_FOUND). *ret is a new reference. */
int build_table_get(BuildTable *t, const char *id, BuildRecord **ret, FamilyError *ret_error);
/* Drops the table's hold and returns the bytes to the budget; NOT_FOUND as above. */
int build_table_remove(BuildTable *t, const char *id, FamilyError *ret_error);
/* New references in creation order; free with build_list_free. */
int build_table_list(BuildTable *t, BuildRecord ***ret, size_t *ret_n);
void build_list_free(BuildRecord **list, size_t n);

unsigned build_table_count(BuildTable *t);
uint64_t build_table_bytes_in_use(BuildTable *t);
uint64_t build_table_budget(BuildTable *t);

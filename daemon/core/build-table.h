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

/* A process holding a build: pid and start time (field 22 of /proc/PID/stat, clock ticks
 * since boot) name the process, so a reused pid is another holder; uid is whom it runs as. */
typedef struct BuildHolder {
        int32_t pid;
        uint32_t uid;
        uint64_t start_time;
        int64_t since_ms; /* Unix ms */
        uint32_t count;   /* Builds it was answered this build by, less its releases */
} BuildHolder;

/* A training handout (a build both private and writable) is bound to the one process that made
 * it, named as a holder is (pid and start time): only that process is shown its tokens and
 * handed its descriptors, admins included (docs/sharing.md, "Training handouts"). */
typedef struct BuildBinding {
        bool bound;
        int32_t pid;
        uint64_t start_time;
} BuildBinding;

/*
 * What holds a build (build-holders.c), under the table's lock: references of processes, a pin,
 * and, when neither holds it, the deadline of its grace period. Only a build with `referenced`
 * (a materialising Build, or one restored after a restart) is held this way; any other stays
 * until ReleaseBuild, as before references existed.
 */
typedef struct BuildHolding {
        bool referenced;
        bool pinned;
        bool writable;
        bool private_build;
        int64_t created_ms;        /* Unix ms */
        int64_t grace_deadline_ms; /* Unix ms while in its grace period; 0 otherwise */
        BuildHolder *holders;      /* oldest first */
        size_t n_holders;
        /* The sharing key (build/build-share.c): NULL for a build never shared. */
        uint8_t *key;
        size_t key_size;
        uint64_t key_hash;
        /* Whose it is: the uid that made it (has_owner false: a build made without a caller,
         * or kept by a familyd that did not record it), and whether the shard socket hands it
         * to every uid of the socket's group (BuildRequest.share "group") or only to the
         * owner's processes and admins. */
        bool has_owner;
        uint32_t owner_uid;
        bool share_group;
        BuildBinding binding;
        /* The uids that pinned it (PinBuild), each once; `pinned` is n_pinners > 0, except for
         * a pin kept by a familyd that did not record pinners on a build without an owner. */
        uint32_t *pinners;
        size_t n_pinners;
} BuildHolding;

typedef struct BuildRecord {
        atomic_uint n_ref;
        char id[BUILD_TABLE_ID_MAX];
        uint64_t bytes; /* shared memory held for this build */
        void *payload;
        void (*payload_free)(void *payload);
        BuildHolding holding; /* under the table's lock: read it with build_table_holding() */
        bool removed;         /* no longer in the table (under the lock) */
        /* The uid its slot and bytes count against (--max-builds-per-uid,
         * --shm-budget-per-uid): the Build's caller, or a restored build's owner. */
        bool charged;
        uint32_t charged_uid;
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

/* What one uid may hold (0: no limit): --max-builds-per-uid, --max-pins-per-uid,
 * --shm-budget-per-uid. Admins are not held to them (docs/security.md). */
typedef struct BuildUidLimits {
        unsigned builds;
        unsigned pins;
        uint64_t bytes;
} BuildUidLimits;
void build_table_set_uid_limits(BuildTable *t, const BuildUidLimits *limits);
void build_table_uid_limits(BuildTable *t, BuildUidLimits *ret);

/* Whom a reservation counts against: charged false (a build made without a caller) counts
 * against nobody; exempt (an admin's) counts but is never refused for its uid's use. */
typedef struct BuildCharge {
        bool charged;
        bool exempt;
        uint32_t uid;
} BuildCharge;

/* One uid's use: builds (and reservations in flight), their host bytes, and builds it pinned. */
typedef struct BuildUidUse {
        uint32_t uid;
        unsigned builds;
        unsigned pins;
        uint64_t bytes;
} BuildUidUse;
/* Every uid that holds a build, a reservation or a pin, by uid; *ret malloc'd (NULL when
 * none). -ENOMEM. */
int build_table_uid_use(BuildTable *t, BuildUidUse **ret, size_t *ret_n);

/*
 * Reserves a slot and bytes: RESOURCE_EXHAUSTED `build limit reached: N builds` (reason
 * BUILD_LIMIT) or `shm budget exceeded: build needs B bytes, U of T in use` (SHM_BUDGET); for a
 * charged, not exempt uid first `uid U holds N of its M builds (--max-builds-per-uid)`
 * (UID_BUILD_LIMIT) or `uid U holds B of its M bytes of shards (--shm-budget-per-uid) ...`
 * (UID_SHM_BUDGET). Every successful reserve is followed by exactly one commit or cancel with
 * the same charge (NULL: none).
 */
int build_table_reserve(BuildTable *t, uint64_t bytes, FamilyError *ret_error);
int build_table_reserve_for(BuildTable *t, const BuildCharge *charge, uint64_t bytes,
                            FamilyError *ret_error);
void build_table_cancel(BuildTable *t, uint64_t bytes);
void build_table_cancel_for(BuildTable *t, const BuildCharge *charge, uint64_t bytes);
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
int build_table_commit_id_for(BuildTable *t, const BuildCharge *charge, const char *id,
                              uint64_t bytes, void *payload, void (*payload_free)(void *payload),
                              BuildRecord **ret);

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

/* ---- references, pins and grace (build-holders.c) -------------------------------------- */

/* The most processes one build lists; a Build or share past it: RESOURCE_EXHAUSTED. */
#define BUILD_TABLE_MAX_HOLDERS 4096u

/* What a new record is (taken: key, which may be NULL). */
typedef struct BuildRecordInit {
        bool referenced, writable, private_build;
        bool has_owner, share_group;
        uint32_t owner_uid;
        BuildBinding binding;
        int64_t created_ms;
        uint8_t *key;
        size_t key_size;
} BuildRecordInit;
void build_table_init_holding(BuildTable *t, BuildRecord *rec, BuildRecordInit *init);
/* From now on rec is held by processes: with none (and no pin) it is idle, and its grace
 * period can start. Set after its first references, so it is never idle before them. */
void build_table_set_referenced(BuildTable *t, BuildRecord *rec);

/* A writable build published read-only (build/build-publish.c): not writable any more, found by
 * key (taken; NULL: never found) as a read-only build of its request. */
void build_table_set_published(BuildTable *t, BuildRecord *rec, uint8_t *key, size_t key_size);
/* A live record with this key (a new reference), or -ENOENT. */
int build_table_find_key(BuildTable *t, const uint8_t *key, size_t key_size, BuildRecord **ret);
/* Adds a reference of h (a process already listed counts one more) and ends a grace period. -ESTALE: the
 * record is gone; -E2BIG: BUILD_TABLE_MAX_HOLDERS. */
int build_table_hold(BuildTable *t, BuildRecord *rec, const BuildHolder *h);
/* Drops one reference of process (pid, start_time), which stays listed while it holds more:
 * FAILED_PRECONDITION NOT_HELD when it holds none. Returns 1 when nothing holds the build any more (its grace period starts now_ms +
 * grace_ms), else 0. */
int build_table_unhold(BuildTable *t, BuildRecord *rec, int32_t pid, uint64_t start_time,
                       int64_t now_ms, uint64_t grace_ms, FamilyError *ret_error);
/* A process is gone: its references go from every build; returns how many builds that left
 * unheld (their grace periods start). */
size_t build_table_drop_process(BuildTable *t, int32_t pid, uint64_t start_time, int64_t now_ms,
                                uint64_t grace_ms);
/* Whether process (pid, start_time) holds any build. */
bool build_table_process_holds(BuildTable *t, int32_t pid, uint64_t start_time);
/* Pins or unpins as an admin of uid 0 (an unpin takes every pin); returns 1 when an unpin left
 * the build unheld (grace starts), else 0. */
int build_table_pin(BuildTable *t, BuildRecord *rec, bool pin, int64_t now_ms, uint64_t grace_ms);

/* Who pins or unpins: the connection's uid, and whether it is an admin. */
typedef struct BuildPinner {
        uint32_t uid;
        bool admin;
} BuildPinner;
/* The most uids that pin one build at once. */
#define BUILD_TABLE_MAX_PINNERS 64u
/*
 * PinBuild: the pin of p's uid, which must be the build's owner, a uid one of whose processes
 * holds it, or an admin (any uid for a build without a known owner): else PERMISSION_DENIED
 * PIN_NOT_ALLOWED. A uid pins a build once (again: nothing changes); a new pin past
 * --max-pins-per-uid (admins exempt) is RESOURCE_EXHAUSTED UID_PIN_LIMIT, past
 * BUILD_TABLE_MAX_PINNERS RESOURCE_EXHAUSTED PIN_LIMIT.
 * UnpinBuild: takes the pin of p's uid; an admin without one takes every pin; a uid without
 * one while other uids pin the build: PERMISSION_DENIED UNPIN_NOT_ALLOWED; nothing pinned: a
 * no-op. Returns 1 when an unpin left the build unheld (grace starts), else 0.
 */
int build_table_pin_as(BuildTable *t, BuildRecord *rec, const BuildPinner *p, bool pin,
                       int64_t now_ms, uint64_t grace_ms, FamilyError *ret_error);
/* Starts the grace period of every referenced build that nothing holds and that has none
 * (builds restored after a restart); returns how many. */
size_t build_table_start_grace(BuildTable *t, int64_t now_ms, uint64_t grace_ms);

/* Takes the record out of the table and returns it (the table's reference, now the
 * caller's). mode: */
typedef enum BuildTakeMode {
        BUILD_TAKE_ANY,     /* whatever holds it (ReleaseBuild without references, force) */
        BUILD_TAKE_IDLE,    /* only in its grace period (eviction) */
        BUILD_TAKE_EXPIRED, /* only when its grace period ended by now_ms */
} BuildTakeMode;
/* NOT_FOUND as build_table_get(); -EBUSY (no error set) when mode refuses. */
int build_table_take(BuildTable *t, const char *id, BuildTakeMode mode, int64_t now_ms,
                     BuildRecord **ret, FamilyError *ret_error);
/* The id of the build whose grace period ends first; -ENOENT when none is in grace. */
int build_table_oldest_idle(BuildTable *t, char ret_id[static BUILD_TABLE_ID_MAX]);
/* The same among the builds whose payload match() accepts (called under the table's lock; the
 * payload of a committed record does not change). */
int build_table_oldest_idle_where(BuildTable *t, bool (*match)(const void *payload),
                                  char ret_id[static BUILD_TABLE_ID_MAX]);
/* The same among the builds counted against uid (a Build refused for its uid's limits). */
int build_table_oldest_idle_of_uid(BuildTable *t, uint32_t uid,
                                   char ret_id[static BUILD_TABLE_ID_MAX]);
/* The earliest grace deadline (Unix ms), 0 when no build is in grace. */
int64_t build_table_next_deadline(BuildTable *t);
unsigned build_table_count_idle(BuildTable *t);
/* A copy of rec's holding (holders malloc'd, key left out); free with build_holding_done. */
int build_table_holding(BuildTable *t, const BuildRecord *rec, BuildHolding *ret);
void build_holding_done(BuildHolding *h);

/* ---- holders kept across a restart (build/build-holders-keep.c) ------------------------- */

/* What of a holding outlives the daemon: plain data, malloc'd. */
typedef struct BuildHoldingKept {
        bool pinned;
        bool private_build;
        bool has_owner, share_group;
        uint32_t owner_uid;
        BuildBinding binding;
        int64_t created_ms;
        uint8_t *key; /* NULL: never shared */
        size_t key_size;
        BuildHolder *holders; /* oldest first */
        size_t n_holders;
        uint32_t *pinners; /* NULL with pinned: kept by a familyd that did not record them */
        size_t n_pinners;
} BuildHoldingKept;
void build_holding_kept_done(BuildHoldingKept *k);

/* A copy of what rec's holding keeps; -ESTALE once rec left the table. */
int build_table_holding_kept(BuildTable *t, const BuildRecord *rec, BuildHoldingKept *ret);
/* After a restart: rec's holding gets k back (key, holders and pinners taken, k emptied); a
 * build with holders or a pin is not in its grace period. A pin without pinners is its
 * owner's; an owned build counts against its owner's uid from now on. */
void build_table_holding_put_back(BuildTable *t, BuildRecord *rec, BuildHoldingKept *k);
/* As build_table_drop_process(), and *ret (new references, build_list_free()) lists every
 * build the process held, its holders changed. */
size_t build_table_drop_process_list(BuildTable *t, int32_t pid, uint64_t start_time,
                                     int64_t now_ms, uint64_t grace_ms, BuildRecord ***ret,
                                     size_t *ret_n);

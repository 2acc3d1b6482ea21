/* state.h: a durable store of named records and descriptors: systemd's fd store, or --state-dir. */
#pragma once

/*
 * DESIGN: one store, three modes, chosen once at start.
 *
 *   fdstore  under a service manager (NOTIFY_SOCKET set): each descriptor (a shard segment,
 *            a sealed memfd) goes into the manager's fd store under its name, each record as
 *            a sealed memfd of its own. At most --fdstore-max of ours are stored (the unit's
 *            FileDescriptorStoreMax must match): whoever would need more is refused
 *            (FDSTORE_LIMIT, state_reserve()) rather than left unprotected, since the manager
 *            drops what is over its limit silently.
 *   dir      without one, with --state-dir on a tmpfs or ramfs: descriptors are files there
 *            (made there by their owner, state_segment_dir()), records are files beside them
 *            written as a temporary file and renamed.
 *   none     nothing persists.
 *
 * Names: a record is "meta-<id>", a descriptor kept with it "shard-<id>-<n>", the record
 * replaced beside it "metarep-<id>" (dir) or "metarep-<id>.<generation>" (fd store). A record is
 * kept after its descriptors and let go of before them (state_keep(), state_forget()), so a
 * crash leaves at worst descriptors without a record, which the next start drops, never a
 * record whose descriptors are missing. Nothing here interprets a record's bytes, or writes,
 * truncates or rewrites a kept descriptor: what they hold is their owner's (daemon/build/,
 * which also decides at start what to take back and what to drop).
 *
 * The service manager is reached through the two functions the shell passes in
 * (StateParams.fdstore_add and fdstore_remove), and what it gave back at this start comes in
 * StateParams.records and .segments.
 *
 * Replaced records: beside a kept record, its owner may keep one more record that changes all
 * the time (a build's holders), replaced whole by each state_replace(), atomically: in the
 * state dir a temporary file renamed over the old one; in the fd store a new sealed memfd under
 * the next generation's name, pushed before the old generation is removed, so a crash leaves
 * the old one, the new one, or both (the newest wins at the next start, the others are
 * dropped). It counts one descriptor of the fd store's room (two for the moment of the swap).
 * It lives as long as its kept record: state_forget() drops it, and a replace after that is
 * refused, so a save racing a release cannot leave one behind.
 *
 * Thread safety: everything may be called from any thread at once. The fd counts are shared
 * (own mutex); replaced records are written one at a time (their own mutex, held through the
 * write); each record or descriptor has its own name. state_take_kept() runs once, before
 * anything is kept.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"
#include "core/error.h"

#define STATE_FDSTORE_MAX_DEFAULT 4096u
/* The fd store's own rule (sd_notify(3), fdname_is_valid()): at most 255 characters. */
#define STATE_FDNAME_MAX 255u
/* "shard-" + an id + "-" + a number: far below STATE_FDNAME_MAX. */
#define STATE_NAME_MAX 96u

#define STATE_PREFIX_RECORD "meta-"
#define STATE_PREFIX_SEGMENT "shard-"
/* Under the fd store prefix the shell takes back ("meta"), but not "meta-": no kept record. */
#define STATE_PREFIX_REPLACED "metarep-"

typedef enum StateMode {
        STATE_MODE_NONE,
        STATE_MODE_DIR,
        STATE_MODE_FDSTORE,
        _STATE_MODE_MAX,
        _STATE_MODE_INVALID = -EINVAL,
} StateMode;

const char *state_mode_to_string(StateMode m); /* "none" | "state-dir" | "fd-store" */

/* A named descriptor: kept, or given back. */
typedef struct StateFd {
        char *name;
        int fd;
} StateFd;

/* A list of them; an entry whose fd is -1 has been taken. */
typedef struct StateFds {
        StateFd *items;
        size_t n, allocated;
} StateFds;

void state_fds_done(StateFds *l);
/* Takes name (a copy) and fd (always: closed on failure). */
int state_fds_add(StateFds *l, const char *name, int fd);
/* The first untaken entry named name, or NULL. */
StateFd *state_fds_find(StateFds *l, const char *name);

typedef struct StateParams {
        const char *state_dir;  /* --state-dir, or NULL */
        unsigned fdstore_max;   /* --fdstore-max; 0: STATE_FDSTORE_MAX_DEFAULT */
        bool under_manager;     /* NOTIFY_SOCKET is set: the fd store mode */
        /* The fd store's descriptors given back at this start (named "meta*" and "shard-*"):
         * taken over by state_new(), on failure too. */
        StateFds records;
        StateFds segments;
        /* The fd store: FDSTORE=1 with FDNAME=name (1: sent; 0: no service manager; a
         * negative errno), and FDSTOREREMOVE=1. Needed in the fd store mode only. */
        int (*fdstore_add)(const char *name, int fd);
        int (*fdstore_remove)(const char *name);
} StateParams;

typedef struct State State;

/* Chooses the mode and logs it; a --state-dir that is not a tmpfs or ramfs is said clearly
 * and means mode none. Fails (logged) when the state dir cannot be made or is locked by
 * another familyd. */
int state_new(StateParams *params, State **ret);
State *state_free(State *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(State *, state_free);

/* s may be NULL (mode none) here and in everything below. */
StateMode state_mode(const State *s);
/* The state dir (mode dir), else NULL. */
const char *state_dir(const State *s);
/* Where descriptors are made as files (the state dir, mode dir), else -1: they are memfds. */
int state_segment_dir(const State *s);

int state_name_record(const char *id, char ret[static STATE_NAME_MAX]);
int state_name_segment(const char *id, int64_t n, char ret[static STATE_NAME_MAX]);

/*
 * The fd store's room: reserve n descriptors for something under way (RESOURCE_EXHAUSTED
 * FDSTORE_LIMIT past --fdstore-max, naming what), give them back if it fails; state_keep()
 * turns the reservation into use, state_forget() ends the use. No-ops but in the fd store mode.
 */
int state_reserve(State *s, size_t n, const char *what, FamilyError *ret_error);
void state_unreserve(State *s, size_t n);
/* Counts n descriptors kept by an earlier run as in use. */
void state_adopt(State *s, size_t n);
/* The fd store's descriptors of ours in use, and at most how many it keeps. */
void state_fd_counts(State *s, size_t *ret_used, size_t *ret_max);

/*
 * Keeps the record id (its bytes) and the descriptors kept with it (fds, named
 * state_name_segment(id, ...)): the descriptors first (into the fd store; in the state dir
 * they are files there already), then the record. All or nothing: on failure nothing of it is
 * kept (what went into the fd store is removed again; the state dir's files stay the
 * caller's). On success the reservation of n_fds + 1 is in use, and a record may be replaced
 * beside it (state_replace()). A negative errno: -ENOSPC or -EDQUOT when the state dir is full.
 */
int state_keep(State *s, const char *id, const uint8_t *record, size_t size,
               const StateFd *fds, size_t n_fds);
/* Lets go of the record id, kept by state_keep() with n_fds descriptors, and ends their use;
 * the record replaced beside it goes first, and is not replaced again. Its descriptors go next, each with state_drop(): the record goes first, so a crash in
 * between leaves only descriptors, which the next start drops. */
void state_forget(State *s, const char *id, size_t n_fds);
/* Lets go of a descriptor made for a record that was never kept: the state dir's file (the fd
 * store holds nothing before state_keep()). */
void state_discard(State *s, const char *name);
/* Lets go of one name: unlinks the file, or FDSTOREREMOVE. Missing is fine. */
void state_drop(State *s, const char *name);

/*
 * What the previous run kept, now the caller's: records ("meta-*") and descriptors
 * ("shard-*"), the fd store's as it gave them back, the state dir's opened read-only (records
 * a crash left half written are removed). Once, before anything is kept.
 */
int state_take_kept(State *s, StateFds *ret_records, StateFds *ret_segments);
/* A kept record's bytes (a regular file or memfd of at most max bytes, else -EFBIG). */
int state_read_record(int fd, size_t max, uint8_t **ret, size_t *ret_size);

/* ---- replaced records (DESIGN) ---------------------------------------------------------- */

/*
 * Replaces the record replaced beside the kept record id with size bytes of data. -ESTALE
 * when id is not kept (never kept, forgotten, or restored without state_take_replaced()):
 * nothing written. -ENOSPC when the fd store has no room for it (the old one stays), or the
 * state dir is full. 0 in mode none.
 */
int state_replace(State *s, const char *id, const uint8_t *data, size_t size);
/*
 * At start, for a record id the previous run kept and its owner put back: from now on id is
 * kept (state_replace() works on it), and *ret (malloc'd) holds the newest record replaced
 * beside it, which now counts in the fd store's room; older generations are dropped. -ENOENT:
 * none was kept; -EFBIG past max bytes, or an unreadable one (dropped).
 */
int state_take_replaced(State *s, const char *id, size_t max, uint8_t **ret, size_t *ret_size);
/* At start, once every kept record was put back: replaced records none of them took are
 * dropped. */
void state_drop_untaken_replaced(State *s);

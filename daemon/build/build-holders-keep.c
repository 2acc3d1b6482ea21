/* build-holders-keep.c: a build's holders, pin and key saved beside it, and put back at start. */

/*
 * DESIGN: a build's record (meta-<id>, build-keep.c) is written once, before anyone sees the
 * build; what holds it changes all the time, so it has a record of its own, replaced whole at
 * each change (state_replace(): atomically, in the state dir or the fd store). It is written
 * by the call or the watcher event that changed the holders, after the change and outside the
 * build table's lock: a Build answered by a shared build returns once its reference is kept,
 * so a daemon killed right after still knows the caller.
 *
 * At start (build_sharing_start(), after build_restore()), each restored build takes its
 * record back. A reference names a process by pid and start time: one whose process lives on
 * (a pidfd opened on the pid, the start time read after it, the pidfd's process still there)
 * is kept and watched again; any other is dropped, as its exit would have dropped it. A build
 * left with no holder and no pin starts its grace period with the others.
 */

#include <inttypes.h>
#include <stdio.h>

#include "build-holders-keep.h"
#include "codec/codec-holders-record.h"
#include "common/log.h"

void build_holders_save(const Builder *builder, BuildRecord *rec) {
        _cleanup_(build_holding_kept_done) BuildHoldingKept k = {};
        _cleanup_free_ uint8_t *data = NULL;
        pthread_mutex_t *lock = build_sharing_keep_lock(builder);
        size_t size = 0;
        int r;

        if (state_mode(builder->state) == STATE_MODE_NONE || !lock)
                return;
        (void) pthread_mutex_lock(lock);
        r = build_table_holding_kept(builder->manager->builds, rec, &k);
        if (r >= 0)
                r = codec_holders_record_encode(&k, &data, &size);
        if (r >= 0)
                r = state_replace(builder->state, rec->id, data, size);
        (void) pthread_mutex_unlock(lock);
        if (r == -ESTALE) /* freed meanwhile: nothing to keep */
                return;
        if (r < 0)
                log_struct(LOG_WARNING, r, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                           "Failed to keep the holders of build %s (they are lost if the "
                           "daemon restarts), ignoring: %s",
                           rec->id,
                           r == -ENOSPC ? "no room in the fd store (--fdstore-max) or the "
                                          "state dir"
                                        : strerror(-r));
}

void build_holders_save_list(const Builder *builder, BuildRecord **list, size_t n) {
        for (size_t i = 0; i < n; i++)
                build_holders_save(builder, list[i]);
}

static void log_dropped(const char *id, int32_t pid, const char *why) {
        log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, id)),
                   "Build %s: process %" PRId32 " held it before the restart and %s; its "
                   "reference is dropped.",
                   id, pid, why);
}

/* Keeps the holders of k whose processes still live, with a pidfd each in pidfds (as many);
 * returns how many were dropped. */
static size_t holders_alive(const char *id, BuildHoldingKept *k, int *pidfds) {
        size_t kept = 0, dropped = 0;

        for (size_t i = 0; i < k->n_holders; i++) {
                const BuildHolder *h = &k->holders[i];
                BuildCaller c = { .pid = h->pid, .uid = h->uid, .start_time = h->start_time };

                if (build_caller_reopen(&c, &pidfds[kept]) < 0) {
                        log_dropped(id, h->pid, "is gone");
                        dropped++;
                        continue;
                }
                k->holders[kept++] = *h;
        }
        k->n_holders = kept;
        return dropped;
}

/* 1: rec got its holders back, and some were dropped (to save again); 0; -ENOMEM. */
static int put_back_one(const Builder *builder, BuildRecord *rec) {
        _cleanup_(codec_holders_record_done) HoldersRecord k = {};
        _cleanup_free_ uint8_t *data = NULL;
        _cleanup_free_ int *pidfds = NULL;
        _cleanup_free_ BuildHolder *watched = NULL;
        char why[128];
        size_t size = 0, dropped, n;
        int r;

        r = state_take_replaced(builder->state, rec->id, HOLDERS_RECORD_MAX_BYTES, &data, &size);
        if (r == -ENOENT) /* kept by a daemon that did not keep holders, or never held */
                return 0;
        if (r == -ENOMEM)
                return r;
        if (r >= 0)
                r = codec_holders_record_decode(data, size, &k, why, sizeof why);
        else
                (void) snprintf(why, sizeof why, "cannot read it: %s", strerror(-r));
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                log_struct(LOG_WARNING, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                           "Build %s: the record of its holders is dropped (%s); it waits out "
                           "its grace period, ignoring.",
                           rec->id, why);
                return 0;
        }
        pidfds = calloc(k.n_holders + 1, sizeof *pidfds);
        if (!pidfds)
                return -ENOMEM;
        dropped = holders_alive(rec->id, &k, pidfds);
        n = k.n_holders;
        watched = n > 0 ? malloc(n * sizeof *watched) : NULL;
        if (n > 0 && !watched) {
                for (size_t i = 0; i < n; i++)
                        safe_close(pidfds[i]);
                return -ENOMEM;
        }
        if (n > 0)
                memcpy(watched, k.holders, n * sizeof *watched);
        log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD(LOG_FIELD_BUILD_ID, rec->id)),
                   "Build %s: %zu process%s still hold%s it%s.", rec->id, n,
                   n == 1 ? "" : "es", n == 1 ? "s" : "", k.pinned ? "; pinned" : "");
        build_set_shard_access(builder, rec, k.has_owner, k.owner_uid, k.share_group,
                               &k.binding);
        build_table_holding_put_back(builder->manager->builds, rec, &k);

        /* Watched once they are listed: one that exits from now on is seen leaving. */
        for (size_t i = 0; i < n; i++) {
                BuildCaller c = { .pid = watched[i].pid, .uid = watched[i].uid,
                                  .start_time = watched[i].start_time };
                if (build_watch_add(build_sharing_watch(builder), &c, pidfds[i]) >= 0)
                        continue;
                log_dropped(rec->id, c.pid, "cannot be watched again");
                (void) build_table_drop_process(builder->manager->builds, c.pid, c.start_time,
                                                build_now_ms(), build_sharing_grace_ms(builder));
                dropped++;
        }
        return dropped > 0;
}

void build_holders_put_back(const Builder *builder) {
        BuildRecord **list = NULL;
        size_t n = 0;
        int r;

        if (state_mode(builder->state) == STATE_MODE_NONE)
                return;
        r = build_table_list(builder->manager->builds, &list, &n);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                r = put_back_one(builder, list[i]);
                if (r > 0)
                        build_holders_save(builder, list[i]);
        }
        if (r < 0)
                log_warning_errno(r, "Failed to put back the holders of the kept builds (they "
                                     "wait out their grace period), ignoring: %m");
        build_list_free(list, n);
        state_drop_untaken_replaced(builder->state);
}

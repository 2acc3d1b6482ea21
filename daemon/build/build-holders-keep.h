/* build-holders-keep.h: what holds a build (references, pin, key) kept across a restart. */
#pragma once

#include <pthread.h>

#include "build-private.h"

/*
 * Saves what holds rec (its holders, pin, privacy, creation time and sharing key) in its own
 * record beside the build's (state_replace()), after any change of them. Outside the build
 * table's lock; saves are one at a time (the sharing's keep lock), each taking its copy of the
 * holding under that lock, so the last save written is never older than a change whose save
 * began before it. A failure is logged (", ignoring"): the call that changed the holders
 * stands. A build already freed is not saved.
 */
void build_holders_save(const Builder *builder, BuildRecord *rec);
/* Each build of list (n), as build_holders_save(). */
void build_holders_save_list(const Builder *builder, BuildRecord **list, size_t n);

/*
 * At start, with the watcher running, before the grace periods start: every restored build
 * gets back what held it; its holders whose process still lives (same pid and start time)
 * are watched again, the others dropped (and the record saved again). A missing or unreadable
 * record means no holders. Then the records no restored build took are dropped.
 */
void build_holders_put_back(const Builder *builder);

/* build-share.c: serialises saves (NULL without sharing). */
pthread_mutex_t *build_sharing_keep_lock(const Builder *builder);
/* build-share.c: the watcher, for processes to watch again (NULL without sharing). */
BuildWatch *build_sharing_watch(const Builder *builder);

/*
 * build-caller.c: the process a saved caller named, if it still lives: a pidfd opened on its
 * pid, then its start time must be the saved one and the pidfd's process still there.
 * -ESRCH otherwise (exited, or its pid reused).
 */
int build_caller_reopen(const BuildCaller *saved, int *ret_pidfd);
/* Whether c's process still lives (its pid has c's start time): for callers watched without a
 * pidfd (*ret_pidfd -1 above and in build_caller_identify(): no pidfds on this system). */
bool build_caller_alive(const BuildCaller *c);

/* build-publish.c: builds whose values the constructed module's own init writes (init: module). */

/*
 * DESIGN: familyd cannot run a module's reset_parameters, and a read-only segment is sealed
 * against writes before anyone maps it. So a member with a parameter of init: module is first
 * built writable (zeros, one build per request as any writable build): its filler (familyd.torch,
 * one process per node) writes the module's values into it, unmaps it and calls PublishBuild.
 * The publish seals every segment against writes (F_SEAL_WRITE, which the kernel refuses while
 * a writable shared mapping exists, so nothing writes after it, not even through a descriptor
 * handed out writable before) and gives the build the sharing key of a read-only Build of the
 * same request: every later read-only Build on the node finds it, as any shared build. A
 * read-only Build that would make such a build itself is refused (MODULE_INIT_PENDING): its
 * zeros would pass for the module's values. docs/decisions.md says why not a fill role inside
 * Build.
 */

#include <inttypes.h>

#include "build-holders-keep.h"
#include "build-private.h"
#include "common/log.h"

const PlanParameter *build_module_init_parameter(const BuildState *b) {
        if (b->checkpoint || b->checkpoint_prefix)
                return NULL; /* the checkpoint's values, not the module's */
        for (size_t i = 0; i < b->plan.n_parameters; i++)
                if (b->plan.parameters[i].init.kind == INIT_MODULE)
                        return &b->plan.parameters[i];
        return NULL;
}

int build_module_init_check(const BuildState *b, FamilyError *ret_error) {
        const PlanParameter *p = build_module_init_parameter(b);

        if (!p || b->writable || build_state_segments(b) == 0)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                "MODULE_INIT_PENDING", NULL,
                                "parameter '%s' of %s is initialised by its module (init: "
                                "module) and no published build of this request is here yet: "
                                "build it writable, run the module's init into it and "
                                "PublishBuild it first (familyd.torch does)",
                                p->name, b->plan.resolved.family);
}

static int check_publishable(const BuildRecord *rec, const BuildHolding *h,
                             const BuildActor *actor, FamilyError *ret_error) {
        const BuildState *b = rec->payload;

        if (h->has_owner && h->owner_uid != actor->uid && !actor->admin)
                return family_error_set(ret_error, FAMILY_STATUS_PERMISSION_DENIED,
                                        "PUBLISH_NOT_ALLOWED", "build_id",
                                        "PublishBuild needs the build's owner (uid %" PRIu32
                                        ") or an admin; uid %" PRIu32 " is neither",
                                        h->owner_uid, actor->uid);
        if (!build_module_init_parameter(b) && !b->module_init_pending)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "NOT_PUBLISHABLE", "build_id",
                                        "build %s has no parameter with init: module; only such "
                                        "a build is published",
                                        rec->id);
        if (h->private_build)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "NOT_PUBLISHABLE", "build_id",
                                        "build %s is a training handout (private), which is "
                                        "never published",
                                        rec->id);
        return 0;
}

int build_publish(const Builder *builder, const char *id, const BuildActor *actor,
                  BuildRecord **ret, FamilyError *ret_error) {
        _cleanup_(build_record_unrefp) BuildRecord *rec = NULL;
        _cleanup_(build_holding_done) BuildHolding h = {};
        BuildTable *t = builder->manager->builds;
        _cleanup_free_ uint8_t *key = NULL;
        size_t key_size = 0;
        BuildState *b;
        int r;

        r = build_table_get(t, id, &rec, ret_error);
        if (r < 0)
                return r;
        b = rec->payload;
        r = build_table_holding(t, rec, &h);
        if (r < 0)
                return r;
        r = check_publishable(rec, &h, actor, ret_error);
        if (r < 0)
                return r;
        if (!b->writable) {
                *ret = TAKE_PTR(rec); /* published already */
                return 0;
        }
        for (size_t i = 0; i < b->n_ranks; i++) {
                if (!b->ranks[i].materialized)
                        continue;
                r = shard_segment_seal_writes(b->ranks[i].segment);
                if (r == -EBUSY)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "MAPPED_WRITABLE", "build_id",
                                                "build %s is still mapped writable (rank %zu): "
                                                "unmap its shards before PublishBuild",
                                                rec->id, i);
                if (r < 0)
                        return r;
        }
        /* Two publishes at once: both sealed (idempotent), one goes on. */
        if (!atomic_exchange(&b->writable, false)) {
                *ret = TAKE_PTR(rec);
                return 0;
        }
        /* Never shared (a Build without a caller): published, still found by id only. */
        if (h.has_owner) {
                r = build_share_key(b, false, h.owner_uid, h.share_group, &key, &key_size);
                if (r < 0)
                        return r;
        }
        build_table_set_published(t, rec, TAKE_PTR(key), key_size);
        build_holders_save(builder, rec);
        log_info("Build %s published read-only: its module's values are in.", rec->id);
        *ret = TAKE_PTR(rec);
        return 0;
}

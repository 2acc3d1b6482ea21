/* build-share-key.c: a Build's sharing key: the build it would be, and what its message omits. */

#include <inttypes.h>
#include <stdio.h>

#include "build-private.h"
#include "codec/codec-build-holders.h"

/*
 * "init_fields=name=value;...": the source_config fields a replacement's inits took, ints in
 * decimal and floats exactly (%a). The Build message holds neither source_config nor inits, and
 * these with the layout's shapes and the registry decide the fill. NULL when there are none, so
 * the keys of every other build stay as they were.
 */
static int init_fields_text(const ValueMap *m, char **ret) {
        _cleanup_free_ char *t = NULL;

        *ret = NULL;
        if (m->n == 0)
                return 0;
        t = strdup("init_fields=");
        if (!t)
                return -ENOMEM;
        for (size_t i = 0; i < m->n; i++) {
                const Value *v = &m->items[i].value;
                char *n = NULL;
                int k;

                if (v->kind == VALUE_INT)
                        k = asprintf(&n, "%s%s=%" PRId64 ";", t, m->items[i].name, v->i);
                else
                        k = asprintf(&n, "%s%s=%a;", t, m->items[i].name, v->f);
                if (k < 0)
                        return -ENOMEM;
                free(t);
                t = n;
        }
        *ret = TAKE_PTR(t);
        return 0;
}

int build_share_key(const BuildState *b, bool writable, uint32_t uid, bool share_group,
                    uint8_t **ret, size_t *ret_size) {
        _cleanup_(arena_done) Arena a;
        _cleanup_free_ char *ranks = NULL, *inits = NULL;
        char mesh[300], seed[64], dtype[64], owner[64], writable_text[32], module[320],
             registry[96];
        _cleanup_free_ char *checkpoint = NULL;
        CodecBuild view;
        int r;

        arena_init(&a);
        r = build_state_describe(b, &a, &view);
        if (r < 0)
                return r;
        ranks = malloc(b->n_ranks + 8);
        if (!ranks)
                return -ENOMEM;
        memcpy(ranks, "ranks=", 6);
        for (size_t i = 0; i < b->n_ranks; i++)
                ranks[6 + i] = b->ranks[i].materialized ? '1' : '0';
        ranks[6 + b->n_ranks] = 0;
        (void) snprintf(mesh, sizeof mesh, "mesh=%s", b->plan.mesh ? b->plan.mesh->id : "");
        (void) snprintf(seed, sizeof seed, "seed=%" PRIu64, b->seed);
        (void) snprintf(dtype, sizeof dtype, "dtype=%s", dtype_to_string(b->dtype));
        /* The owner, and to whom the shard socket hands it: one build each. */
        (void) snprintf(owner, sizeof owner, "uid=%" PRIu32 "%s", uid,
                        share_group ? " share=group" : "");
        (void) snprintf(writable_text, sizeof writable_text, "writable=%d", writable);
        (void) snprintf(module, sizeof module, "module=%s", strempty(b->plan.module_fqn));
        /* The registry the build is made from: a reload that changes it changes the key. */
        (void) snprintf(registry, sizeof registry, "registry=%s", b->registry_digest);
        r = init_fields_text(&b->plan.init_fields, &inits);
        if (r < 0)
                return r;
        /* Values from a checkpoint: its files as they are now, and where in it. */
        if (b->checkpoint &&
            asprintf(&checkpoint, "checkpoint=%s prefix=%s names=%s", b->checkpoint_identity,
                     b->checkpoint_prefix,
                     b->checkpoint_by_parameter ? "parameters" : "registry") < 0)
                return -ENOMEM;
        const char *extra[] = { mesh,  seed,   dtype,    ranks,      writable_text,
                                owner, module, registry, checkpoint, inits };
        size_t n = ELEMENTSOF(extra) - !inits;
        if (!checkpoint) {
                extra[8] = inits;
                n--;
        }
        return codec_build_key(&view, extra, n, ret, ret_size);
}

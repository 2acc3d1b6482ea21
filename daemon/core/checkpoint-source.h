/* checkpoint-source.h: where a parameter's values come from in a checkpoint: tensor names, stacking, concatenation, transposes. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * DESIGN
 *
 * A registry parameter may say which checkpoint tensors hold its values (docs/registry.md,
 * "Checkpoint names"). Names are templates: `{prefix}` is the Build request's prefix (the
 * component's place in the model, "model.layers.0.mlp"), and a stacked parameter's key
 * (`{expert}`) is each index of its stacked dimension in turn. The forms:
 *
 *   one tensor          the parameter's values, in its shape (or its last two dimensions
 *                       swapped, with transpose);
 *   stack {dim, key}    dimension dim of the parameter enumerates tensors: index i is the
 *                       tensor named with {key} = i, of the parameter's shape without dim;
 *   concat {dim, parts} the parameter is its parts joined along dim, in order; each part is a
 *                       tensor (or, with stack, one per index) whose extent along dim is its own.
 *
 * The plan (checkpoint-plan.h) fills a slice of the joined tensor. When a mesh shards a
 * concatenated dimension into g pieces, each part is sharded on its own before the join, so
 * that a rank's block is its parts' shards joined (a tp rank's fused q/k/v block is
 * [q_r; k_r; v_r], not a slice of the fused tensor): the plan reads the dimension as g groups,
 * group k being each part's k-th 1/g in order (checkpoint-plan.h).
 */

#define CHECKPOINT_TEMPLATE_MAX 1024 /* a safetensors name's limit */
#define CHECKPOINT_PARTS_MAX 16

typedef struct CheckpointPart {
        char *tensor;   /* the name template */
        bool transpose; /* the tensor's last two dimensions are the parameter's, swapped */
} CheckpointPart;

typedef struct CheckpointSource {
        CheckpointPart *parts; /* 1: one tensor; more: concatenated along concat_dim */
        size_t n_parts;
        bool concat;
        int64_t concat_dim;
        bool stack;
        int64_t stack_dim;
        char *stack_key; /* the placeholder's name, without braces */
        char *text;      /* canonical text, as GetFamily shows it */
} CheckpointSource;

void checkpoint_source_done(CheckpointSource *s);
/* A deep copy of s into *ret. */
int checkpoint_source_copy(const CheckpointSource *s, CheckpointSource *ret);

/*
 * Checks a template: only {prefix} and {KEY} (stack_key, when not NULL) between braces, each
 * brace closed, KEY present when stack_key is given. 0, or -EINVAL with why filled.
 */
int checkpoint_template_check(const char *t, const char *stack_key, char *why, size_t why_size);

/*
 * The tensor name of template t for a prefix and, in a stacked source, an index (ignored
 * otherwise). An empty prefix leaves out {prefix} and the dot after it, so "{prefix}.weight"
 * names "weight". -ENAMETOOLONG past CHECKPOINT_TEMPLATE_MAX bytes.
 */
int checkpoint_tensor_name(const char *t, const char *prefix, const char *stack_key,
                           int64_t index, char **ret);

/* s->text from the rest of s. */
int checkpoint_source_make_text(CheckpointSource *s);

/* build-checkpoint-whole.c: the checkpoint tensors a node's ranks read whole, from the distinct boxes they read. */

#include <string.h>

#include "build-checkpoint.h"

struct BuildCheckpointBox {
        size_t tensor; /* index in the checkpoint's tensors */
        int64_t offset[FAMILYD_MAX_SHAPE_RANK], extent[FAMILYD_MAX_SHAPE_RANK];
};

int build_checkpoint_note_read(BuildCheckpoint *c, const CheckpointBlock *block) {
        const BuildCheckpointTensor *t = build_checkpoint_find(c, block->tensor);
        BuildCheckpointBox *grown;

        if (!t || block->n_src_dims > FAMILYD_MAX_SHAPE_RANK)
                return -EINVAL;
        grown = reallocarray(c->node_reads, c->n_node_reads + 1, sizeof *grown);
        if (!grown)
                return -ENOMEM;
        c->node_reads = grown;
        /* Zeroed past n_src_dims: boxes compare as bytes. */
        grown[c->n_node_reads] = (BuildCheckpointBox) { .tensor = (size_t) (t - c->tensors) };
        memcpy(grown[c->n_node_reads].offset, block->src_offset,
               block->n_src_dims * sizeof(int64_t));
        memcpy(grown[c->n_node_reads].extent, block->src_extent,
               block->n_src_dims * sizeof(int64_t));
        c->n_node_reads++;
        return 0;
}

static int box_compare(const void *a, const void *b) {
        return memcmp(a, b, sizeof(BuildCheckpointBox));
}

int build_checkpoint_mark_read_whole(BuildCheckpoint *c) {
        _cleanup_free_ uint64_t *bytes = calloc(c->n_tensors ? c->n_tensors : 1, sizeof *bytes);
        BuildCheckpointBox *x = c->node_reads;

        if (!bytes)
                return -ENOMEM;
        if (c->n_node_reads > 0)
                qsort(x, c->n_node_reads, sizeof *x, box_compare);
        for (size_t i = 0; i < c->n_node_reads; i++) {
                const SafetensorsTensor *t = c->tensors[x[i].tensor].tensor;
                uint64_t elements = 1;
                if (i > 0 && box_compare(&x[i], &x[i - 1]) == 0)
                        continue;
                for (size_t d = 0; d < t->n_dims; d++)
                        elements *= (uint64_t) x[i].extent[d];
                bytes[x[i].tensor] += elements * (safetensors_dtype_bits(t->dtype) / 8);
        }
        for (size_t i = 0; i < c->n_tensors; i++) {
                const SafetensorsTensor *t = c->tensors[i].tensor;
                c->tensors[i].read_whole = bytes[i] > 0 && bytes[i] >= t->end - t->begin;
        }
        c->node_reads = mfree(c->node_reads);
        c->n_node_reads = 0;
        return 0;
}

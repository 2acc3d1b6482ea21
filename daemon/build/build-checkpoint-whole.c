/* build-checkpoint-whole.c: the checkpoint tensors a node's ranks read whole, and which of them in columns (banded), from the distinct boxes they read. */

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

/* A box narrower than its tensor along an axis inside the first: part of each row. */
static bool box_in_columns(const BuildCheckpointBox *x, const SafetensorsTensor *t) {
        for (size_t d = 1; d < t->n_dims; d++)
                if ((uint64_t) x->extent[d] < t->shape[d])
                        return true;
        return false;
}

uint64_t build_checkpoint_row_bytes(const BuildCheckpoint *c, size_t t) {
        const SafetensorsTensor *x = c->tensors[t].tensor;
        uint64_t elements = 1;

        for (size_t d = 1; d < x->n_dims; d++)
                elements *= x->shape[d];
        return elements * (safetensors_dtype_bits(x->dtype) / 8);
}

int build_checkpoint_mark_read_whole(BuildCheckpoint *c, bool bands, uint64_t *ret_bytes) {
        size_t n = c->n_tensors ? c->n_tensors : 1;
        _cleanup_free_ uint64_t *distinct = calloc(n, sizeof *distinct);
        _cleanup_free_ uint64_t *all = calloc(n, sizeof *all);
        _cleanup_free_ bool *columns = calloc(n, sizeof *columns);
        BuildCheckpointBox *x = c->node_reads;
        uint64_t read = 0;

        if (!distinct || !all || !columns)
                return -ENOMEM;
        if (c->n_node_reads > 0)
                qsort(x, c->n_node_reads, sizeof *x, box_compare);
        for (size_t i = 0; i < c->n_node_reads; i++) {
                const SafetensorsTensor *t = c->tensors[x[i].tensor].tensor;
                uint64_t elements = 1;
                for (size_t d = 0; d < t->n_dims; d++)
                        elements *= (uint64_t) x[i].extent[d];
                all[x[i].tensor] += elements * (safetensors_dtype_bits(t->dtype) / 8);
                if (i > 0 && box_compare(&x[i], &x[i - 1]) == 0)
                        continue;
                distinct[x[i].tensor] += elements * (safetensors_dtype_bits(t->dtype) / 8);
                columns[x[i].tensor] |= box_in_columns(&x[i], t);
        }
        for (size_t i = 0; i < c->n_tensors; i++) {
                const SafetensorsTensor *t = c->tensors[i].tensor;
                c->tensors[i].read_whole = distinct[i] > 0 && distinct[i] >= t->end - t->begin;
                c->tensors[i].banded = bands && c->tensors[i].read_whole && columns[i] &&
                                       t->n_dims >= 2 &&
                                       build_checkpoint_row_bytes(c, i) <=
                                               BUILD_CHECKPOINT_BAND_BYTES;
                /* The slices read their boxes, a box two ranks need twice; bands, once. */
                read += c->tensors[i].banded ? t->end - t->begin : all[i];
        }
        c->node_reads = mfree(c->node_reads);
        c->n_node_reads = 0;
        if (ret_bytes)
                *ret_bytes = read;
        return 0;
}

bool build_checkpoint_has_bands(const BuildCheckpoint *c) {
        for (size_t i = 0; c && i < c->n_tensors; i++)
                if (c->tensors[i].banded)
                        return true;
        return false;
}

/* build-checkpoint-read.c: shard slices filled from a client's checkpoint: the plan's boxes read once (or taken from a band in memory), converted, scattered. */

#include <fcntl.h>
#include <limits.h>
#include <sys/uio.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/checkpoint-dtype.h"
#include "hw/read-ahead.h"
#include "build-checkpoint.h"

#define READ_STAGING_MIN (64u << 10)

/* One box of one tensor, in element strides of the file (src) and of the slice (dst). */
typedef struct Box {
        const BuildCheckpointFile *file;
        const SafetensorsTensor *tensor;
        const CheckpointBlock *block;
        size_t in, out;                   /* bytes per element: file, slice */
        size_t k;                         /* source dimensions */
        size_t m;                         /* axes m..k-1 make one contiguous run */
        uint64_t src_stride[FAMILYD_MAX_SHAPE_RANK];
        uint64_t dst_stride[FAMILYD_MAX_SHAPE_RANK]; /* per source axis, in the slice */
        uint64_t dst_base;
        uint64_t run;                     /* elements per run */
        bool dst_contiguous;              /* a run lands in consecutive slice elements */
        bool read_whole;                  /* BuildCheckpointTensor.read_whole */
        const uint8_t *band;              /* non-NULL: the tensor's elements from band_first */
        uint64_t band_first;              /* on, in memory: nothing is read */
        BuildCheckpointRuns *runs;        /* non-NULL: each run noted there, nothing read */
} Box;

static void box_layout(Box *x, const ParameterLayout *p, const ShardSlice *slice) {
        const CheckpointBlock *b = x->block;
        uint64_t param_stride[FAMILYD_MAX_SHAPE_RANK], s = 1;

        for (size_t d = slice->n_dims; d-- > 0;) {
                param_stride[d] = s;
                s *= (uint64_t) slice->local_shape[d];
        }
        x->dst_base = 0;
        for (size_t d = 0; d < slice->n_dims; d++) {
                x->dst_base += (uint64_t) b->dst_offset[d] * param_stride[d];
                if (b->src_axis[d] != CHECKPOINT_NO_AXIS)
                        x->dst_stride[b->src_axis[d]] = param_stride[d];
        }
        s = 1;
        for (size_t j = x->k; j-- > 0;) {
                x->src_stride[j] = s;
                s *= x->tensor->shape[j];
        }
        /* The run: the innermost axis, and the axes outside it while those inside are whole. */
        x->m = x->k ? x->k - 1 : 0;
        while (x->m > 0 && (uint64_t) b->src_extent[x->m] == x->tensor->shape[x->m])
                x->m--;
        x->run = 1;
        for (size_t j = x->m; j < x->k; j++)
                x->run *= (uint64_t) b->src_extent[j];
        x->dst_contiguous = true;
        for (size_t j = x->m; j < x->k; j++) {
                uint64_t inner = 1;
                for (size_t i = j + 1; i < x->k; i++)
                        inner *= (uint64_t) b->src_extent[i];
                if (b->src_extent[j] > 1 && x->dst_stride[j] != inner)
                        x->dst_contiguous = false;
        }
}

/* Elements [first, first + n) of the run starting at slice element base, from staging. */
static void scatter(const Box *x, SafetensorsDtype from, Dtype to, const uint8_t *src,
                    uint64_t base, uint64_t first, size_t n, uint8_t *dst) {
        if (x->dst_contiguous) {
                checkpoint_dtype_convert(from, to, src, dst + (base + first) * x->out, n);
                return;
        }
        for (size_t e = 0; e < n; e++) {
                uint64_t rem = first + e, at = base;
                for (size_t j = x->k; j-- > x->m;) {
                        uint64_t ext = (uint64_t) x->block->src_extent[j];
                        at += (rem % ext) * x->dst_stride[j];
                        rem /= ext;
                }
                checkpoint_dtype_convert(from, to, src + e * x->in, dst + at * x->out, 1);
        }
}

static int read_full(const BuildCheckpointFile *f, uint8_t *buf, size_t size, uint64_t offset,
                     BuildCheckpointReads *reads, FamilyError *ret_error) {
        while (size > 0) {
                ssize_t n = pread(f->fd, buf, size, (off_t) offset);
                if (n < 0 && errno == EINTR)
                        continue;
                reads->calls++;
                if (n <= 0)
                        return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE,
                                                "CHECKPOINT_READ", NULL,
                                                "checkpoint file %s: %s at byte %" PRIu64, f->name,
                                                n < 0 ? strerror(errno) : "it ended early (it "
                                                "changed since it was opened)", offset);
                buf += n;
                size -= (size_t) n;
                offset += (uint64_t) n;
                reads->bytes += (uint64_t) n;
        }
        return 0;
}

/* What a box reads, asked of the kernel ahead, every window of it, so the disk sees many
 * requests, not the one or two of the kernel's own readahead: a box of one run, its bytes; a
 * box of several runs in a tensor the node reads whole, the whole rows its runs lie in (other
 * ranks' parts of them included). A column shard the node holds without its neighbours gets
 * no hint: the rows' other columns are not the node's to read. */
static void box_read_ahead(const Box *x, uint64_t outer) {
        const CheckpointBlock *b = x->block;
        uint64_t first = 0, last = 0;

        if (outer == 0 || (outer > 1 && (!x->read_whole || x->m == 0)))
                return;
        for (size_t j = 0; j < x->k; j++)
                first += (uint64_t) b->src_offset[j] * x->src_stride[j];
        uint64_t at = x->file->header->data_offset + x->tensor->begin + first * x->in;
        if (outer == 1) {
                read_ahead(x->file->fd, at, x->run * x->in, x->file->read_ahead);
                return;
        }
        first = 0;
        for (size_t j = 0; j < x->m; j++) {
                first += (uint64_t) b->src_offset[j] * x->src_stride[j];
                last += (uint64_t) (b->src_offset[j] + b->src_extent[j] - 1) * x->src_stride[j];
        }
        /* src_stride[m - 1]: the elements of one row of axis m - 1 (every axis inside it). */
        at = x->file->header->data_offset + x->tensor->begin + first * x->in;
        read_ahead(x->file->fd, at, (last - first + x->src_stride[x->m - 1]) * x->in,
                   x->file->read_ahead);
}

/* Room for one more run in runs: -EOPNOTSUPP at its max (runs too small for a preadv each
 * to pay), -ENOMEM. */
static int runs_grow(BuildCheckpointRuns *runs) {
        if (runs->n >= runs->max)
                return -EOPNOTSUPP;
        if (runs->n < runs->allocated)
                return 0;
        size_t want = runs->allocated ? runs->allocated * 2 : 64;
        if (want > runs->max)
                want = runs->max;
        BuildCheckpointRun *grown = reallocarray(runs->runs, want, sizeof *grown);
        if (!grown)
                return -ENOMEM;
        runs->runs = grown;
        runs->allocated = want;
        return 0;
}

static int read_box(Box *x, Dtype to, uint8_t *dst, uint8_t *staging, size_t staging_size,
                    BuildCheckpointReads *reads, FamilyError *ret_error) {
        const CheckpointBlock *b = x->block;
        uint64_t outer = 1, chunk = x->band ? UINT64_MAX : staging_size / x->in;
        int64_t idx[FAMILYD_MAX_SHAPE_RANK] = {};
        /* A run in the parameter's own type landing in consecutive elements is read straight
         * into the slice: one copy (the kernel's), not two. */
        bool direct = x->dst_contiguous && checkpoint_dtype_same(x->tensor->dtype, to);
        int r;

        for (size_t j = 0; j < x->m; j++)
                outer *= (uint64_t) b->src_extent[j];
        if (!x->band && !x->runs) /* a band's rows were asked ahead for all of it */
                box_read_ahead(x, outer);
        for (uint64_t o = 0; o < outer; o++) {
                uint64_t rem = o, src = 0, base = x->dst_base;
                for (size_t j = x->m; j-- > 0;) {
                        idx[j] = (int64_t) (rem % (uint64_t) b->src_extent[j]);
                        rem /= (uint64_t) b->src_extent[j];
                }
                for (size_t j = 0; j < x->k; j++)
                        src += (uint64_t) (b->src_offset[j] + (j < x->m ? idx[j] : 0)) *
                               x->src_stride[j];
                for (size_t j = 0; j < x->m; j++)
                        base += (uint64_t) idx[j] * x->dst_stride[j];
                if (x->runs) {
                        r = runs_grow(x->runs);
                        if (r < 0)
                                return r;
                        x->runs->runs[x->runs->n++] = (BuildCheckpointRun) {
                                .at = x->file->header->data_offset + x->tensor->begin +
                                      src * x->in,
                                .dst = dst + base * x->out,
                                .bytes = x->run * x->in,
                        };
                        continue;
                }
                if (x->band) {
                        /* The whole run is in memory: one copy, converted. */
                        const uint8_t *from = x->band + (src - x->band_first) * x->in;
                        if (direct)
                                memcpy(dst + base * x->out, from, x->run * x->in);
                        else
                                scatter(x, x->tensor->dtype, to, from, base, 0, x->run, dst);
                        continue;
                }
                for (uint64_t first = 0; first < x->run; first += chunk) {
                        size_t n = (size_t) (x->run - first < chunk ? x->run - first : chunk);
                        uint64_t at = x->file->header->data_offset + x->tensor->begin +
                                      (src + first) * x->in;
                        uint8_t *buf = direct ? dst + (base + first) * x->out : staging;
                        r = read_full(x->file, buf, n * x->in, at, reads, ret_error);
                        if (r < 0)
                                return r;
                        if (!direct)
                                scatter(x, x->tensor->dtype, to, staging, base, first, n, dst);
                }
        }
        return 0;
}

static int dtype_refused(const ParameterLayout *p, const CheckpointBlock *block,
                         const SafetensorsTensor *t, FamilyError *ret_error) {
        char why[160];

        if (checkpoint_dtype_check(t->dtype, p->dtype, why, sizeof why) >= 0)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "CHECKPOINT_DTYPE",
                                NULL, "parameter '%s': checkpoint tensor '%s': %s", p->name,
                                block->tensor, why);
}

static Box box_of(const BuildCheckpoint *c, const BuildCheckpointTensor *t,
                  const ParameterLayout *p, const CheckpointBlock *block) {
        return (Box) { .file = &c->files[t->file], .tensor = t->tensor, .block = block,
                       .in = safetensors_dtype_bits(t->tensor->dtype) / 8,
                       .out = dtype_size(p->dtype), .k = block->n_src_dims,
                       .read_whole = t->read_whole };
}

int build_checkpoint_read_slice(const BuildCheckpoint *c, const CheckpointSource *src,
                                const char *prefix, const ParameterLayout *p,
                                const ShardSlice *slice, uint8_t *dst, uint8_t *staging,
                                size_t staging_size, BuildCheckpointReads *reads,
                                FamilyError *ret_error) {
        CheckpointBlock *blocks = NULL;
        size_t n = 0;
        int r;

        if (staging_size < READ_STAGING_MIN)
                return -EINVAL;
        r = checkpoint_plan_slice(src, prefix, p, slice, build_checkpoint_shape_of, (void *) c,
                                  &blocks, &n, ret_error);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                const BuildCheckpointTensor *t = build_checkpoint_find(c, blocks[i].tensor);
                if (t->banded)
                        continue; /* the bands fill it */
                Box x = box_of(c, t, p, &blocks[i]);
                r = dtype_refused(p, &blocks[i], t->tensor, ret_error);
                if (r < 0)
                        break;
                box_layout(&x, p, slice);
                r = read_box(&x, p->dtype, dst, staging, staging_size, reads, ret_error);
        }
        checkpoint_blocks_free(blocks, n);
        return r;
}

int build_checkpoint_read_band(const BuildCheckpoint *c, size_t t, int64_t row, int64_t rows,
                               uint8_t *band, BuildCheckpointReads *reads,
                               FamilyError *ret_error) {
        const BuildCheckpointTensor *x = &c->tensors[t];
        uint64_t row_bytes = build_checkpoint_row_bytes(c, t);

        return read_full(&c->files[x->file], band, (size_t) ((uint64_t) rows * row_bytes),
                         c->files[x->file].header->data_offset + x->tensor->begin +
                                 (uint64_t) row * row_bytes,
                         reads, ret_error);
}

/* Cuts block to the tensor's rows [row, row + rows) (axis 0) and moves where it lands to
 * match; false when it has none of them. */
static bool block_cut(CheckpointBlock *block, size_t n_dims, int64_t row, int64_t rows) {
        int64_t lo = block->src_offset[0] > row ? block->src_offset[0] : row;
        int64_t end = block->src_offset[0] + block->src_extent[0];
        int64_t hi = end < row + rows ? end : row + rows;

        if (hi <= lo)
                return false;
        for (size_t d = 0; d < n_dims; d++)
                if (block->src_axis[d] == 0)
                        block->dst_offset[d] += lo - block->src_offset[0];
        block->src_offset[0] = lo;
        block->src_extent[0] = hi - lo;
        return true;
}

/* Target x's part of its tensor's rows [row, row + rows): its block cut to them, laid out
 * and read (from band, or noted as runs). Its pages are present already: every piece of a
 * rank is made present before it is read, the banded boxes too. */
static int band_block(const BuildCheckpoint *c, const BuildCheckpointTarget *x,
                      const uint8_t *band, BuildCheckpointRuns *runs, int64_t row, int64_t rows,
                      FamilyError *ret_error) {
        const BuildCheckpointTensor *t = &c->tensors[x->tensor];
        uint64_t row_elements = build_checkpoint_row_bytes(c, x->tensor) /
                                (safetensors_dtype_bits(t->tensor->dtype) / 8);
        CheckpointBlock block = x->block;
        int r;

        if (!block_cut(&block, x->slice->n_dims, row, rows))
                return 0;
        r = dtype_refused(x->p, &block, t->tensor, ret_error);
        if (r < 0)
                return r;
        Box b = box_of(c, t, x->p, &block);
        b.band = band;
        b.band_first = (uint64_t) row * row_elements;
        b.runs = runs;
        box_layout(&b, x->p, x->slice);
        if (runs && !(b.dst_contiguous && checkpoint_dtype_same(t->tensor->dtype, x->p->dtype)))
                return -EOPNOTSUPP; /* converted or scattered: through memory */
        return read_box(&b, x->p->dtype, x->dst, NULL, 0, NULL, ret_error);
}

int build_checkpoint_scatter_band(const BuildCheckpoint *c, const BuildCheckpointTarget *x,
                                  const uint8_t *band, int64_t row, int64_t rows,
                                  FamilyError *ret_error) {
        return band_block(c, x, band, NULL, row, rows, ret_error);
}

int build_checkpoint_band_runs(const BuildCheckpoint *c, const BuildCheckpointTarget *x,
                               int64_t row, int64_t rows, BuildCheckpointRuns *runs,
                               FamilyError *ret_error) {
        return band_block(c, x, NULL, runs, row, rows, ret_error);
}

int build_checkpoint_band_targets(const BuildCheckpoint *c, const CheckpointSource *src,
                                  const char *prefix, const ParameterLayout *p,
                                  const ShardSlice *slice, uint8_t *dst,
                                  BuildCheckpointTargets *targets, FamilyError *ret_error) {
        CheckpointBlock *blocks = NULL;
        size_t n = 0;
        int r;

        r = checkpoint_plan_slice(src, prefix, p, slice, build_checkpoint_shape_of, (void *) c,
                                  &blocks, &n, ret_error);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                const BuildCheckpointTensor *t = build_checkpoint_find(c, blocks[i].tensor);
                if (!t->banded)
                        continue;
                BuildCheckpointTarget *grown = reallocarray(targets->targets, targets->n + 1,
                                                            sizeof *grown);
                if (!grown) {
                        r = -ENOMEM;
                        break;
                }
                targets->targets = grown;
                grown[targets->n++] = (BuildCheckpointTarget) {
                        .tensor = (size_t) (t - c->tensors), .p = p, .slice = slice, .dst = dst,
                        .block = blocks[i],
                };
                blocks[i].tensor = NULL; /* the target's now */
        }
        checkpoint_blocks_free(blocks, n);
        return r;
}

void build_checkpoint_targets_done(BuildCheckpointTargets *targets) {
        for (size_t i = 0; i < targets->n; i++)
                free(targets->targets[i].block.tensor);
        targets->targets = mfree(targets->targets);
        targets->n = 0;
}

static int run_compare(const void *a, const void *b) {
        const BuildCheckpointRun *x = a, *y = b;
        return x->at < y->at ? -1 : x->at > y->at;
}

int build_checkpoint_read_runs(const BuildCheckpoint *c, size_t t, int64_t row, int64_t rows,
                               BuildCheckpointRuns *runs, BuildCheckpointReads *reads,
                               FamilyError *ret_error) {
        const BuildCheckpointFile *f = &c->files[c->tensors[t].file];
        uint64_t row_bytes = build_checkpoint_row_bytes(c, t);
        uint64_t at = f->header->data_offset + c->tensors[t].tensor->begin +
                      (uint64_t) row * row_bytes;
        uint64_t end = at + (uint64_t) rows * row_bytes;
        struct iovec iov[IOV_MAX];
        size_t next = 0;

        if (runs->n > 0)
                qsort(runs->runs, runs->n, sizeof *runs->runs, run_compare);
        /* They must tile the rows: one destination per byte, none left out. */
        uint64_t expect = at;
        for (size_t i = 0; i < runs->n; expect += runs->runs[i++].bytes)
                if (runs->runs[i].at != expect)
                        return -EOPNOTSUPP;
        if (runs->n == 0 || runs->runs[runs->n - 1].at + runs->runs[runs->n - 1].bytes != end)
                return -EOPNOTSUPP;
        while (next < runs->n) {
                size_t k = 0;
                for (; k < IOV_MAX && next + k < runs->n; k++)
                        iov[k] = (struct iovec) { .iov_base = runs->runs[next + k].dst,
                                                  .iov_len = runs->runs[next + k].bytes };
                uint64_t from = runs->runs[next].at;
                ssize_t n = preadv(f->fd, iov, (int) k, (off_t) from);
                if (n < 0 && errno == EINTR)
                        continue;
                reads->calls++;
                if (n <= 0)
                        return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE,
                                                "CHECKPOINT_READ", NULL,
                                                "checkpoint file %s: %s at byte %" PRIu64,
                                                f->name,
                                                n < 0 ? strerror(errno)
                                                      : "it ended early (it changed since it "
                                                        "was opened)",
                                                from);
                reads->bytes += (uint64_t) n;
                /* Past what was read: whole runs are done, a part-read one goes on. */
                uint64_t done = (uint64_t) n;
                while (done > 0 && done >= runs->runs[next].bytes)
                        done -= runs->runs[next++].bytes;
                if (done > 0) {
                        runs->runs[next].at += done;
                        runs->runs[next].dst += done;
                        runs->runs[next].bytes -= done;
                }
        }
        return 0;
}

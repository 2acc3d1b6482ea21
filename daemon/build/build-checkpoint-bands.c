/* build-checkpoint-bands.c: the checkpoint tensors a node reads whole in columns, read once in bands of whole rows and scattered to every rank. */

/*
 * DESIGN: a column shard is part of every row of its tensor, so a rank's slice of it is one
 * small read per row, and the node's other ranks read the rest of the same rows. When the
 * node's ranks together read such a tensor whole (build-checkpoint-whole.c marks it banded),
 * the slices skip it and this pass reads it instead, after every rank's own reads and before
 * any segment is unmapped: bands of whole rows of at most BUILD_CHECKPOINT_BAND_BYTES, one read
 * each (a few large reads in flight, one per fill thread). Where a band's rows go is planned
 * once for the Build, not per band: every slice's blocks of banded tensors (its targets),
 * sorted by tensor, so a band visits only its tensor's targets, whatever the model's size. A
 * band none of whose bytes needs converting or scattering (the parameter's dtype, each run
 * landing in consecutive elements), whose runs tile its rows and average BAND_RUN_MIN_BYTES
 * or more, is read with preadv straight into every rank's slices, its runs in file order (up
 * to IOV_MAX a call): no buffer, no copy but the kernel's. Any other is read into a buffer and
 * scattered from memory. Every byte of the tensor is read once. The band buffers are a pool of at most
 * one per fill thread at work, freed at the end: the memory beyond the shards stays threads x
 * band, whatever the model's size. Only builds whose reading ranks are all in
 * host memory are banded (a GPU rank's piece goes up through a host buffer of its own). A
 * thread asks the kernel for the next band's rows before it reads its own (every window of
 * them: hw/read-ahead.h), so the disk has a band's requests in flight while a band
 * is read and scattered, instead of the kernel's readahead of one window or two.
 */

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>

#include "build-private.h"
#include "hw/read-ahead.h"

/* A band whose runs average fewer bytes than this goes through memory: a preadv's iovec per
 * run would cost more than the copy it saves, and the runs' list stays at most 1/40 of the band. */
#define BAND_RUN_MIN_BYTES 1024

typedef struct Band {
        size_t tensor;
        int64_t row, rows;
        size_t first, n_targets; /* the tensor's targets in BandRead.targets */
} Band;

typedef struct BandRead {
        const BuildState *b;
        BuildCheckpointTargets targets; /* every slice's blocks of banded tensors, by tensor */
        Band *bands;
        size_t n_bands;
        BuildProgress *progress;
        atomic_uint_fast64_t bytes, calls;
        BuildFillFailure failure;
        pthread_mutex_t lock; /* spare */
        uint8_t **spare;      /* buffers of BUILD_CHECKPOINT_BAND_BYTES not in use */
        size_t n_spare;
} BandRead;

static int target_compare(const void *a, const void *b) {
        const BuildCheckpointTarget *x = a, *y = b;
        return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

/* Every slice of every rank that reads (bases[i]: its mapping, NULL for a replica or a rank
 * not here), planned once: its blocks of banded tensors, sorted by tensor. */
static int targets_of(const BuildState *b, uint8_t *const *bases, BuildCheckpointTargets *ret,
                      FamilyError *ret_error) {
        int r = 0;

        for (size_t i = 0; r >= 0 && i < b->n_ranks; i++) {
                const RankLayout *rl = &b->layout.ranks[i];
                for (size_t k = 0; r >= 0 && bases[i] && k < rl->n_slices; k++) {
                        const ShardSlice *s = &rl->slices[k];
                        if (s->byte_length > 0)
                                r = build_checkpoint_band_targets(
                                        b->checkpoint, &b->plan.parameters[s->parameter].checkpoint,
                                        b->checkpoint_prefix, &b->layout.parameters[s->parameter],
                                        s, bases[i] + s->byte_offset, ret, ret_error);
                }
        }
        if (r >= 0 && ret->n > 0)
                qsort(ret->targets, ret->n, sizeof *ret->targets, target_compare);
        return r;
}

/* The bands of every banded tensor (whole rows, BUILD_CHECKPOINT_BAND_BYTES at most), each
 * with its tensor's targets. */
static int bands_of(const BuildCheckpoint *c, const BuildCheckpointTargets *targets,
                    Band **ret, size_t *ret_n) {
        Band *bands = NULL;
        size_t n = 0, first = 0;

        for (size_t t = 0; t < c->n_tensors; t++) {
                if (!c->tensors[t].banded)
                        continue;
                while (first < targets->n && targets->targets[first].tensor < t)
                        first++;
                size_t end = first;
                while (end < targets->n && targets->targets[end].tensor == t)
                        end++;
                uint64_t row_bytes = build_checkpoint_row_bytes(c, t);
                int64_t rows = (int64_t) c->tensors[t].tensor->shape[0];
                int64_t per = row_bytes > 0 ? (int64_t) (BUILD_CHECKPOINT_BAND_BYTES / row_bytes)
                                            : rows;
                if (per < 1)
                        per = 1;
                for (int64_t at = 0; at < rows; at += per) {
                        Band *grown = reallocarray(bands, n + 1, sizeof *bands);
                        if (!grown) {
                                free(bands);
                                return -ENOMEM;
                        }
                        bands = grown;
                        bands[n++] = (Band) { t, at, rows - at < per ? rows - at : per, first,
                                              end - first };
                }
                first = end;
        }
        *ret = bands;
        *ret_n = n;
        return 0;
}

static uint8_t *buffer_take(BandRead *br) {
        uint8_t *buf = NULL;

        (void) pthread_mutex_lock(&br->lock);
        if (br->n_spare > 0)
                buf = br->spare[--br->n_spare];
        (void) pthread_mutex_unlock(&br->lock);
        return buf ? buf : malloc(BUILD_CHECKPOINT_BAND_BYTES);
}

static void buffer_give(BandRead *br, uint8_t *buf) {
        (void) pthread_mutex_lock(&br->lock);
        uint8_t **grown = reallocarray(br->spare, br->n_spare + 1, sizeof *grown);
        if (grown) {
                br->spare = grown;
                br->spare[br->n_spare++] = buf;
                buf = NULL;
        }
        (void) pthread_mutex_unlock(&br->lock);
        free(buf);
}

/* Band's part of every target of its tensor: from buf (read), or, with buf NULL, noted as
 * runs for one preadv straight into the slices. */
static int band_targets(const BandRead *br, const Band *band, const uint8_t *buf,
                        BuildCheckpointRuns *runs, FamilyError *e) {
        const BuildCheckpoint *c = br->b->checkpoint;
        int r = 0;

        for (size_t i = band->first; r >= 0 && i < band->first + band->n_targets; i++) {
                const BuildCheckpointTarget *x = &br->targets.targets[i];
                r = buf ? build_checkpoint_scatter_band(c, x, buf, band->row, band->rows, e)
                        : build_checkpoint_band_runs(c, x, band->row, band->rows, runs, e);
        }
        return r;
}

/* The band read straight into the slices (no byte converted or scattered), or -EOPNOTSUPP. */
static int band_direct(const BandRead *br, const Band *band, BuildCheckpointReads *reads,
                       FamilyError *e) {
        uint64_t bytes = (uint64_t) band->rows *
                         build_checkpoint_row_bytes(br->b->checkpoint, band->tensor);
        BuildCheckpointRuns runs = { .max = (size_t) (bytes / BAND_RUN_MIN_BYTES) + 1 };
        int r = band_targets(br, band, NULL, &runs, e);

        if (r >= 0)
                r = build_checkpoint_read_runs(br->b->checkpoint, band->tensor, band->row,
                                               band->rows, &runs, reads, e);
        free(runs.runs);
        return r;
}

/* The band through a buffer of the pool: read whole, then converted and scattered. */
static int band_through_memory(BandRead *br, const Band *band, BuildCheckpointReads *reads,
                               FamilyError *e) {
        uint8_t *buf = buffer_take(br);
        int r;

        if (!buf)
                return -ENOMEM;
        r = build_checkpoint_read_band(br->b->checkpoint, band->tensor, band->row, band->rows,
                                       buf, reads, e);
        if (r >= 0)
                r = band_targets(br, band, buf, NULL, e);
        buffer_give(br, buf);
        return r;
}

/* Band's rows asked of the kernel ahead, every window of them (hw/read-ahead.h). */
static void band_will_need(const BandRead *br, const Band *band) {
        const BuildCheckpoint *c = br->b->checkpoint;
        const BuildCheckpointTensor *x = &c->tensors[band->tensor];
        const BuildCheckpointFile *f = &c->files[x->file];
        uint64_t row_bytes = build_checkpoint_row_bytes(c, band->tensor);

        read_ahead(f->fd,
                   f->header->data_offset + x->tensor->begin + (uint64_t) band->row * row_bytes,
                   (uint64_t) band->rows * row_bytes, f->read_ahead);
}

/* A fill thread: one band, read and scattered. The next band's rows are asked ahead first
 * (the first band's too, by its thread), so the disk works on them while this band is read in
 * order and scattered. */
static void band_run(void *userdata, uint64_t chunk) {
        BandRead *br = userdata;
        const Band *band = &br->bands[chunk];
        BuildCheckpointReads reads = {};
        FamilyError e = FAMILY_ERROR_NULL;
        int r;

        if (atomic_load(&br->failure.failed))
                return;
        if (chunk == 0)
                band_will_need(br, band);
        if (chunk + 1 < br->n_bands)
                band_will_need(br, &br->bands[chunk + 1]);
        r = band_direct(br, band, &reads, &e);
        if (r == -EOPNOTSUPP || r == -ENOMEM) /* the runs would not do, or not fit */
                r = band_through_memory(br, band, &reads, &e);
        atomic_fetch_add(&br->bytes, reads.bytes);
        atomic_fetch_add(&br->calls, reads.calls);
        build_progress_add_read(br->progress, reads.bytes);
        if (r < 0)
                build_fill_failure_set(&br->failure, r, &e);
}

int build_checkpoint_fill_bands(const Builder *builder, BuildState *b, BuildProgress *progress,
                                bool (*expired)(void *userdata), void *userdata,
                                FamilyError *ret_error) {
        _cleanup_free_ uint8_t **bases = NULL;
        BandRead br = { .b = b, .progress = progress };
        int r;

        if (!build_checkpoint_has_bands(b->checkpoint))
                return 0;
        bases = calloc(b->n_ranks, sizeof *bases);
        if (!bases)
                return -ENOMEM;
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !b->ranks[i].replica && b->ranks[i].segment) {
                        bases[i] = shard_segment_data(b->ranks[i].segment);
                        if (!bases[i]) /* banded builds are read into host memory only */
                                return -EINVAL;
                }
        r = targets_of(b, bases, &br.targets, ret_error);
        if (r >= 0)
                r = bands_of(b->checkpoint, &br.targets, &br.bands, &br.n_bands);
        if (r < 0) {
                build_checkpoint_targets_done(&br.targets);
                return r;
        }
        (void) pthread_mutex_init(&br.lock, NULL);
        build_fill_failure_init(&br.failure);
        r = build_fill_run(builder, -1,
                           &(FillPoolWork) { .run = band_run, .userdata = &br,
                                             .n_chunks = br.n_bands },
                           expired, userdata);
        (void) pthread_mutex_destroy(&br.lock);
        for (size_t i = 0; i < br.n_spare; i++)
                free(br.spare[i]);
        free(br.spare);
        free(br.bands);
        build_checkpoint_targets_done(&br.targets);
        build_count_checkpoint_read(builder, 0, atomic_load(&br.bytes), atomic_load(&br.calls));
        return build_fill_failure_take(&br.failure, r, ret_error);
}

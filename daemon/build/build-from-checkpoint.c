/* build-from-checkpoint.c: a Build whose values come from a deposited checkpoint: every slice planned before anything is reserved, then each rank read in pieces on the fill threads. */

/*
 * DESIGN: the deposit's files are opened (their headers read and checked, and the index, if
 * one) when the Build is prepared, and every slice this node fills is planned then
 * (core/checkpoint-plan.h): a checkpoint that cannot fill the member is refused before
 * anything is reserved, and the bytes to read are known for the progress. Replicas read
 * nothing: their primary's segment is theirs. A rank is read in pieces of about
 * CHECKPOINT_PIECE_BYTES of the slice (whole rows of its first dimension) handed to the fill
 * threads, each piece with its own staging buffer of CHECKPOINT_STAGING_BYTES, so as many
 * reads are in flight as there are threads and the memory beyond the shards is threads x
 * staging, whatever the model's size. Every byte a shard needs is read once. Banded tensors
 * (columns of a tensor the node reads whole) are left to the bands, which run after every
 * rank, while the ranks' segments are still mapped (build-checkpoint-bands.c). A rank in GPU
 * memory reads each piece into host memory of the piece's size, then copies it up
 * (accel_write()): the extra memory is threads x (staging + piece).
 */

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

#include "build-private.h"
#include "common/populate.h"
#include "core/checkpoint-dtype.h"

#define CHECKPOINT_PIECE_BYTES (UINT64_C(16) << 20)
#define CHECKPOINT_STAGING_BYTES (UINT64_C(4) << 20)

/* ---- preparing ------------------------------------------------------------------------- */

static int refuse_names(const BuildState *b, const PlanParameter *p, FamilyError *ret_error) {
        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "CHECKPOINT_NAMES",
                                NULL,
                                "parameter '%s' of family '%s' has no checkpoint name in the "
                                "registry, so a checkpoint cannot fill it (docs/registry.md, "
                                "\"Checkpoint names\")",
                                p->name, b->plan.resolved.family);
}

/* CheckpointRef.names "parameters": p's tensor is "{prefix}.<its name>", in its shape. */
static int source_by_name(PlanParameter *p) {
        _cleanup_(checkpoint_source_done) CheckpointSource s = {};
        size_t size = strlen(p->name) + sizeof "{prefix}.";

        s.parts = calloc(1, sizeof *s.parts);
        if (!s.parts)
                return -ENOMEM;
        s.n_parts = 1;
        s.parts[0].tensor = malloc(size);
        if (!s.parts[0].tensor)
                return -ENOMEM;
        (void) snprintf(s.parts[0].tensor, size, "{prefix}.%s", p->name);
        int r = checkpoint_source_make_text(&s);
        if (r < 0)
                return r;
        checkpoint_source_done(&p->checkpoint);
        p->checkpoint = s;
        p->has_checkpoint = true;
        s = (CheckpointSource) {};
        return 0;
}

/* Plans slice s (of b's layout) against b->checkpoint: its refusals and its boxes (noted for
 * build_checkpoint_mark_read_whole()). */
static int plan_slice(const BuildState *b, const ShardSlice *s, FamilyError *ret_error) {
        const PlanParameter *pp = &b->plan.parameters[s->parameter];
        const ParameterLayout *p = &b->layout.parameters[s->parameter];
        CheckpointBlock *blocks = NULL;
        size_t n = 0;
        char why[160];
        int r;

        r = checkpoint_plan_slice(&pp->checkpoint, b->checkpoint_prefix, p, s,
                                  build_checkpoint_shape_of, b->checkpoint, &blocks, &n,
                                  ret_error);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                const BuildCheckpointTensor *t = build_checkpoint_find(b->checkpoint,
                                                                       blocks[i].tensor);
                if (checkpoint_dtype_check(t->tensor->dtype, p->dtype, why, sizeof why) < 0) {
                        r = family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                             "CHECKPOINT_DTYPE", NULL,
                                             "parameter '%s': checkpoint tensor '%s': %s",
                                             p->name, blocks[i].tensor, why);
                        break;
                }
                r = build_checkpoint_note_read(b->checkpoint, &blocks[i]);
        }
        checkpoint_blocks_free(blocks, n);
        return r;
}

/* Plans every slice the node's ranks read: the tensors read whole, which of those are banded
 * (when every rank that reads is in host memory), and b->checkpoint_bytes, what the node will
 * read. */
static int plan_node(BuildState *b, FamilyError *ret_error) {
        bool host = true;
        int r = 0;

        for (size_t i = 0; r >= 0 && i < b->n_ranks; i++) {
                const RankLayout *rl = &b->layout.ranks[i];
                if (!b->ranks[i].materialized || b->ranks[i].replica)
                        continue;
                host = host && !build_rank_on_gpu(&b->ranks[i]);
                for (size_t k = 0; r >= 0 && k < rl->n_slices; k++)
                        if (rl->slices[k].byte_length > 0)
                                r = plan_slice(b, &rl->slices[k], ret_error);
        }
        return r < 0 ? r
                     : build_checkpoint_mark_read_whole(b->checkpoint, host,
                                                        &b->checkpoint_bytes);
}

int build_checkpoint_prepare(const Builder *builder, BuildState *b, const BuildRequest *req,
                             int64_t uid, FamilyError *ret_error) {
        _cleanup_(checkpoint_files_done) CheckpointFiles files = {};
        int r;

        if (!req->has_checkpoint)
                return 0;
        if (!b->plan.materialize.enabled)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BINDING",
                                        "checkpoint",
                                        "a Build from a checkpoint must materialise: set "
                                        "materialize (a layout alone reads nothing)");
        for (size_t i = 0; i < b->plan.n_parameters; i++) {
                PlanParameter *p = &b->plan.parameters[i];
                if (req->checkpoint_by_parameter) {
                        r = source_by_name(p);
                        if (r < 0)
                                return r;
                } else if (!p->has_checkpoint)
                        return refuse_names(b, p, ret_error);
        }
        b->checkpoint_by_parameter = req->checkpoint_by_parameter;

        r = builder->deposits && uid >= 0
                    ? checkpoint_deposits_open(builder->deposits, req->checkpoint_token,
                                               (uid_t) uid, &files)
                    : -ENOENT;
        if (r == -ENOENT)
                return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "CHECKPOINT_TOKEN",
                                        "checkpoint.token",
                                        "checkpoint token unknown: never deposited, dropped "
                                        "after %u s unused, or deposited by another user; "
                                        "deposit the files again on the shard socket",
                                        CHECKPOINT_DEPOSIT_IDLE_MS / 1000u);
        if (r == -EMFILE || r == -ENFILE)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "FD_LIMIT",
                                        NULL, "out of file descriptors for the checkpoint");
        if (r < 0)
                return r;
        r = build_checkpoint_open_files(&files, &b->checkpoint, ret_error);
        if (r < 0)
                return r;
        b->checkpoint_prefix = strdup(strempty(req->checkpoint_prefix));
        if (!b->checkpoint_prefix)
                return -ENOMEM;

        r = plan_node(b, ret_error);
        if (r < 0)
                return r;
        return build_checkpoint_identity(b->checkpoint, b->checkpoint_identity);
}

/* ---- reading a rank -------------------------------------------------------------------- */

typedef struct Piece {
        const ShardSlice *slice;
        int64_t row, rows; /* of the slice's first dimension (a scalar: 0, 1) */
} Piece;

typedef struct RankRead {
        const BuildState *b;
        Accel *accel;
        ShardSegment *segment;
        uint8_t *base; /* the rank's first byte, mapped; NULL: in GPU memory */
        Piece *pieces;
        size_t n_pieces;
        BuildProgress *progress;
        atomic_uint_fast64_t bytes_read, read_calls;
        BuildFillFailure failure;
} RankRead;

/* Bytes of one row of the slice's first dimension (the whole slice for a scalar). */
static uint64_t row_bytes(const ShardSlice *s) {
        return s->n_dims > 0 && s->local_shape[0] > 0
                       ? s->byte_length / (uint64_t) s->local_shape[0]
                       : s->byte_length;
}

static int pieces_of(const RankLayout *rl, Piece **ret, size_t *ret_n) {
        Piece *pieces = NULL;
        size_t n = 0;

        for (size_t k = 0; k < rl->n_slices; k++) {
                const ShardSlice *s = &rl->slices[k];
                if (s->byte_length == 0)
                        continue;
                int64_t rows = s->n_dims > 0 ? s->local_shape[0] : 1;
                uint64_t rb = row_bytes(s) ? row_bytes(s) : 1;
                uint64_t per_rows = CHECKPOINT_PIECE_BYTES / rb;
                int64_t per = per_rows > 0 ? (int64_t) per_rows : 1;
                for (int64_t at = 0; at < rows; at += per) {
                        Piece *grown = reallocarray(pieces, n + 1, sizeof *pieces);
                        if (!grown) {
                                free(pieces);
                                return -ENOMEM;
                        }
                        pieces = grown;
                        pieces[n++] = (Piece) { s, at, rows - at < per ? rows - at : per };
                }
        }
        *ret = pieces;
        *ret_n = n;
        return 0;
}

/* A fill thread: one piece, its rows of the slice read as a slice of their own. */
static void read_piece(void *userdata, uint64_t chunk) {
        RankRead *rr = userdata;
        const Piece *pc = &rr->pieces[chunk];
        const ShardSlice *s = pc->slice;
        const BuildState *b = rr->b;
        int64_t local[FAMILYD_MAX_SHAPE_RANK], offset[FAMILYD_MAX_SHAPE_RANK];
        FamilyError e = FAMILY_ERROR_NULL;
        _cleanup_free_ uint8_t *staging = NULL;
        BuildCheckpointReads reads = {};
        int r;

        if (atomic_load(&rr->failure.failed))
                return;
        ShardSlice part = *s;
        if (s->n_dims > 0) {
                memcpy(local, s->local_shape, s->n_dims * sizeof(int64_t));
                memcpy(offset, s->global_offset, s->n_dims * sizeof(int64_t));
                local[0] = pc->rows;
                offset[0] += pc->row;
                part.local_shape = local;
                part.global_offset = offset;
        }
        uint64_t at = s->byte_offset + (uint64_t) pc->row * row_bytes(s);
        uint64_t size = (uint64_t) pc->rows * row_bytes(s);
        _cleanup_free_ uint8_t *piece = NULL;
        staging = malloc(CHECKPOINT_STAGING_BYTES);
        if (!rr->base && size <= SIZE_MAX)
                piece = malloc((size_t) size);
        if (!staging || (!rr->base && !piece)) {
                build_fill_failure_set(&rr->failure, -ENOMEM, &e);
                return;
        }
        if (rr->base)
                (void) memory_populate_write(rr->base + at, (size_t) size);
        r = build_checkpoint_read_slice(
                b->checkpoint, &b->plan.parameters[s->parameter].checkpoint,
                b->checkpoint_prefix, &b->layout.parameters[s->parameter], &part,
                rr->base ? rr->base + at : piece, staging, CHECKPOINT_STAGING_BYTES, &reads, &e);
        atomic_fetch_add(&rr->bytes_read, reads.bytes);
        atomic_fetch_add(&rr->read_calls, reads.calls);
        build_progress_add_read(rr->progress, reads.bytes);
        if (r >= 0 && !rr->base)
                r = accel_write(rr->accel, rr->segment, at, piece, (size_t) size, &e);
        if (r < 0)
                build_fill_failure_set(&rr->failure, r, &e);
}

int build_checkpoint_fill_rank(const Builder *builder, BuildState *b, size_t i,
                               BuildProgress *progress, bool (*expired)(void *userdata),
                               void *userdata, FamilyError *ret_error) {
        BuildRankState *rs = &b->ranks[i];
        RankRead rr = { .b = b, .accel = builder->accel, .segment = rs->segment,
                        .progress = progress };
        int r;

        rr.base = shard_segment_data(rs->segment);
        if (!rr.base && !build_rank_on_gpu(rs))
                return -EINVAL;
        r = pieces_of(&b->layout.ranks[i], &rr.pieces, &rr.n_pieces);
        if (r < 0)
                return r;
        build_fill_failure_init(&rr.failure);
        r = build_fill_run(builder, rs->local_device,
                           &(FillPoolWork) { .run = read_piece,
                                             .userdata = &rr,
                                             .n_chunks = rr.n_pieces },
                           expired, userdata);
        free(rr.pieces);
        r = build_fill_failure_take(&rr.failure, r, ret_error);
        if (r < 0)
                return r;
        build_count_checkpoint_read(builder, 1, atomic_load(&rr.bytes_read),
                                    atomic_load(&rr.read_calls));
        /* The bands, after every rank, write into it too. */
        if (rr.base && !build_checkpoint_has_bands(b->checkpoint))
                shard_segment_unmap(rs->segment);
        return 0;
}

void build_checkpoint_unmap(BuildState *b) {
        for (size_t i = 0; i < b->n_ranks; i++)
                if (b->ranks[i].materialized && !b->ranks[i].replica && b->ranks[i].segment &&
                    !build_rank_on_gpu(&b->ranks[i]))
                        shard_segment_unmap(b->ranks[i].segment);
}

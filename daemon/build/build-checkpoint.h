/* build-checkpoint.h: a checkpoint a client opened for a Build: its files' descriptors and headers, tensors by name, and the reader that fills shard slices from them. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/safetensors.h"
#include "core/checkpoint-plan.h"
#include "core/error.h"
#include "core/layout.h"
#include "handout/checkpoint-deposit.h"

/* The headers one Build parses, in all (a model's are a few megabytes). */
#define BUILD_CHECKPOINT_HEADERS_MAX (UINT64_C(256) << 20)
/* The hex digits of a checkpoint's identity (BLAKE2b-256). */
#define BUILD_CHECKPOINT_ID_HEX 64

/*
 * DESIGN
 *
 * The daemon never opens a checkpoint's files: the client opens them with its own rights and
 * hands over the descriptors, so it reads nothing its caller could not. A BuildCheckpoint owns
 * those descriptors and their parsed headers (common/safetensors.h), checked against each other
 * (no tensor in two files) and, for a directory, against its index. Its identity (each file's
 * device, inode, size, modification time and header digest) is what a sharing key names, so a
 * changed file is a new checkpoint.
 *
 * The reader (build_checkpoint_read_slice) plans a slice (core/checkpoint-plan.h), then reads
 * each box: the box's rows are contiguous in the file (rows that are whole rows of the tensor
 * merge into longer runs), read with pread into a staging buffer of bounded size, converted to
 * the parameter's dtype (core/checkpoint-dtype.h) and scattered into the slice; a run already
 * in the parameter's dtype that lands in consecutive elements is read straight into the slice.
 * Every byte a slice needs is read once; nothing else is read. Each box is asked of the kernel
 * ahead before it is read (hw/read-ahead.h: in windows of the device's readahead size): a
 * box of one run, its bytes; a strided box of a tensor the node reads whole, the whole rows
 * it lies in (see read_whole).
 *
 * A tensor the node's ranks read whole but each in columns (a column shard: part of every
 * row) is banded: the slices' reads skip it, and the node reads it once in bands of whole rows
 * (build_checkpoint_read_band, a few large reads), each band scattered from memory to every
 * rank's part of it (build_checkpoint_scatter_band; build-checkpoint-bands.c runs the bands).
 */

typedef struct BuildCheckpointFile {
        int fd;
        char *name; /* for messages: the file name the client gave */
        SafetensorsHeader *header;
        uint64_t size;
        uint64_t read_ahead; /* what one read-ahead hint brings in (hw/read-ahead.h) */
} BuildCheckpointFile;

typedef struct BuildCheckpointTensor {
        const SafetensorsTensor *tensor; /* in its file's header */
        size_t file;
        /* The node's ranks need every byte of it (found when the Build is planned): a strided
         * box (a column shard: part of every row) then asks the kernel to read the whole rows
         * it lies in ahead (POSIX_FADV_WILLNEED), in large requests, and the node's other
         * ranks find their parts of the same rows cached; without it each part is a small
         * read of its own. */
        bool read_whole;
        /* Read whole and in columns, on host ranks only, rows of at most
         * BUILD_CHECKPOINT_BAND_BYTES: read by bands of whole rows, not by the slices. */
        bool banded;
} BuildCheckpointTensor;

/* A run of a band read straight into a slice: its bytes in the file from at, to dst. */
typedef struct BuildCheckpointRun {
        uint64_t at;
        uint8_t *dst;
        uint64_t bytes;
} BuildCheckpointRun;
typedef struct BuildCheckpointRuns {
        BuildCheckpointRun *runs;
        size_t n, allocated;
        size_t max; /* more runs than this: the band goes through memory (-EOPNOTSUPP) */
} BuildCheckpointRuns;

/* A slice's block of a banded tensor: where each band's rows of it go. */
typedef struct BuildCheckpointTarget {
        size_t tensor; /* index in the checkpoint's tensors */
        const ParameterLayout *p;
        const ShardSlice *slice;
        uint8_t *dst;         /* the slice's first byte, in p's dtype */
        CheckpointBlock block; /* owned (its tensor name) */
} BuildCheckpointTarget;
typedef struct BuildCheckpointTargets {
        BuildCheckpointTarget *targets;
        size_t n;
} BuildCheckpointTargets;

/* A band's bytes at most (whole rows of a banded tensor; one row at least). */
#define BUILD_CHECKPOINT_BAND_BYTES (UINT64_C(16) << 20)

/* What a reader did: the bytes it read from the files, and the read calls that read them. */
typedef struct BuildCheckpointReads {
        uint64_t bytes;
        uint64_t calls;
} BuildCheckpointReads;

typedef struct BuildCheckpointBox BuildCheckpointBox;

typedef struct BuildCheckpoint {
        BuildCheckpointFile *files;
        size_t n_files;
        BuildCheckpointTensor *tensors; /* every file's, by name */
        size_t n_tensors;
        BuildCheckpointBox *node_reads; /* build_checkpoint_note_read()'s, until marked */
        size_t n_node_reads;
} BuildCheckpoint;

BuildCheckpoint *build_checkpoint_free(BuildCheckpoint *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(BuildCheckpoint *, build_checkpoint_free);

/*
 * A checkpoint of n files: fds (taken over on success and on failure) with names for messages.
 * Each header is read and checked; a tensor in two files is refused. FAILED_PRECONDITION,
 * CHECKPOINT_INVALID, naming the file, for a bad one.
 */
int build_checkpoint_open(int *fds, const char *const *names, size_t n, BuildCheckpoint **ret,
                          FamilyError *ret_error);

/*
 * A deposit's files (taken over, on success and on failure): with an index among them (a name
 * ending ".index.json"), the files it names, in its order, checked against it (a file it names
 * that was not sent, or a disagreement: CHECKPOINT_INVALID naming both); else every file.
 */
int build_checkpoint_open_files(CheckpointFiles *files, BuildCheckpoint **ret,
                                FamilyError *ret_error);

/* What names c for sharing: a digest of each file's device, inode, size, modification and
 * change times (fstat now) and of its parsed header. */
int build_checkpoint_identity(const BuildCheckpoint *c,
                              char ret[static BUILD_CHECKPOINT_ID_HEX + 1]);

const BuildCheckpointTensor *build_checkpoint_find(const BuildCheckpoint *c, const char *name);

/* The CheckpointShapeFunc of a checkpoint (userdata: the BuildCheckpoint). */
int build_checkpoint_shape_of(const char *name, size_t *ret_n_dims,
                              int64_t ret_shape[static FAMILYD_MAX_SHAPE_RANK], void *userdata);

/*
 * Which tensors the node reads whole (BuildCheckpointTensor.read_whole), from every box its
 * ranks read: each noted (a planned block of a tensor of c), then marked once. A box two ranks
 * read counts once: a tensor is read whole when its distinct boxes add up to its bytes (a
 * layout's boxes of one tensor tile it). With bands (every rank that reads is in host memory),
 * one read whole of which a box is part of each row (narrower than the tensor along an inner
 * axis) is also banded, when a row has at most BUILD_CHECKPOINT_BAND_BYTES. Marking drops the
 * notes and says in *ret_bytes (when not NULL) the bytes the node will read: every noted box's
 * (a box two ranks need, such as a writable build's dp ranks, is read by each) but a banded
 * tensor's bytes once. 0 or -ENOMEM.
 */
int build_checkpoint_note_read(BuildCheckpoint *c, const CheckpointBlock *block);
int build_checkpoint_mark_read_whole(BuildCheckpoint *c, bool bands, uint64_t *ret_bytes);

/* Whether any tensor of c is banded. */
bool build_checkpoint_has_bands(const BuildCheckpoint *c);

/* The bytes of one row (every axis but the first) of tensor t of c; a scalar's: its size. */
uint64_t build_checkpoint_row_bytes(const BuildCheckpoint *c, size_t t);

/*
 * Fills slice (of parameter p, whose checkpoint source is src; dst: the slice's first byte, in
 * p's dtype) from c, reading through staging (staging_size bytes, at least 64 KiB), all but
 * its boxes of banded tensors. Adds what it read to *reads. Refusals: the plan's, and
 * CHECKPOINT_DTYPE (FAILED_PRECONDITION) for a tensor whose dtype does not convert;
 * -EIO-class errors from the files as CHECKPOINT_READ (UNAVAILABLE).
 */
int build_checkpoint_read_slice(const BuildCheckpoint *c, const CheckpointSource *src,
                                const char *prefix, const ParameterLayout *p,
                                const ShardSlice *slice, uint8_t *dst, uint8_t *staging,
                                size_t staging_size, BuildCheckpointReads *reads,
                                FamilyError *ret_error);

/* Rows [row, row + rows) of tensor t of c, whole, into band (rows x its row bytes). Adds what
 * it read to *reads; file errors as build_checkpoint_read_slice(). */
int build_checkpoint_read_band(const BuildCheckpoint *c, size_t t, int64_t row, int64_t rows,
                               uint8_t *band, BuildCheckpointReads *reads,
                               FamilyError *ret_error);

/*
 * The targets of slice (as build_checkpoint_read_slice(); dst its first byte): its blocks of
 * banded tensors, appended to *targets, planned once for every band of the Build. Refusals as
 * the plan's; free with build_checkpoint_targets_done().
 */
int build_checkpoint_band_targets(const BuildCheckpoint *c, const CheckpointSource *src,
                                  const char *prefix, const ParameterLayout *p,
                                  const ShardSlice *slice, uint8_t *dst,
                                  BuildCheckpointTargets *targets, FamilyError *ret_error);
void build_checkpoint_targets_done(BuildCheckpointTargets *targets);

/*
 * A band straight into the slices, when no byte of it needs converting or scattering: each
 * target's runs in tensor rows [row, row + rows) are noted (build_checkpoint_band_runs():
 * appended to *runs; -EOPNOTSUPP when a run would need either, or when runs->max runs would
 * not hold them), then build_checkpoint_read_runs() reads them in file order with preadv, up
 * to IOV_MAX runs a call, straight into their slices: no copy but the kernel's, no buffer. It
 * returns -EOPNOTSUPP, reading nothing, unless the runs tile the rows exactly (two slices
 * needing the same bytes, or bytes no slice needs); file errors as
 * build_checkpoint_read_slice().
 */
int build_checkpoint_band_runs(const BuildCheckpoint *c, const BuildCheckpointTarget *x,
                               int64_t row, int64_t rows, BuildCheckpointRuns *runs,
                               FamilyError *ret_error);
int build_checkpoint_read_runs(const BuildCheckpoint *c, size_t t, int64_t row, int64_t rows,
                               BuildCheckpointRuns *runs, BuildCheckpointReads *reads,
                               FamilyError *ret_error);

/* Otherwise: fills target x's part of its tensor's rows [row, row + rows), which band holds
 * (as build_checkpoint_read_band() read them): its block cut to those rows, converted and
 * scattered from memory. */
int build_checkpoint_scatter_band(const BuildCheckpoint *c, const BuildCheckpointTarget *x,
                                  const uint8_t *band, int64_t row, int64_t rows,
                                  FamilyError *ret_error);

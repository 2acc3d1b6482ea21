/* fill.h: parameter values when materialising (docs/semantics.md, Build step 6), bit-exact. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#include "common/macro.h"
#include "fill-pool.h"
#include "registry.h"

/*
 * Every element's value is a pure function of (init, seed, parameter name, dtype, global
 * row-major index i): Philox4x32-10 with counter (lo32(i), hi32(i), fnv1a32(name), 0) and key
 * (lo32(seed), hi32(seed)). Only integer operations and correctly rounded IEEE-754 float32
 * additions, multiplications, square roots and conversions are used, with contraction off and no
 * libm, so the bits never depend on slicing, thread count, vector width or the CPU's ISA.
 */

typedef enum Dtype {
        DTYPE_FLOAT32,
        DTYPE_BFLOAT16,
        DTYPE_FLOAT16,
        _DTYPE_MAX,
        _DTYPE_INVALID = -EINVAL,
} Dtype;

/* "float32" | "bfloat16" | "float16" and the aliases f32, fp32, bf16, f16, fp16; NULL or "" is
 * float32 (the default). _DTYPE_INVALID otherwise. */
Dtype dtype_from_string(const char *s);
/* The canonical name; NULL for an invalid dtype. */
const char *dtype_to_string(Dtype d);
/* Bytes per element; 0 for an invalid dtype. */
size_t dtype_size(Dtype d);

/* 32-bit FNV-1a. */
uint32_t fnv1a32(const void *data, size_t n);
uint32_t fnv1a32_string(const char *s);

/* Philox4x32-10 (Salmon et al., Random123's philox4x32 with 10 rounds). */
void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t ret[4]);

/* float32 to bfloat16 / float16 bits, round to nearest even. NaN stays NaN (quiet), infinities
 * stay infinite, float16 overflows to infinity (|x| >= 65520), subnormals round correctly. */
uint16_t float_to_bfloat16(float f);
uint16_t float_to_float16(float f);
/* Exact widenings, for tests and readers. */
float bfloat16_to_float(uint16_t h);
float float16_to_float(uint16_t h);

typedef struct FillSpec {
        InitKind kind;
        double a;           /* constant: value; normal, trunc_normal: mean; uniform: low; else unused */
        double b;           /* normal, trunc_normal: std; uniform: high; else unused */
        double c;           /* trunc_normal: the lower bound a */
        double d;           /* trunc_normal: the upper bound b */
        uint64_t seed;
        uint32_t name_hash; /* fnv1a32 of the parameter name */
        Dtype dtype;
        /* trunc_normal, set by fill_spec_init4(): sampled as mean + sign * std * Phi^-1(p), p =
         * cdf_low + u * cdf_span (sign -1: the bounds mirrored into the lower tail). */
        double cdf_low, cdf_span, sign;
} FillSpec;

/* A spec from resolved numbers; name is hashed. Returns -EINVAL for an invalid kind or dtype. */
int fill_spec_init(FillSpec *ret, InitKind kind, double a, double b, uint64_t seed, const char *name,
                   Dtype dtype);
/* The same with the four numbers of an init (ResolvedInit's a, b, c, d); trunc_normal needs
 * std > 0 and a < b (-EINVAL otherwise). */
int fill_spec_init4(FillSpec *ret, InitKind kind, const double numbers[4], uint64_t seed, const char *name,
                    Dtype dtype);

/* The standard normal quantile Phi^-1(p) for p in (0, 1), in double arithmetic with fill.c's
 * own logarithm (no libm), as trunc_normal computes it: for tests. */
double fill_normal_quantile(double p);

/*
 * One element's float32 value before the dtype conversion, through the same code as the bulk
 * fill (normal: z and mean + std * z in float32 by fill.c's own polynomials; see fill.c).
 */
float fill_value(const FillSpec *spec, uint64_t i);

/*
 * normal(mean, std) of n elements from their Philox words x0[i], x1[i] (u1 from x0, u2 from x1),
 * through the very code of the bulk fill: for tests that measure it over whole grids of u1, u2.
 */
void fill_normal_from_bits(float mean, float std, const uint32_t *x0, const uint32_t *x1, size_t n,
                           float *out);

/* Dimensions of a logical shape; a larger rank is refused with -E2BIG. */
#define FILL_RANK_MAX 64

/*
 * One slice of one parameter: logical shape[rank], the slice's local_shape[rank] at
 * global_offset[rank]. dst receives the slice's elements row-major (local), dtype_size(spec->dtype)
 * bytes each, tightly packed; it needs no alignment. The arrays are borrowed.
 */
typedef struct FillSlice {
        const FillSpec *spec;
        size_t rank;
        const int64_t *shape;
        const int64_t *local_shape;
        const int64_t *global_offset;
        void *dst;
        /* dst is fresh shared memory (a segment): each chunk's pages are made present in one
         * call before it is written (common/populate.h). */
        bool populate;
} FillSlice;

/* Checks a slice: 0, or -EINVAL (bad spec, negative extent, slice outside the shape), -E2BIG
 * (rank), -EOVERFLOW (element count beyond 2^64 - 1, or bytes beyond SIZE_MAX). On success
 * *ret_n_elements (may be NULL) gets the slice's element count. */
int fill_slice_check(const FillSlice *s, uint64_t *ret_n_elements);

/* Fills one slice on the calling thread. Errors as fill_slice_check(); nothing is written then. */
int fill_slice(const FillSlice *s);

/*
 * Fills every slice, split in chunks. With a pool bound to the calling thread
 * (fill_context_bind()) and n_threads 0, the pool's threads fill while the caller waits;
 * otherwise over n_threads threads started for the call (0: all online CPUs, shared with the
 * process's other automatic fills, so concurrent Builds do not oversubscribe the cores; the
 * calling thread is one of them). The result is bit-identical for any split. All slices are
 * checked first: on an error nothing is written. Returns 0, a fill_slice_check() error,
 * -ENOMEM, or -ECANCELED when the binding's cancelled() said so (the slices then are partly
 * written: at most one chunk per thread after it said so). If a thread cannot be started the
 * others do its share.
 */
int fill_run(const FillSlice *slices, size_t n_slices, unsigned n_threads);

/*
 * A fill's progress, for a Build's watchers: fill_run() on a thread bound to one adds the bytes
 * of each chunk it writes (on whichever thread wrote it) and then calls on_chunk, if set, on
 * that thread. The bytes only grow; the reader may read them any time.
 */
typedef struct FillProgress {
        atomic_uint_fast64_t bytes;
        void (*on_chunk)(struct FillProgress *p); /* fast, thread-safe; NULL: none */
} FillProgress;

/* What the calling thread's later fill_run() calls run on and answer to (the Build path binds
 * it around a Build's fill; nothing bound: threads per call, no progress, never cancelled). */
typedef struct FillContext {
        FillPool *pool;    /* the daemon's fill threads; NULL: threads started per call */
        int group;         /* the pool group (NUMA node) that fills; -1: any thread */
        FillProgress *progress; /* NULL: none */
        /* Asked on the calling thread between chunks (per call) or every FILL_POOL_POLL_MS
         * (pool); true stops the fill: -ECANCELED. NULL: never. */
        bool (*cancelled)(void *userdata);
        void *userdata;
} FillContext;

/* Binds a copy of c (NULL: none) to the calling thread; what it points to must outlive the
 * fills. */
void fill_context_bind(const FillContext *c);

/* For work done in place of a fill (a copy of an equal fill's bytes): true when the calling
 * thread's binding says the fill is cancelled (never without one). */
bool fill_bound_cancelled(void);
/* Adds bytes to the calling thread's bound progress, if any, and calls its on_chunk. */
void fill_bound_progress_add(uint64_t bytes);

/* n consecutive elements from global index first (a rank-1 slice), on the calling thread. */
void fill_values(const FillSpec *spec, uint64_t first, size_t n, void *dst);

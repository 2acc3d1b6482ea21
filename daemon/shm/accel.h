/* accel.h: this node's devices, the backend that holds each one's shards, and GPU memory budgets. */
#pragma once

/*
 * DESIGN: made once at start from the local node's devices (the topology's, so a rank goes to
 * the device the topology assigns to it): host devices use the host backend, CUDA GPUs the
 * CUDA backend (its local device index is its CUDA ordinal). A node without GPUs, or whose
 * driver is missing, has host devices only (the inventory decided that already); a node whose
 * GPUs are listed but cannot hold shards keeps them as cuda devices, and a Build that places a
 * rank there is refused with the reason (check_device).
 *
 * Budgets: --shm-budget counts host memory only (the build table); each GPU has a budget of
 * its own, its memory less an eighth kept free for contexts and the trainers' own work,
 * counted in allocation sizes (rounded up to the granularity). A Build reserves every GPU's
 * bytes at once, all or nothing, before anything is allocated; its AccelReservation gives
 * them back when the build goes (failed, or released).
 *
 * Thread safety: everything may be called from any thread; the budgets have one mutex, the fill
 * counters are relaxed atomics (one add each per fill call). A NULL Accel (unit tests, fuzzers)
 * is a node of host devices, and counts no fills.
 */

#include <stdint.h>

#include "backend.h"
#include "core/error.h"
#include "materialize.h"
#include "core/topology.h"

/* A GPU's shard budget is its memory less memory >> ACCEL_GPU_RESERVE_SHIFT. */
#define ACCEL_GPU_RESERVE_SHIFT 3

typedef struct Accel Accel;
typedef struct AccelReservation AccelReservation;

/* devices: the local node's, indexed by local index. Logs what each GPU can do. */
int accel_new(const Device *devices, size_t n, Accel **ret);
Accel *accel_ref(Accel *a);
Accel *accel_unref(Accel *a);
DEFINE_TRIVIAL_CLEANUP_FUNC(Accel *, accel_unref);

/* "cuda" for a GPU of this node, else "host" (host devices, and indexes past the list). */
const char *accel_device_kind(const Accel *a, int32_t device);
bool accel_device_is_gpu(const Accel *a, int32_t device);
/* The bytes a shard of size bytes occupies on device. */
uint64_t accel_allocation_size(const Accel *a, int32_t device, uint64_t size);
/* 0 when device can hold shards now; FAILED_PRECONDITION with the reason otherwise. */
int accel_check_device(const Accel *a, int32_t device, FamilyError *ret_error);
/* A GPU's budget and what is reserved of it now (0 for a host device). */
uint64_t accel_budget(const Accel *a, int32_t device);
uint64_t accel_in_use(Accel *a, int32_t device);

/*
 * Reserves bytes[i] on devices[i] (GPUs; a device may repeat) against their budgets, all or
 * nothing: RESOURCE_EXHAUSTED `GPU memory budget exceeded on cuda:1: build needs N bytes, U of
 * T in use` (reason DEVICE_BUDGET). *ret is NULL when nothing was asked.
 */
int accel_reserve(Accel *a, const int32_t *devices, const uint64_t *bytes, size_t n,
                  AccelReservation **ret, FamilyError *ret_error);
AccelReservation *accel_reservation_free(AccelReservation *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(AccelReservation *, accel_reservation_free);

/* A new, zeroed segment of accel_allocation_size(size) bytes on device, by its backend. */
int accel_segment_new(Accel *a, int32_t device, const char *name, uint64_t size,
                      ShardSegment **ret, FamilyError *ret_error);

/* Fills seg (host or device, by its kind) with the rank's slices, each parameter in its own
 * dtype (the layout's); dtype is the build's default, kept for the callers. A host segment's
 * mapping is dropped afterwards. */
int accel_fill(Accel *a, ShardSegment *seg, const BuildPlan *plan, const Layout *layout,
               const RankLayout *rank, Dtype dtype, uint64_t seed, FamilyError *ret_error);
/* The same for slices made already (materialize_slices()). */
/* Copies size bytes of host memory src to offset of seg: through the daemon's mapping of a
 * host segment, with the device's copy for a GPU one. */
int accel_write(Accel *a, ShardSegment *seg, uint64_t offset, const void *src, size_t size,
                FamilyError *ret_error);
int accel_fill_slices(Accel *a, ShardSegment *seg, const MaterializeSlice *slices, size_t n,
                      FamilyError *ret_error);

/* What the fills of a did, by the kind of segment filled: index 0 host, 1 cuda. */
#define ACCEL_FILL_KIND_HOST 0u
#define ACCEL_FILL_KIND_CUDA 1u
typedef struct AccelFillCounters {
        uint64_t bytes[2]; /* a fill's bytes once it succeeded: accel_fill, the rank's size
                            * (padding included); accel_fill_slices, the slices' bytes */
        uint64_t ns[2];    /* the time successful fills took, CLOCK_MONOTONIC */
        uint64_t copied;   /* host fills that copied an equal fill under way (fill-share.h);
                            * counted in bytes and ns too */
} AccelFillCounters;
/* Any thread; relaxed reads, each number on its own. A NULL Accel counts nothing (zeros). */
void accel_fill_counters(const Accel *a, AccelFillCounters *ret);

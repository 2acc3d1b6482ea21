/* build-private.h: what the files of build/ share: placement and what is kept across restarts. */
#pragma once

#include "build.h"

/* ---- build-place.c: where ranks live, what memory they take ---------------------------- */

/* materialize.dtype, float32 by default: INVALID_ARGUMENT DTYPE otherwise. */
int build_dtype_of(const BuildPlan *plan, Dtype *ret, FamilyError *ret_error);
int build_compute_layout(BuildState *b, FamilyError *ret_error);
/* Where each rank lives, and which ranks this Build materialises here. */
int build_place_ranks(BuildState *b, const Topology *t, Accel *accel, FamilyError *ret_error);
/* Every GPU this Build materialises on can hold shards; then their bytes, all at once. */
int build_reserve_devices(BuildState *b, Accel *accel, FamilyError *ret_error);
/* Host bytes, the ones --shm-budget counts (GPU ranks count in their GPU's budget). */
uint64_t build_host_bytes(const BuildState *b);
uint64_t build_gpu_bytes(const BuildState *b);
/* RESOURCE_EXHAUSTED SHARD_LIMIT when the shard table cannot take b's tokens. */
int build_check_shard_room(const BuildState *b, ShardTable *shards, FamilyError *ret_error);

/* ---- build-keep.c: builds and meshes kept across restarts (daemon/state/) --------------- */

/* s may be NULL (nothing is kept) in all of them. */
int build_keep_reserve(State *s, const BuildState *b, FamilyError *ret_error);
void build_keep_unreserve(State *s, const BuildState *b);
/* A mapped, zeroed host segment of size bytes for rank of the build: a memfd, or a file in the
 * state dir (-ENOSPC: the state dir is full). */
int build_keep_segment_new(State *s, const char *id, int64_t rank, uint64_t size, int device,
                           ShardSegment **ret);
/* RESOURCE_EXHAUSTED STATE_DIR_FULL when the record does not fit; UNAVAILABLE FDSTORE when
 * the manager cannot be told. On failure nothing of it is kept (the segments stay the
 * caller's to discard). */
int build_keep_save(State *s, const char *id, const BuildState *b, FamilyError *ret_error);
/* Before the save: the segments' files go. */
void build_keep_discard(State *s, const char *id, const BuildState *b);
void build_keep_forget(State *s, const char *id, const BuildState *b);
/* The text of a Build that failed with -ENOSPC in the state dir. */
int build_keep_dir_full_error(State *s, uint64_t bytes, FamilyError *ret_error);

/* Keeps a mesh record (CreateMesh, or a build's mesh found without its own record). */
int mesh_keep_save(State *s, const Mesh *m, FamilyError *ret_error);
/* From now on the mesh table's new meshes are kept and its removed ones forgotten. */
void mesh_keep_install(State *s, MeshTable *meshes);

/* CLOCK_REALTIME ns: the order records keep across a restart. */
uint64_t build_keep_now_ns(void);

/* mesh.h: job meshes (named-dimension views over ranks), their checks and content-derived ids. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#include "axis.h"
#include "error.h"

typedef struct MeshDim {
        char *name;
        int64_t size;
} MeshDim;

typedef struct MeshView {
        MeshDim *dims; /* row-major, first dimension outermost */
        size_t n;
} MeshView;

/* What a client asks for; CreateMesh turns it into a Mesh. */
typedef struct MeshSpec {
        MeshView device; /* device_mesh: the dense view */
        MeshView expert; /* expert_mesh: optional second view of the same ranks */
        bool has_size[_AXIS_MAX];
        int64_t size[_AXIS_MAX]; /* declared <axis>_size */
        bool sequence_parallel;
        bool loss_parallel;
        int64_t *ranks; /* empty: every rank of the topology, in order */
        size_t n_ranks;
} MeshSpec;

void mesh_spec_done(MeshSpec *s);
int mesh_spec_copy(const MeshSpec *src, MeshSpec *ret);

typedef struct Mesh {
        atomic_uint n_ref;
        char *id;
        MeshSpec spec;             /* validated; ranks filled in */
        int64_t axis_size[_AXIS_MAX]; /* effective size of each axis (declared ones stand) */
        atomic_uint n_builds;      /* live builds laid out on this mesh */
        /* The uid of its first CreateMesh, plus one; 0: none known (a mesh restored after a
         * restart, or made by a caller that could not be told). Set once (mesh_claim()). */
        atomic_uint owner_uid_1;
} Mesh;

/* Makes uid the mesh's owner unless it has one: the first creator owns a content-derived id. */
void mesh_claim(Mesh *m, uint32_t uid);
/* Whether the mesh has an owner, and which uid. */
bool mesh_owner(const Mesh *m, uint32_t *ret_uid);

/*
 * Runs the CreateMesh checks of docs/semantics.md in order (INVALID_ARGUMENT with its exact texts),
 * fills in the default ranks (0 .. world_size-1) and derives the id from the content.
 */
int mesh_new(const MeshSpec *spec, int64_t world_size, Mesh **ret, FamilyError *ret_error);
Mesh *mesh_ref(Mesh *m);
Mesh *mesh_unref(Mesh *m);
DEFINE_TRIVIAL_CLEANUP_FUNC(Mesh *, mesh_unref);

/* The view an axis is read from: the expert view for ep when the mesh has one, else device. */
const MeshView *mesh_axis_view(const Mesh *m, Axis a);
/* Size of a named dimension in a view, or 0 if the view lacks it. */
int64_t mesh_view_dim_size(const MeshView *v, const char *name);

/* A thread-safe table of meshes by id. */
typedef struct MeshTable MeshTable;

int mesh_table_new(size_t max_meshes, MeshTable **ret);
MeshTable *mesh_table_free(MeshTable *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(MeshTable *, mesh_table_free);

/*
 * Adds m, or finds the existing mesh with the same id (same content): *ret is a new reference to
 * whichever is in the table. RESOURCE_EXHAUSTED when the table is full.
 */
int mesh_table_add(MeshTable *t, Mesh *m, Mesh **ret, FamilyError *ret_error);
/* NOT_FOUND "mesh 'ID' not found". *ret is a new reference. */
int mesh_table_get(MeshTable *t, const char *id, Mesh **ret, FamilyError *ret_error);
/* NOT_FOUND as above; FAILED_PRECONDITION "mesh 'ID' is used by N builds". */
int mesh_table_remove(MeshTable *t, const char *id, FamilyError *ret_error);
/* New references to every mesh, in creation order; free the array with mesh_list_free. */
int mesh_table_list(MeshTable *t, Mesh ***ret, size_t *ret_n);
void mesh_list_free(Mesh **list, size_t n);
size_t mesh_table_size(MeshTable *t);

/* Field-by-field equality of two specs (what the id is derived from). */
bool mesh_spec_equal(const MeshSpec *a, const MeshSpec *b);

/*
 * mesh_table_get that also counts a live build on the mesh (n_builds + 1) under the table's lock,
 * so that a concurrent mesh_table_remove either sees the build or has already removed the mesh.
 * Balance with mesh_build_release() when the build is released, before dropping the reference.
 */
int mesh_table_acquire(MeshTable *t, const char *id, Mesh **ret, FamilyError *ret_error);
void mesh_build_release(Mesh *m);

/*
 * Observers of the table's content (the state adapter keeps meshes across restarts). Both run
 * under the table's lock, so a record of a mesh is written before any other thread can see
 * or delete the mesh. added: a new mesh went in (not one found by id); a failure takes it out
 * again and is mesh_table_add()'s answer, ret_error filled. removed: a mesh left the table.
 */
typedef struct MeshTableHooks {
        int (*added)(const Mesh *m, void *userdata, FamilyError *ret_error);
        void (*removed)(const Mesh *m, void *userdata);
        void *userdata;
} MeshTableHooks;

/* hooks NULL: none. Set before the table is shared. */
void mesh_table_set_hooks(MeshTable *t, const MeshTableHooks *hooks);

/*
 * Puts back a mesh kept across a restart: no hook runs and the mesh limit does not refuse it
 * (it existed before). -EEXIST when the id is in the table. *ret (may be NULL): a new reference.
 */
int mesh_table_restore(MeshTable *t, Mesh *m, Mesh **ret);

/* Fills ret_error with NOT_FOUND "mesh 'ID' not found", what a lookup of an unknown id answers,
 * and returns -EINVAL (-ENOMEM on OOM); for callers without a table, where every id is unknown. */
int mesh_table_not_found(const char *id, FamilyError *ret_error);

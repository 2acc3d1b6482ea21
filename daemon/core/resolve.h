/* resolve.h: Resolve: which member of a family to construct for this request and this job. */
#pragma once

#include <stdint.h>

#include "axis.h"
#include "error.h"
#include "mesh.h"
#include "registry.h"
#include "value.h"

/* The trainer's job: axis sizes and flags, or a mesh made by CreateMesh. */
typedef struct JobContext {
        bool has_size[_AXIS_MAX];
        int64_t size[_AXIS_MAX];
        bool active[_AXIS_MAX];
        char *mesh_id; /* NULL or "": none */
        bool sequence_parallel;
        bool loss_parallel;
} JobContext;

void job_context_done(JobContext *c);
int job_context_copy(const JobContext *src, JobContext *ret);

typedef struct ResolveRequest {
        char *family; /* name or baseline */
        ValueMap arguments;
        JobContext context;
} ResolveRequest;

void resolve_request_done(ResolveRequest *r);

typedef struct ResolvedFamily {
        char *family; /* the family's name */
        char *variant;
        char *constructor;
        ValueMap arguments; /* the caller's, without selectors */
        ValueMap selectors; /* every selector, defaults filled, in declaration order */
        int64_t axis_size[_AXIS_MAX];
        bool flag[_JOB_FLAG_MAX]; /* the job's sequence_parallel and loss_parallel */
} ResolvedFamily;

void resolved_family_done(ResolvedFamily *r);

/*
 * Resolve, steps 1-8 of docs/semantics.md, the first failure being the answer. meshes may be NULL
 * (then any mesh id is unknown). A pure function of registry, meshes and request.
 */
int resolve_family(const Registry *reg, MeshTable *meshes, const ResolveRequest *req,
                   ResolvedFamily *ret, FamilyError *ret_error);

/* The stages, for Build to compose with its own checks in between. */

/* Step 2: unknown keys (all, sorted), then each value's type in sorted key order.
 * allow_names lists extra names accepted without a type check (Build's "config"); may be NULL. */
int resolve_check_arguments(const Family *f, const ValueMap *arguments,
                            const char *const *allow_names, FamilyError *ret_error);

/* Steps 3-5: the four axis sizes from the context, and its mesh (new reference or NULL). */
int resolve_axis_sizes(MeshTable *meshes, const JobContext *ctx, int64_t ret_size[_AXIS_MAX],
                       Mesh **ret_mesh, FamilyError *ret_error);

/* Step 4's flags: the mesh's when there is one (its word wins), else the context's. */
void resolve_job_flags(const JobContext *ctx, const Mesh *mesh, bool ret_flag[_JOB_FLAG_MAX]);

/* Steps 6-8: select by rules, check requires, fill *ret. flag may be NULL: every flag off. */
int resolve_select(const Family *f, const ValueMap *arguments, const int64_t size[_AXIS_MAX],
                   const bool flag[_JOB_FLAG_MAX], ResolvedFamily *ret, FamilyError *ret_error);

/* build-plan.h: Build steps 1-4: which member to construct, bound how, with which parameter shapes. */
#pragma once

/*
 * DESIGN: build_plan() is a pure function of registry, mesh table and request, like Resolve. It
 * allocates no shard memory and lays nothing out: the plan it returns is self-contained (strings,
 * shapes, placements and config copied; no pointer into the registry), so it outlives a reload,
 * and holds one plain reference to its mesh. The builder that turns a plan into a live build
 * counts the build on the mesh itself (mesh_table_acquire() by plan->mesh->id) when it commits.
 */

#include <stdbool.h>
#include <stdint.h>

#include "checkpoint-source.h"
#include "error.h"
#include "fill.h"
#include "mesh.h"
#include "registry.h"
#include "resolve.h"
#include "value.h"

/* A parameter of the source module in a replacement build; its shape is the logical shape. */
typedef struct SourceParameter {
        char *name;
        int64_t *shape;
        size_t n_dims;
        char *dtype; /* carried, not checked */
} SourceParameter;

typedef struct SourceModule {
        char *fqn;
        SourceParameter *parameters; /* a name given twice: the last wins */
        size_t n_parameters;
} SourceModule;

void source_module_done(SourceModule *m);

/* Carried through unchecked: dtype and ranks are checked by layout and materialisation. */
typedef struct MaterializeOptions {
        bool enabled;
        char *dtype; /* NULL or "": float32 */
        bool has_seed;
        uint64_t seed;
        int64_t *ranks;
        size_t n_ranks;
} MaterializeOptions;

void materialize_options_done(MaterializeOptions *o);
int materialize_options_copy(const MaterializeOptions *src, MaterializeOptions *ret);

/* One entry of BuildRequest.parameter_dtypes, as sent; checked at step 7. */
typedef struct ParameterDtype {
        char *name;
        char *dtype;
} ParameterDtype;

/* BuildRequest.parameter_dtypes holds at most this many entries (INVALID_ARGUMENT LIMIT). */
#define BUILD_PLAN_MAX_PARAMETER_DTYPES 4096u

void parameter_dtypes_free(ParameterDtype *d, size_t n);
int parameter_dtypes_copy(const ParameterDtype *src, size_t n, ParameterDtype **ret);

typedef struct BuildRequest {
        char *family; /* name or baseline */
        ValueMap arguments;
        bool has_config; /* presence matters: an empty config is a config */
        ValueMap config;
        bool has_module;
        SourceModule module;
        char *module_fqn; /* NULL or "": module.fqn */
        JobContext context;
        char *mesh_id; /* NULL or "": the context's mesh, if any */
        MaterializeOptions materialize;
        bool private_build; /* never shared with another Build */
        bool writable;      /* shards handed out writable, for shared mappings */
        ParameterDtype *parameter_dtypes; /* in the order sent; a name given twice: the last wins */
        size_t n_parameter_dtypes;
        bool has_source_config; /* only with a module: the source module's config */
        ValueMap source_config;
        /* BuildRequest.checkpoint: fill from a deposited checkpoint instead of the inits. */
        bool has_checkpoint;
        char *checkpoint_token;
        char *checkpoint_prefix; /* "" for none */
        bool checkpoint_by_parameter; /* CheckpointRef.names "parameters" */
} BuildRequest;

void build_request_done(BuildRequest *r);

typedef enum BuildOrigin {
        BUILD_ORIGIN_DIRECT,
        BUILD_ORIGIN_REPLACEMENT,
        _BUILD_ORIGIN_MAX,
        _BUILD_ORIGIN_INVALID = -EINVAL,
} BuildOrigin;

const char *build_origin_to_string(BuildOrigin o); /* "direct" | "replacement" */

/* An init with every number a number: config field names resolved. */
typedef struct ResolvedInit {
        InitKind kind;
        double a; /* constant: value; normal, trunc_normal: mean; uniform: low */
        double b; /* normal, trunc_normal: std; uniform: high */
        double c; /* trunc_normal: the lower bound a */
        double d; /* trunc_normal: the upper bound b */
} ResolvedInit;

/*
 * Element count bound of one parameter: count * 8 bytes still fits int64, so layout can compute
 * byte sizes of any dtype without overflow checks per parameter (sums still need them).
 */
#define BUILD_PLAN_MAX_ELEMENTS (INT64_MAX / 8)

typedef struct PlanParameter {
        char *name;
        int64_t *shape; /* logical shape, every dimension >= 1; NULL when n_dims is 0 */
        size_t n_dims;
        int64_t n_elements; /* 1 for a scalar; <= BUILD_PLAN_MAX_ELEMENTS */
        Placement *placements; /* copied from the registry */
        size_t n_placements;
        ResolvedInit init;
        /* false only in a replacement build whose init names a config field that neither the
         * source's shapes bind nor source_config gives: init is then zeros (the trainer copies
         * the source's values). */
        bool init_resolved;
        char *init_text; /* the declared init, canonical text ("normal(mean=0, std=initializer_range)") */
        char *dtype;     /* the registry's dtype for it, canonical; NULL: none */
        bool has_checkpoint;         /* the registry names its checkpoint tensors */
        CheckpointSource checkpoint; /* a copy of the registry's */
} PlanParameter;

typedef struct BuildPlan {
        ResolveRequest request; /* the original request; context.mesh_id: the mesh used, if any */
        ResolvedFamily resolved;
        BuildOrigin origin;
        char *module_fqn; /* never NULL; "" when neither given */
        Mesh *mesh;       /* a reference, or NULL without a mesh */
        PlanParameter *parameters; /* declared order */
        size_t n_parameters;
        bool reset_after_materialization; /* a direct build with at least one parameter */
        bool has_config;
        ValueMap config; /* snapshot (direct); empty for replacement */
        ValueMap bound_fields; /* replacement: config fields bound by the source's shapes (ints), in binding order */
        /* Replacement: the source_config fields that init numbers took (none bound by the shapes),
         * first use first. With bound_fields (the layout's shapes) and the registry they decide
         * every init: the sharing key holds them. */
        ValueMap init_fields;
        MaterializeOptions materialize;
        ParameterDtype *parameter_dtypes; /* the request's; build_plan_check_dtypes() checks them */
        size_t n_parameter_dtypes;
        bool has_activations;         /* the family declares a `layout` */
        ActivationLayout activations; /* a copy of it: the Build reply's Layout.activations */
} BuildPlan;

void build_plan_done(BuildPlan *p);

/*
 * Build, steps 1-4 of docs/semantics.md, the first failure being the answer (ret_error filled,
 * -EINVAL; *ret untouched). meshes may be NULL (then any mesh id is unknown). Other negative
 * errnos (-ENOMEM) leave ret_error as it was.
 */
int build_plan(const Registry *reg, MeshTable *meshes, const BuildRequest *req, BuildPlan *ret,
               FamilyError *ret_error);

/*
 * Build step 7, for BuildRequest.parameter_dtypes (materialize.dtype is the builder's): each
 * entry, in the byte order of the names (a map has no order on the wire), must name a parameter
 * of the plan (else INVALID_ARGUMENT DTYPE) with a supported dtype (dtype_from_string(), not
 * empty; else INVALID_ARGUMENT DTYPE), field "parameter_dtypes". -EINVAL with ret_error
 * filled, or -ENOMEM.
 */
int build_plan_check_dtypes(const BuildPlan *plan, FamilyError *ret_error);

/*
 * The dtype of parameter i of a checked plan. Precedence: the last parameter_dtypes entry of its
 * name, then the registry's dtype, then build_dtype (materialize.dtype, float32 by default).
 */
Dtype build_plan_parameter_dtype(const BuildPlan *plan, size_t i, Dtype build_dtype);

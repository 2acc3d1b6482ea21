/* validate.h: Validate: a trainer's model (its family boundaries) checked against the job. */
#pragma once

#include <stdint.h>

#include "axis.h"
#include "error.h"
#include "registry.h"

/* A parameter as a layout states it: logical shape, placements and its own dtype. */
typedef struct ValidateParameter {
        char *name;
        int64_t *shape;
        size_t n_dims;
        Placement *placements;
        size_t n_placements;
        char *dtype; /* a dtype name or alias; NULL or "": not stated, not compared */
} ValidateParameter;

typedef struct AppliedLayout {
        char *mesh_id; /* NULL or "": none named */
        ValidateParameter *parameters;
        size_t n_parameters;
        bool has_activations;         /* the model states its activation layout */
        ActivationLayout activations; /* borrowed; compared with the build's */
} AppliedLayout;

/* One built family instance inside the model, with every path that reaches it. */
typedef struct ModelBoundary {
        char **fqns;
        size_t n_fqns;
        char *build_id;
        bool has_layout;
        AppliedLayout layout;
} ModelBoundary;


/* What Validate needs of a build, looked up by id; borrowed for the duration of the call. */
typedef struct BuiltFamily {
        const char *mesh_id;                /* NULL: not laid out on a mesh */
        const int64_t *mesh_axis_size;      /* the build's mesh's sizes (with a mesh) */
        const int64_t *axis_size;           /* the sizes it was resolved with */
        const ValidateParameter *parameters; /* logical shapes, normalised placements */
        size_t n_parameters;
        bool sorted; /* parameters in strcmp() order of their names: found by bisection */
        const ActivationLayout *activations; /* the family's declared one; NULL: none (empty) */
} BuiltFamily;

/* 0 and *ret when the build exists, 1 when it does not (unknown or released). */
typedef int (*ValidateLookup)(const char *build_id, BuiltFamily *ret, void *userdata);

/* The job: its sizes (Resolve 3-5 of the context) and the mesh it names, if any. */
typedef struct ValidateJob {
        const char *mesh_id; /* NULL or "" */
        bool has_size[_AXIS_MAX];
        int64_t context_size[_AXIS_MAX]; /* sizes the context itself gives */
        int64_t size[_AXIS_MAX];         /* effective: the mesh's, else the context's, else 1 */
} ValidateJob;

/* One use of a parameter the model ties across builds: where it is and which build holds it. */
typedef struct SharedParameterUse {
        char *fqn;       /* its full path in the model */
        char *build_id;  /* the build of the boundary that holds it */
        char *parameter; /* its name in that build's layout */
} SharedParameterUse;

/* One tensor of the model used by several builds' parameters; borrowed strings. */
typedef struct SharedParameter {
        SharedParameterUse *uses;
        size_t n_uses;
} SharedParameter;

/*
 * The request's shared parameters well formed (docs/semantics.md, Validate): at most
 * FAMILYD_MAX_SHARED_PARAMETERS, each with 2 to FAMILYD_MAX_SHARED_PARAMETER_USES uses, each use
 * with a fqn (<= 1,024 bytes), a build_id and a parameter (<= 256 bytes each). The first problem
 * in request order, as INVALID_ARGUMENT in *ret_error.
 */
int validate_shared_check(const SharedParameter *shared, size_t n, FamilyError *ret_error);

typedef struct Violation {
        char **fqns;
        size_t n_fqns;
        const char *reason; /* static: UNKNOWN_BUILD, MESH_MISMATCH, ... */
        char *message;
} Violation;

typedef struct ViolationList {
        Violation *items;
        size_t n;
        size_t allocated;
} ViolationList;

void violation_list_done(ViolationList *l);

/*
 * Every violation of docs/semantics.md's Validate, in the order of the boundaries and, within one,
 * unknown build, mesh problems, cp, ep, shared shapes, layout, activation layout fields; then those of the shared
 * parameters (already checked by validate_shared_check()), in their order. Negative errno only
 * for OOM.
 */
int validate_model(const ModelBoundary *boundaries, size_t n, const SharedParameter *shared,
                   size_t n_shared, const ValidateJob *job, ValidateLookup lookup, void *userdata,
                   ViolationList *ret);

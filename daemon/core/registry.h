/* registry.h: the family registry, an immutable reference-counted snapshot of the YAML files. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#include "activation-layout.h"
#include "axis.h"
#include "checkpoint-source.h"
#include "error.h"
#include "expr.h"
#include "init-expr.h"
#include "value.h"

typedef struct TypedField {
        char *name;
        FieldType type;
        Value default_value; /* VALUE_NONE when absent (arguments only) */
} TypedField;

typedef struct RuleCondition {
        char *key; /* a selector name, "parallel", or a job flag's name */
        Value value;
} RuleCondition;

typedef enum RuleOutcome {
        RULE_OUTCOME_VARIANT,
        RULE_OUTCOME_ERROR,
        RULE_OUTCOME_UNSUPPORTED,
        _RULE_OUTCOME_MAX,
        _RULE_OUTCOME_INVALID = -EINVAL,
} RuleOutcome;

typedef struct Rule {
        RuleCondition *when;
        size_t n_when;
        RuleOutcome outcome;
        char *text; /* variant name, or the error/unsupported message */
} Rule;

/* The job's switches that are not axes: Resolve's rules and requires may name them. */
typedef enum JobFlag {
        JOB_FLAG_SEQUENCE_PARALLEL,
        JOB_FLAG_LOSS_PARALLEL,
        _JOB_FLAG_MAX,
        _JOB_FLAG_INVALID = -EINVAL,
} JobFlag;

const char *job_flag_to_string(JobFlag f); /* "sequence_parallel" | "loss_parallel" */
JobFlag job_flag_from_string(const char *s);

typedef struct Requirement {
        Axis axis;
        bool is_list; /* `ep: [1, 2]` rather than `tp: 1` */
        int64_t *values;
        size_t n_values;
} Requirement;

typedef enum PlacementKind {
        PLACEMENT_SHARD,
        PLACEMENT_REPLICATE,
        _PLACEMENT_KIND_MAX,
        _PLACEMENT_KIND_INVALID = -EINVAL,
} PlacementKind;

typedef struct Placement {
        char *axis; /* a mesh dimension name */
        PlacementKind kind;
        int64_t dim; /* shard only; -rank <= dim < rank */
} Placement;

/*
 * One case of a placement that depends on the job (registry.md, "Placements that depend on the
 * job"): the first case whose condition holds decides the axis's placement at Build.
 */
typedef struct PlacementCase {
        Expr *when;         /* a condition over the job (placement-case.h); NULL: always */
        bool none;          /* the axis is not placed */
        PlacementKind kind; /* unless none */
        int64_t dim;        /* shard only; -rank <= dim < rank */
} PlacementCase;

typedef struct PlacementCases {
        PlacementCase *items;
        size_t n; /* 0: the placement is static, as Placement says */
} PlacementCases;

typedef enum InitKind {
        INIT_ZEROS,
        INIT_ONES,
        INIT_CONSTANT,
        INIT_NORMAL,
        INIT_UNIFORM,
        INIT_TRUNC_NORMAL,
        INIT_MODULE, /* the constructed module's own init, run by a client (docs/registry.md) */
        _INIT_KIND_MAX,
        _INIT_KIND_INVALID = -EINVAL,
} InitKind;

/* A number in an init: a literal, the name of a config field that supplies it, or a float
 * expression (init-expr.h) evaluated at Build. At most one of field and expr is set. */
typedef struct InitNumber {
        char *field;   /* NULL: use value (or expr) */
        InitExpr *expr; /* NULL: field or value */
        double value;
} InitNumber;

typedef struct InitSpec {
        InitKind kind;
        InitNumber a; /* constant: value; normal, trunc_normal: mean; uniform: low */
        InitNumber b; /* normal, trunc_normal: std; uniform: high */
        InitNumber c; /* trunc_normal: the lower bound a */
        InitNumber d; /* trunc_normal: the upper bound b */
} InitSpec;

typedef struct ParameterSpec {
        char *name;
        Expr **shape;
        size_t n_dims;
        Placement *placements; /* one with cases: replicate, dim 0, until Build decides */
        size_t n_placements;
        PlacementCases *placement_cases; /* NULL, or one per placement */
        InitSpec init;
        char *init_text; /* canonical text: "zeros", "constant(value=1)", "normal(mean=0, std=x)" */
        char *dtype;     /* its element type, canonical ("float32"); NULL: none named */
        bool has_checkpoint;
        CheckpointSource checkpoint; /* the tensors its values come from (checkpoint-source.h) */
} ParameterSpec;

typedef struct Variant {
        char *name;
        char *constructor;
        char **accepts;
        size_t n_accepts;
        Requirement *requires; /* axes in tp, cp, ep, pp order */
        size_t n_requires;
        bool requires_flag[_JOB_FLAG_MAX];   /* the flag is constrained... */
        bool required_value[_JOB_FLAG_MAX];  /* ...to this value */
        bool has_parameters; /* the variant's own parameters replace the family's */
        ParameterSpec *parameters;
        size_t n_parameters;
} Variant;

typedef struct Family {
        char *name;
        char *baseline;
        char *default_variant; /* NULL: the family cannot be requested */
        Axis parallel_axis;    /* _AXIS_INVALID: none */
        TypedField *selectors;
        size_t n_selectors;
        TypedField *arguments;
        size_t n_arguments;
        Variant *variants; /* in file order */
        size_t n_variants;
        Rule *rules;
        size_t n_rules;
        ParameterSpec *parameters;
        size_t n_parameters;
        bool has_layout;         /* the family declares `layout` */
        ActivationLayout layout; /* its inputs' and outputs' placements (registry.md) */
        char *source; /* "file:line" */
} Family;

typedef struct Registry {
        atomic_uint n_ref;
        char *path;
        uint64_t generation;
        Family *families; /* load order: files by name, then order within a file */
        size_t n_families;
} Registry;

/* Load diagnostics: one "file:line:column: text" per problem. */
typedef struct LoadDiagnostics {
        char **lines;
        size_t n;
        size_t allocated;
} LoadDiagnostics;

void load_diagnostics_done(LoadDiagnostics *d);
int load_diagnostics_add(LoadDiagnostics *d, const char *file, unsigned line, unsigned column,
                         const char *format, ...) _printf_(5, 6);
/* All lines joined with '\n'; NULL on OOM. */
char *load_diagnostics_join(const LoadDiagnostics *d);

/*
 * Loads every *.yaml and *.yml file of dir (byte order of names). On any violation returns
 * -EINVAL with every problem found in *ret_diag (nothing else is kept); other failures are a
 * negative errno with a diagnostic line too (e.g. the directory cannot be read).
 */
int registry_load(const char *dir, uint64_t generation, Registry **ret, LoadDiagnostics *ret_diag);

Registry *registry_ref(Registry *r);
Registry *registry_unref(Registry *r);
DEFINE_TRIVIAL_CLEANUP_FUNC(Registry *, registry_unref);

/* Resolve step 1 target lookup, by name or baseline, with its exact errors. */
int registry_find(const Registry *r, const char *target, const Family **ret, FamilyError *ret_error);
/* Fills ret_error with registry_find's INVALID_ARGUMENT "NO_DEFAULT_VARIANT" and returns -EINVAL
 * (-ENOMEM on OOM); for callers that pick the default variant of a family they already hold. */
int registry_no_default_variant(FamilyError *ret_error);

/*
 * Added for GetFamily and ListFamilies-style callers: registry_find without the default_variant
 * check (a family without one can still be shown, it just cannot be requested). Same errors
 * otherwise: NOT_FOUND "UNKNOWN_FAMILY", INVALID_ARGUMENT "AMBIGUOUS_FAMILY".
 */
int registry_lookup(const Registry *r, const char *target, const Family **ret, FamilyError *ret_error);

/*
 * Takes ownership of families (n_families entries, from malloc) on success only; n_ref is 1.
 * For loaders and tests that build a registry in memory.
 */
int registry_new(const char *path, uint64_t generation, Family *families, size_t n_families,
                 Registry **ret);

/* Release what a Family or ParameterSpec owns (all of it) and reset it; accept NULL. */
void family_done(Family *f);
void parameter_spec_done(ParameterSpec *p);
void init_number_done(InitNumber *x);
void init_spec_done(InitSpec *s);

const Variant *family_find_variant(const Family *f, const char *name);
const TypedField *family_find_selector(const Family *f, const char *name);
const TypedField *family_find_argument(const Family *f, const char *name);
/* The variant's parameters if it has its own, else the family's. */
void variant_parameters(const Family *f, const Variant *v, const ParameterSpec **ret, size_t *ret_n);

const char *placement_kind_to_string(PlacementKind k); /* "shard" | "replicate" */
const char *init_kind_to_string(InitKind k);

/* Names reserved for runtime arguments: config, module, module_fqn, context. */
bool is_reserved_runtime_name(const char *name);

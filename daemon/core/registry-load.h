/* registry-load.h: registry_load's internals shared by its files; not installed, core only. */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"
#include "registry.h"
#include "registry-yaml.h"

#define LOAD_MAX_DIAGNOSTICS    1000u    /* past this the operator has seen enough */

typedef struct Loader {
        const char *file; /* the file's entry name, for diagnostics */
        LoadDiagnostics *diag;
        bool truncated;   /* LOAD_MAX_DIAGNOSTICS reached */
} Loader;

/* ---- diagnostics (registry-schema.c) ---- */

int loader_diag_at(Loader *l, unsigned line, unsigned column, const char *ctx,
                   const char *format, ...) _printf_(5, 6);

#define loader_diag(l, node, ctx, ...) \
        loader_diag_at((l), (node)->line, (node)->column, (ctx), __VA_ARGS__)

/* The YNodeDiagFunc for ynode_parse(): the tree builder's problems have no schema context. */
int loader_yaml_diag(void *userdata, unsigned line, unsigned column, const char *format,
                     va_list ap) _printf_(4, 0);

/* The same, with one user-supplied string quoted Python-style into the single %s of format. */
int loader_diag_q(Loader *l, const YNode *n, const char *ctx, const char *format,
                  const char *s);

/* Folds a child's result into *acc: -EINVAL (diagnosed) is remembered and walking continues;
 * any other failure (-ENOMEM) is returned to abort the load. */
int loader_fold(int *acc, int r);

/* ---- scalars (registry-schema.c) ---- */

/* Resolves n (any node) to a Value; collections come back as VALUE_LIST with no items, which
 * matches no scalar type. Diagnoses bad numbers. */
int loader_node_value(Loader *l, const YNode *n, const char *ctx, const char *what, Value *ret);

int loader_string(Loader *l, const YNode *n, const char *ctx, const char *what,
                size_t max_len, char **ret);
bool loader_is_identifier(const char *s);
int loader_name(Loader *l, const YNode *n, const char *ctx, const char *what, char **ret);
int loader_dotted_path(Loader *l, const YNode *n, const char *ctx, const char *what, char **ret);

/* A value of a declared type; an int where float is declared becomes a float. */
int loader_typed(Loader *l, const YNode *n, const char *ctx, const char *what, FieldType t,
               Value *ret);

int loader_int(Loader *l, const YNode *n, const char *ctx, const char *what, int64_t *ret);

/* ---- mappings (registry-schema.c) ---- */

int loader_expect_kind(Loader *l, const YNode *n, const char *ctx, const char *what, YNodeKind kind);

/*
 * Matches a mapping's keys against a fixed set: values[i] gets the value of keys[i] (first
 * occurrence); unknown and repeated keys are diagnosed.
 */
int loader_map_fixed(Loader *l, const YNode *m, const char *ctx, const char *const *keys,
              const YNode **values, size_t n_keys);

int loader_missing_key(Loader *l, const YNode *m, const char *ctx, const char *key);

typedef struct Entry {
        const char *key;
        const YNode *key_node;
        const YNode *value;
        size_t index;
} Entry;

/*
 * The entries of a mapping of free names (selectors, variants, ...), in file order, without
 * repeated or non-scalar keys (diagnosed) and with non-empty, bounded names. Duplicates are
 * found by sorting, so a large mapping costs n log n, never n^2.
 */
int loader_map_entries(Loader *l, const YNode *m, const char *ctx, const char *what, size_t max,
                Entry **ret, size_t *ret_n);

char *loader_ctx_push(const char *ctx, const char *kind, const char *name);

/* ---- the schema walk (registry-family.c, registry-parameter.c) ---- */

/* Fills *f (zeroed by the caller, parallel_axis _AXIS_INVALID) from one family mapping. */
int loader_family(Loader *l, const YNode *n, Family *f, unsigned *ret_baseline_line,
                unsigned *ret_baseline_column);

/* A family's `layout` (registry-activation.c): its activations' placements, out_names, boundary. */
int loader_activation_layout(Loader *l, const YNode *n, const char *ctx, ActivationLayout *ret);
/* A case's condition over the job (`when:`, placement-case.h): parsed into *ret, each field it
 * names checked to be the job's (axis sizes, sequence_parallel, loss_parallel), diagnosed. */
int loader_job_condition(Loader *l, const YNode *n, const char *ctx, const char *what,
                         Expr **ret);

/* "shard(d)" (blanks inside the parentheses) or "replicate"; -EINVAL otherwise. */
int registry_parse_placement(const char *s, PlacementKind *ret_kind, int64_t *ret_dim);

int loader_parameters(Loader *l, const YNode *n, const char *ctx, ParameterSpec **ret,
                    size_t *ret_n);

/* A parameter's `checkpoint` (registry-checkpoint.c); rank: its shape's, or -1 when the shape
 * did not load (dimensions are then not range-checked). */
int loader_checkpoint(Loader *l, const YNode *n, const char *ctx, int64_t rank,
                      CheckpointSource *ret);

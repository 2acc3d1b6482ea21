/* activation-layout.h: a family's activation layout: how its inputs and outputs are placed. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"
#include "expr.h"

/* The four placement lists, in the order Validate compares them, then out_names, is_boundary. */
typedef enum ActivationField {
        ACTIVATION_IN_SRC,
        ACTIVATION_IN_DST,
        ACTIVATION_OUT_SRC,
        ACTIVATION_OUT_DST,
        ACTIVATION_OUT_NAMES,
        ACTIVATION_IS_BOUNDARY,
        _ACTIVATION_FIELD_MAX,
        _ACTIVATION_PLACEMENT_FIELDS = ACTIVATION_OUT_NAMES,
} ActivationField;

/* "in_src", "in_dst", "out_src", "out_dst", "out_names", "is_boundary". */
const char *activation_field_to_string(ActivationField f);

/*
 * One case of an activation placement that depends on the job (registry.md, "Activation
 * layouts"): the first case whose condition holds decides the axis's placement at Build.
 */
typedef struct ActivationCase {
        Expr *when; /* a condition over the job (placement-case.h); NULL: always */
        char *kind; /* "shard" (dim), "replicate", "partial"; NULL: none, the axis is not placed */
        int64_t dim;
} ActivationCase;

/*
 * One mesh dimension's placement of one activation: kind "shard" (dim), "replicate", "partial";
 * in a registry family's layout also "cases" (dim 0): decided at Build by its cases.
 */
typedef struct ActivationPlacement {
        char *axis;
        char *kind;
        int64_t dim;           /* shard only, as declared; 0 otherwise */
        ActivationCase *cases; /* kind "cases" only, n_cases of them */
        size_t n_cases;
} ActivationPlacement;

/* One input's or output's placements over the mesh dimensions, unique axes. */
typedef struct Activation {
        ActivationPlacement *placements;
        size_t n_placements;
} Activation;

typedef struct ActivationLayout {
        Activation *lists[_ACTIVATION_PLACEMENT_FIELDS]; /* in_src, in_dst, out_src, out_dst */
        size_t n_lists[_ACTIVATION_PLACEMENT_FIELDS];
        char **out_names;
        size_t n_out_names;
        bool is_boundary;
} ActivationLayout;

/* Frees what the layout owns (one made by the registry loader or activation_layout_copy()). */
void activation_layout_done(ActivationLayout *l);
/* A copy without the cases: a placement of kind "cases" is copied as that kind, dim 0. */
int activation_layout_copy(const ActivationLayout *src, ActivationLayout *ret);

/* Whether some placement of the layout depends on the job (has cases). */
bool activation_layout_has_cases(const ActivationLayout *l);

/*
 * Whether field f is the same in both: for a placement list, as many activations, each with the
 * same placements (axis, kind, and dim for shard), in any axis order; out_names in order.
 */
bool activation_layout_field_equal(const ActivationLayout *a, const ActivationLayout *b, ActivationField f);

/*
 * Whether a neighbour's out_dst (a) and the next one's in_src (b) agree over the mesh dimensions
 * both name: -1 when no dimension is named by both (neighbours over different dimensions are
 * not compared); else 1 when, position by position as far as both lists go, each two
 * activations place every such dimension alike (both leave it out, or the same kind, and dim for
 * shard), 0 otherwise.
 */
int activation_lists_agree(const Activation *a, size_t n_a, const Activation *b, size_t n_b);

/* "[{cp: shard(-2), tp: replicate}, {}]": a list of activations, each's axes in byte order. */
char *activation_list_to_string(const Activation *list, size_t n);

/* activation-layout.h: a family's activation layout: how its inputs and outputs are placed. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

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

/* One mesh dimension's placement of one activation: kind "shard" (dim), "replicate", "partial". */
typedef struct ActivationPlacement {
        char *axis;
        char *kind;
        int64_t dim; /* shard only, as declared; 0 otherwise */
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
int activation_layout_copy(const ActivationLayout *src, ActivationLayout *ret);

/*
 * Whether field f is the same in both: for a placement list, as many activations, each with the
 * same placements (axis, kind, and dim for shard), in any axis order; out_names in order.
 */
bool activation_layout_field_equal(const ActivationLayout *a, const ActivationLayout *b, ActivationField f);

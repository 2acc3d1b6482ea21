/* activation-layout.c: a family's activation layout: its lifetime and Validate's comparison. */
#include "activation-layout.h"

static const char *const field_table[_ACTIVATION_FIELD_MAX] = {
        [ACTIVATION_IN_SRC] = "in_src",
        [ACTIVATION_IN_DST] = "in_dst",
        [ACTIVATION_OUT_SRC] = "out_src",
        [ACTIVATION_OUT_DST] = "out_dst",
        [ACTIVATION_OUT_NAMES] = "out_names",
        [ACTIVATION_IS_BOUNDARY] = "is_boundary",
};

const char *activation_field_to_string(ActivationField f) {
        if (f < 0 || f >= _ACTIVATION_FIELD_MAX)
                return NULL;
        return field_table[f];
}

static void activation_done(Activation *a) {
        for (size_t i = 0; i < a->n_placements; i++) {
                free(a->placements[i].axis);
                free(a->placements[i].kind);
        }
        free(a->placements);
        *a = (Activation) {};
}

void activation_layout_done(ActivationLayout *l) {
        if (!l)
                return;
        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++) {
                for (size_t i = 0; i < l->n_lists[f]; i++)
                        activation_done(&l->lists[f][i]);
                free(l->lists[f]);
        }
        for (size_t i = 0; i < l->n_out_names; i++)
                free(l->out_names[i]);
        free(l->out_names);
        *l = (ActivationLayout) {};
}

static int activation_copy(const Activation *src, Activation *ret) {
        ret->placements = calloc(src->n_placements + 1, sizeof(ActivationPlacement));
        if (!ret->placements)
                return -ENOMEM;
        for (size_t i = 0; i < src->n_placements; i++) {
                ActivationPlacement *p = &ret->placements[i];

                p->axis = strdup(strempty(src->placements[i].axis));
                p->kind = strdup(strempty(src->placements[i].kind));
                ret->n_placements++;
                if (!p->axis || !p->kind)
                        return -ENOMEM;
                p->dim = src->placements[i].dim;
        }
        return 0;
}

int activation_layout_copy(const ActivationLayout *src, ActivationLayout *ret) {
        _cleanup_(activation_layout_done) ActivationLayout l = {};
        int r;

        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++) {
                l.lists[f] = calloc(src->n_lists[f] + 1, sizeof(Activation));
                if (!l.lists[f])
                        return -ENOMEM;
                for (size_t i = 0; i < src->n_lists[f]; i++) {
                        l.n_lists[f]++;
                        r = activation_copy(&src->lists[f][i], &l.lists[f][i]);
                        if (r < 0)
                                return r;
                }
        }
        l.out_names = calloc(src->n_out_names + 1, sizeof(char *));
        if (!l.out_names)
                return -ENOMEM;
        for (size_t i = 0; i < src->n_out_names; i++) {
                l.out_names[i] = strdup(strempty(src->out_names[i]));
                if (!l.out_names[i])
                        return -ENOMEM;
                l.n_out_names++;
        }
        l.is_boundary = src->is_boundary;
        *ret = l;
        l = (ActivationLayout) {};
        return 0;
}

static const ActivationPlacement *find_axis(const Activation *a, const char *axis) {
        for (size_t i = 0; i < a->n_placements; i++)
                if (streq(strempty(a->placements[i].axis), strempty(axis)))
                        return &a->placements[i];
        return NULL;
}

static bool activation_equal(const Activation *a, const Activation *b) {
        if (a->n_placements != b->n_placements)
                return false;
        for (size_t i = 0; i < a->n_placements; i++) {
                const ActivationPlacement *x = &a->placements[i], *y = find_axis(b, x->axis);

                if (!y || !streq(strempty(x->kind), strempty(y->kind)) ||
                    (streq(strempty(x->kind), "shard") && x->dim != y->dim))
                        return false;
        }
        return true;
}

bool activation_layout_field_equal(const ActivationLayout *a, const ActivationLayout *b, ActivationField f) {
        switch (f) {
        case ACTIVATION_OUT_NAMES:
                if (a->n_out_names != b->n_out_names)
                        return false;
                for (size_t i = 0; i < a->n_out_names; i++)
                        if (!streq(strempty(a->out_names[i]), strempty(b->out_names[i])))
                                return false;
                return true;
        case ACTIVATION_IS_BOUNDARY:
                return a->is_boundary == b->is_boundary;
        default:
                if (f < 0 || f >= _ACTIVATION_PLACEMENT_FIELDS || a->n_lists[f] != b->n_lists[f])
                        return false;
                for (size_t i = 0; i < a->n_lists[f]; i++)
                        if (!activation_equal(&a->lists[f][i], &b->lists[f][i]))
                                return false;
                return true;
        }
}

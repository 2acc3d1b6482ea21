/* activation-layout.c: a family's activation layout: its lifetime and Validate's comparison. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                ActivationPlacement *p = &a->placements[i];

                free(p->axis);
                free(p->kind);
                for (size_t k = 0; k < p->n_cases; k++) {
                        expr_free(p->cases[k].when);
                        free(p->cases[k].kind);
                }
                free(p->cases);
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

bool activation_layout_has_cases(const ActivationLayout *l) {
        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++)
                for (size_t i = 0; i < l->n_lists[f]; i++)
                        for (size_t j = 0; j < l->lists[f][i].n_placements; j++)
                                if (l->lists[f][i].placements[j].n_cases > 0)
                                        return true;
        return false;
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

static bool activations_name(const Activation *list, size_t n, const char *axis) {
        for (size_t i = 0; i < n; i++)
                if (find_axis(&list[i], axis))
                        return true;
        return false;
}

/* Whether activation a and b place every axis of `common` (a list's axes named by the other
 * list too) alike: both leave it out, or both place it the same way. */
static bool activation_agrees_over(const Activation *a, const Activation *b, const Activation *other_list,
                                   size_t n_other) {
        for (size_t i = 0; i < a->n_placements; i++) {
                const ActivationPlacement *x = &a->placements[i], *y;

                if (!activations_name(other_list, n_other, x->axis))
                        continue;
                y = find_axis(b, x->axis);
                if (!y || !streq(strempty(x->kind), strempty(y->kind)) ||
                    (streq(strempty(x->kind), "shard") && x->dim != y->dim))
                        return false;
        }
        return true;
}

int activation_lists_agree(const Activation *a, size_t n_a, const Activation *b, size_t n_b) {
        bool common = false;

        for (size_t i = 0; i < n_a && !common; i++)
                for (size_t j = 0; j < a[i].n_placements && !common; j++)
                        common = activations_name(b, n_b, a[i].placements[j].axis);
        if (!common)
                return -1;
        /* Position by position as far as both go (the first's outputs feed the next one's first
         * inputs; its other inputs come from elsewhere), over the axes both lists name: each of
         * a's placed there is b's, and the other way. */
        for (size_t i = 0; i < MIN(n_a, n_b); i++)
                if (!activation_agrees_over(&a[i], &b[i], b, n_b) ||
                    !activation_agrees_over(&b[i], &a[i], a, n_a))
                        return 0;
        return 1;
}

static int placement_axis_cmp(const void *x, const void *y) {
        const ActivationPlacement *const *a = x, *const *b = y;
        return strcmp(strempty((*a)->axis), strempty((*b)->axis));
}

char *activation_list_to_string(const Activation *list, size_t n) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        FILE *f;

        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        fputc('[', f);
        for (size_t i = 0; i < n; i++) {
                _cleanup_free_ const ActivationPlacement **sorted =
                        calloc(list[i].n_placements + 1, sizeof(ActivationPlacement *));

                if (!sorted) {
                        fclose(f);
                        return NULL;
                }
                for (size_t j = 0; j < list[i].n_placements; j++)
                        sorted[j] = &list[i].placements[j];
                qsort(sorted, list[i].n_placements, sizeof(*sorted), placement_axis_cmp);
                fputs(i ? ", {" : "{", f);
                for (size_t j = 0; j < list[i].n_placements; j++) {
                        const ActivationPlacement *p = sorted[j];

                        fprintf(f, "%s%s: ", j ? ", " : "", strempty(p->axis));
                        if (streq(strempty(p->kind), "shard"))
                                fprintf(f, "shard(%" PRId64 ")", p->dim);
                        else
                                fputs(strempty(p->kind), f);
                }
                fputc('}', f);
        }
        fputc(']', f);
        if (fclose(f) != 0)
                return NULL;
        return TAKE_PTR(buf);
}

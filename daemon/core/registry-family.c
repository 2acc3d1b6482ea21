/* registry-family.c: one family mapping to a Family: selectors, arguments, variants, rules. */

#include <stdio.h>

#include "resource-limits.h"
#include "registry-load.h"

static const char *const family_keys[] = {
        "name", "baseline", "default_variant", "parallel_axis", "selectors", "arguments",
        "variants", "rules", "parameters", "layout",
};
enum {
        FK_NAME, FK_BASELINE, FK_DEFAULT_VARIANT, FK_PARALLEL_AXIS, FK_SELECTORS, FK_ARGUMENTS,
        FK_VARIANTS, FK_RULES, FK_PARAMETERS, FK_LAYOUT, _FK_MAX,
};

static int load_typed_fields(Loader *l, const Family *f, const YNode *n, const char *ctx,
                             bool selectors, TypedField **ret, size_t *ret_n) {
        static const char *const keys[] = { "type", "default" };
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc = 0, r;

        r = loader_map_entries(l, n, ctx, selectors ? "'selectors'" : "'arguments'", FAMILYD_MAX_ARGUMENTS,
                        &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        *ret = calloc(n_e ? n_e : 1, sizeof(TypedField));
        if (!*ret)
                return -ENOMEM;

        for (size_t i = 0; i < n_e; i++) {
                const YNode *values[ELEMENTSOF(keys)] = {};
                _cleanup_free_ char *fctx = NULL;
                TypedField *t = &(*ret)[(*ret_n)++];

                *t = (TypedField) { .type = _FIELD_TYPE_INVALID };
                t->name = strdup(e[i].key);
                fctx = loader_ctx_push(ctx, selectors ? "selector" : "argument", e[i].key);
                if (!t->name || !fctx)
                        return -ENOMEM;

                if (selectors && (streq(e[i].key, "parallel") || job_flag_from_string(e[i].key) >= 0))
                        /* Rules read these names as the job's: a selector could never be matched. */
                        r = loader_diag_q(l, e[i].key_node, ctx, "selector name %s is reserved", e[i].key);
                else if (is_reserved_runtime_name(e[i].key))
                        /* Resolve treats a reserved runtime name as an unknown argument, so a
                         * selector by that name could never be given. */
                        r = loader_diag_q(l, e[i].key_node, ctx,
                                          selectors ? "selector name %s is reserved"
                                                    : "argument name %s is reserved",
                                          e[i].key);
                else if (!selectors && family_find_selector(f, e[i].key))
                        r = loader_diag_q(l, e[i].key_node, ctx,
                                          "%s is both a selector and an argument", e[i].key);
                else
                        r = 0;
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;

                r = loader_expect_kind(l, e[i].value, fctx, "the declaration", YNODE_MAPPING);
                if (r == -EINVAL) {
                        acc = r;
                        continue;
                }
                if (r < 0)
                        return r;
                r = loader_fold(&acc, loader_map_fixed(l, e[i].value, fctx, keys, values, ELEMENTSOF(keys)));
                if (r < 0)
                        return r;

                if (!values[0]) {
                        r = loader_fold(&acc, loader_missing_key(l, e[i].value, fctx, "type"));
                        if (r < 0)
                                return r;
                        continue;
                }
                _cleanup_free_ char *type = NULL;
                r = loader_string(l, values[0], fctx, "'type'", FAMILYD_MAX_NAME_LENGTH, &type);
                if (r >= 0) {
                        t->type = field_type_from_string(type);
                        if (t->type < 0)
                                r = loader_diag(l, values[0], fctx,
                                                "'type' must be one of bool, int, float, string");
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
                if (t->type < 0)
                        continue;

                if (!values[1])
                        r = selectors ? loader_missing_key(l, e[i].value, fctx, "default") : 0;
                else
                        r = loader_typed(l, values[1], fctx, "'default'", t->type, &t->default_value);
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

static int load_requirement(Loader *l, const YNode *val, const char *ctx, Axis a,
                            Requirement *ret) {
        bool is_list = val->kind == YNODE_SEQUENCE;
        size_t n = is_list ? val->n_items : 1;
        _cleanup_free_ int64_t *values = NULL;
        const YNode *bad = val;
        int r;

        if (is_list && (n == 0 || n > FAMILYD_MAX_LIST_VALUES))
                goto bad;

        values = calloc(n, sizeof(int64_t));
        if (!values)
                return -ENOMEM;
        for (size_t j = 0; j < n; j++) {
                const YNode *item = is_list ? val->items[j] : val;

                r = loader_int(l, item, ctx, "'requires'", &values[j]);
                if (r == -ENOTTY || (r >= 0 && values[j] < 1)) {
                        bad = item;
                        goto bad;
                }
                if (r < 0)
                        return r;
        }

        *ret = (Requirement) { .axis = a, .is_list = is_list, .values = TAKE_PTR(values),
                               .n_values = n };
        return 0;

bad:
        return loader_diag(l, bad, ctx,
                           "'requires' %s must be an integer >= 1 or a non-empty list of them",
                           axis_to_string(a));
}

/* `sequence_parallel: true` or `false`: the job's flag must have that value. */
static int load_flag_requirement(Loader *l, const YNode *val, const char *ctx, JobFlag f, Variant *v) {
        _cleanup_free_ char *what = NULL;
        Value b = {};
        int r;

        what = loader_ctx_push(NULL, "'requires':", job_flag_to_string(f));
        if (!what)
                return -ENOMEM;
        r = loader_typed(l, val, ctx, what, FIELD_TYPE_BOOL, &b);
        if (r < 0)
                return r;
        v->requires_flag[f] = true;
        v->required_value[f] = b.b;
        value_done(&b);
        return 0;
}

static int load_requires(Loader *l, const YNode *n, const char *ctx, Variant *v) {
        Requirement slots[_AXIS_MAX] = {};
        bool present[_AXIS_MAX] = {};
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = loader_map_entries(l, n, ctx, "'requires'", (_AXIS_MAX + _JOB_FLAG_MAX) * 2, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        for (size_t i = 0; i < n_e; i++) {
                Axis a = axis_from_string(e[i].key);
                JobFlag f = job_flag_from_string(e[i].key);

                if (f >= 0)
                        r = load_flag_requirement(l, e[i].value, ctx, f, v);
                else if (a < 0)
                        r = loader_diag_q(l, e[i].key_node, ctx,
                                          "'requires': unknown key %s (axes are tp, cp, ep, pp; flags are sequence_parallel, loss_parallel)",
                                          e[i].key);
                else {
                        r = load_requirement(l, e[i].value, ctx, a, &slots[a]);
                        present[a] = r >= 0;
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        goto fail;
        }

        /* Stored in tp, cp, ep, pp order, whatever the file's order, as Resolve 7 checks them. */
        v->requires = calloc(_AXIS_MAX, sizeof(Requirement));
        if (!v->requires) {
                r = -ENOMEM;
                goto fail;
        }
        for (Axis a = 0; a < _AXIS_MAX; a++)
                if (present[a])
                        v->requires[v->n_requires++] = slots[a];
        return acc;

fail:
        for (Axis a = 0; a < _AXIS_MAX; a++)
                free(slots[a].values);
        return r;
}

static int load_accepts(Loader *l, const Family *f, const YNode *n, const char *ctx, Variant *v) {
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "'accepts'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (n->n_items > FAMILYD_MAX_ARGUMENTS + 4)
                return loader_diag(l, n, ctx, "'accepts' has more than %u entries",
                                   FAMILYD_MAX_ARGUMENTS + 4);

        v->accepts = calloc(n->n_items ? n->n_items : 1, sizeof(char *));
        if (!v->accepts)
                return -ENOMEM;

        for (size_t i = 0; i < n->n_items; i++) {
                _cleanup_free_ char *s = NULL;
                bool seen = false;

                r = loader_name(l, n->items[i], ctx, "'accepts' entries", &s);
                if (r >= 0) {
                        for (size_t j = 0; j < v->n_accepts; j++)
                                seen = seen || streq(v->accepts[j], s);
                        if (seen)
                                r = loader_diag_q(l, n->items[i], ctx, "'accepts' lists %s twice", s);
                        else if (!is_reserved_runtime_name(s) && !family_find_argument(f, s))
                                r = loader_diag_q(l, n->items[i], ctx,
                                                  "'accepts' names %s, which is neither a declared argument nor a runtime name (config, module, module_fqn, context)",
                                                  s);
                        else
                                v->accepts[v->n_accepts++] = TAKE_PTR(s);
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

static int load_variants(Loader *l, Family *f, const YNode *n, const char *ctx) {
        static const char *const keys[] = { "constructor", "accepts", "requires", "parameters" };
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = loader_map_entries(l, n, ctx, "'variants'", FAMILYD_MAX_LIST_VALUES, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;
        if (r >= 0 && n_e == 0)
                return loader_diag(l, n, ctx, "'variants' must declare at least one variant");

        f->variants = calloc(n_e ? n_e : 1, sizeof(Variant));
        if (!f->variants)
                return -ENOMEM;

        for (size_t i = 0; i < n_e; i++) {
                const YNode *values[ELEMENTSOF(keys)] = {};
                _cleanup_free_ char *vctx = NULL;
                Variant *v = &f->variants[f->n_variants++];

                v->name = strdup(e[i].key);
                vctx = loader_ctx_push(ctx, "variant", e[i].key);
                if (!v->name || !vctx)
                        return -ENOMEM;

                r = loader_expect_kind(l, e[i].value, vctx, "the variant", YNODE_MAPPING);
                if (r >= 0)
                        r = loader_map_fixed(l, e[i].value, vctx, keys, values, ELEMENTSOF(keys));
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
                if (e[i].value->kind != YNODE_MAPPING)
                        continue;

                if (!values[0])
                        r = loader_missing_key(l, e[i].value, vctx, "constructor");
                else
                        r = loader_dotted_path(l, values[0], vctx, "'constructor'", &v->constructor);
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;

                if (!values[1])
                        r = loader_missing_key(l, e[i].value, vctx, "accepts");
                else
                        r = load_accepts(l, f, values[1], vctx, v);
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;

                if (values[2]) {
                        r = loader_fold(&acc, load_requires(l, values[2], vctx, v));
                        if (r < 0)
                                return r;
                }

                if (values[3]) {
                        v->has_parameters = true;
                        r = loader_fold(&acc, loader_parameters(l, values[3], vctx, &v->parameters,
                                                       &v->n_parameters));
                        if (r < 0)
                                return r;
                }
        }
        return acc;
}

static int load_rule(Loader *l, Family *f, const YNode *n, const char *ctx, Rule *rule) {
        static const char *const keys[] = { "when", "variant", "error", "unsupported" };
        static const RuleOutcome outcome_of[] = {
                0, RULE_OUTCOME_VARIANT, RULE_OUTCOME_ERROR, RULE_OUTCOME_UNSUPPORTED,
        };
        const YNode *values[ELEMENTSOF(keys)] = {};
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0, n_outcomes = 0, which = 0;
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "a rule", YNODE_MAPPING);
        if (r < 0)
                return r;
        r = loader_fold(&acc, loader_map_fixed(l, n, ctx, keys, values, ELEMENTSOF(keys)));
        if (r < 0)
                return r;

        if (!values[0])
                r = loader_missing_key(l, n, ctx, "when");
        else {
                r = loader_map_entries(l, values[0], ctx, "'when'", FAMILYD_MAX_ARGUMENTS + 1, &e, &n_e);
                if (r >= 0 && n_e == 0)
                        r = loader_diag(l, values[0], ctx, "'when' must not be empty");
        }
        r = loader_fold(&acc, r);
        if (r < 0)
                return r;

        rule->when = calloc(n_e ? n_e : 1, sizeof(RuleCondition));
        if (!rule->when)
                return -ENOMEM;
        for (size_t i = 0; i < n_e; i++) {
                _cleanup_free_ char *what = NULL;
                const TypedField *sel = NULL;
                FieldType t = FIELD_TYPE_BOOL;
                Value v = {};

                if (!streq(e[i].key, "parallel") && job_flag_from_string(e[i].key) < 0) {
                        sel = family_find_selector(f, e[i].key);
                        if (!sel) {
                                r = loader_fold(&acc, loader_diag_q(l, e[i].key_node, ctx,
                                                             "'when': %s is not a declared selector (nor 'parallel', 'sequence_parallel', 'loss_parallel')",
                                                             e[i].key));
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        if (sel->type < 0) /* already diagnosed at the selector */
                                continue;
                        t = sel->type;
                }

                what = loader_ctx_push(NULL, "'when':", e[i].key);
                if (!what)
                        return -ENOMEM;
                r = loader_typed(l, e[i].value, ctx, what, t, &v);
                if (r >= 0) {
                        RuleCondition *c = &rule->when[rule->n_when];
                        c->key = strdup(e[i].key);
                        if (!c->key) {
                                value_done(&v);
                                return -ENOMEM;
                        }
                        c->value = v;
                        rule->n_when++;
                }
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }

        for (size_t i = 1; i < ELEMENTSOF(keys); i++)
                if (values[i]) {
                        n_outcomes++;
                        which = i;
                }
        if (n_outcomes != 1)
                return loader_diag(l, n, ctx, "a rule needs exactly one of 'variant', 'error', 'unsupported'");

        rule->outcome = outcome_of[which];
        if (which == 1) {
                r = loader_name(l, values[1], ctx, "'variant'", &rule->text);
                if (r >= 0 && !family_find_variant(f, rule->text))
                        r = loader_diag_q(l, values[1], ctx, "'variant': %s is not a variant of this family",
                                          rule->text);
        } else {
                r = loader_string(l, values[which], ctx, which == 2 ? "'error'" : "'unsupported'",
                                FAMILYD_MAX_STRING_VALUE_LENGTH, &rule->text);
                if (r >= 0 && !*rule->text)
                        r = loader_diag(l, values[which], ctx, "'%s' must not be empty", keys[which]);
        }
        r = loader_fold(&acc, r);
        if (r < 0)
                return r;
        return acc;
}

static int load_rules(Loader *l, Family *f, const YNode *n, const char *ctx) {
        int acc = 0, r;

        r = loader_expect_kind(l, n, ctx, "'rules'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (n->n_items > FAMILYD_MAX_LIST_VALUES)
                return loader_diag(l, n, ctx, "'rules' has more than %u entries", FAMILYD_MAX_LIST_VALUES);

        f->rules = calloc(n->n_items ? n->n_items : 1, sizeof(Rule));
        if (!f->rules)
                return -ENOMEM;

        for (size_t i = 0; i < n->n_items; i++) {
                _cleanup_free_ char *rctx = NULL;

                if (asprintf(&rctx, "%s: rule %zu", ctx, i + 1) < 0)
                        return -ENOMEM;
                r = loader_fold(&acc, load_rule(l, f, n->items[i], rctx, &f->rules[f->n_rules++]));
                if (r < 0)
                        return r;
        }
        return acc;
}

/* The family's name, before its other keys (a bad one is diagnosed here, as any key). */
static int load_name_first(Loader *l, const YNode *n, Family *f) {
        for (size_t i = 0; i < ynode_n_pairs(n); i++) {
                const YNode *k = ynode_key(n, i);
                if (k->kind == YNODE_SCALAR && streq(k->text, "name"))
                        return loader_name(l, ynode_value(n, i), "family", "'name'", &f->name);
        }
        return 0;
}

static int load_parallel_axis(Loader *l, const YNode *v, const char *ctx, Family *f) {
        _cleanup_free_ char *axis = NULL;
        int r;

        r = loader_string(l, v, ctx, "'parallel_axis'", FAMILYD_MAX_NAME_LENGTH, &axis);
        if (r < 0)
                return r;
        f->parallel_axis = axis_from_string(axis);
        if (f->parallel_axis < 0)
                return loader_diag(l, v, ctx, "'parallel_axis' must be one of tp, cp, ep, pp");
        return 0;
}

int loader_family(Loader *l, const YNode *n, Family *f, unsigned *ret_baseline_line,
                unsigned *ret_baseline_column) {
        const YNode *v[_FK_MAX] = {};
        _cleanup_free_ char *ctx = NULL;
        int acc = 0, r;

        if (asprintf(&f->source, "%s:%u", l->file, n->line) < 0) {
                f->source = NULL;
                return -ENOMEM;
        }

        r = loader_expect_kind(l, n, NULL, "a family", YNODE_MAPPING);
        if (r < 0)
                return r;

        /* The name first, so that every later diagnostic can say whose it is. */
        if (load_name_first(l, n, f) == -ENOMEM)
                return -ENOMEM;
        ctx = f->name ? loader_ctx_push(NULL, "family", f->name) : strdup("family");
        if (!ctx)
                return -ENOMEM;

        r = loader_fold(&acc, loader_map_fixed(l, n, ctx, family_keys, v, _FK_MAX));
        if (r < 0)
                return r;

        if (!v[FK_NAME])
                r = loader_missing_key(l, n, ctx, "name");
        else if (!f->name)
                r = -EINVAL; /* diagnosed above */
        else
                r = 0;
        r = loader_fold(&acc, r);
        if (r < 0)
                return r;

        if (!v[FK_BASELINE])
                r = loader_missing_key(l, n, ctx, "baseline");
        else {
                r = loader_dotted_path(l, v[FK_BASELINE], ctx, "'baseline'", &f->baseline);
                *ret_baseline_line = v[FK_BASELINE]->line;
                *ret_baseline_column = v[FK_BASELINE]->column;
        }
        r = loader_fold(&acc, r);
        if (r < 0)
                return r;

        if (v[FK_SELECTORS]) {
                r = loader_fold(&acc, load_typed_fields(l, f, v[FK_SELECTORS], ctx, true, &f->selectors,
                                                 &f->n_selectors));
                if (r < 0)
                        return r;
        }
        if (v[FK_ARGUMENTS]) {
                r = loader_fold(&acc, load_typed_fields(l, f, v[FK_ARGUMENTS], ctx, false, &f->arguments,
                                                 &f->n_arguments));
                if (r < 0)
                        return r;
        }
        if (f->n_selectors + f->n_arguments > FAMILYD_MAX_ARGUMENTS) {
                r = loader_fold(&acc, loader_diag(l, n, ctx, "more than %u selectors and arguments",
                                           FAMILYD_MAX_ARGUMENTS));
                if (r < 0)
                        return r;
        }

        if (!v[FK_VARIANTS])
                r = loader_missing_key(l, n, ctx, "variants");
        else
                r = load_variants(l, f, v[FK_VARIANTS], ctx);
        r = loader_fold(&acc, r);
        if (r < 0)
                return r;

        if (v[FK_DEFAULT_VARIANT]) {
                r = loader_name(l, v[FK_DEFAULT_VARIANT], ctx, "'default_variant'", &f->default_variant);
                if (r >= 0 && v[FK_VARIANTS] && !family_find_variant(f, f->default_variant))
                        r = loader_diag_q(l, v[FK_DEFAULT_VARIANT], ctx,
                                          "'default_variant': %s is not a variant of this family",
                                          f->default_variant);
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }

        if (v[FK_PARALLEL_AXIS]) {
                r = loader_fold(&acc, load_parallel_axis(l, v[FK_PARALLEL_AXIS], ctx, f));
                if (r < 0)
                        return r;
        }

        if (v[FK_RULES]) {
                r = loader_fold(&acc, load_rules(l, f, v[FK_RULES], ctx));
                if (r < 0)
                        return r;
        }

        if (v[FK_PARAMETERS]) {
                r = loader_fold(&acc, loader_parameters(l, v[FK_PARAMETERS], ctx, &f->parameters,
                                               &f->n_parameters));
                if (r < 0)
                        return r;
        }

        if (v[FK_LAYOUT]) {
                r = loader_activation_layout(l, v[FK_LAYOUT], ctx, &f->layout);
                if (r >= 0)
                        f->has_layout = true;
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }

        return acc;
}

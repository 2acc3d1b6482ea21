/* resolve.c: Resolve, steps 2-8 of docs/semantics.md, composed with the target lookup. */
#include <inttypes.h>
#include <stdio.h>

#include "repr.h"
#include "resolve.h"

void job_context_done(JobContext *c) {
        if (!c)
                return;
        free(c->mesh_id);
        *c = (JobContext) {};
}

int job_context_copy(const JobContext *src, JobContext *ret) {
        JobContext c = *src;

        c.mesh_id = NULL;
        if (src->mesh_id) {
                c.mesh_id = strdup(src->mesh_id);
                if (!c.mesh_id)
                        return -ENOMEM;
        }

        *ret = c;
        return 0;
}

void resolve_request_done(ResolveRequest *r) {
        if (!r)
                return;
        free(r->family);
        value_map_done(&r->arguments);
        job_context_done(&r->context);
        *r = (ResolveRequest) {};
}

void resolved_family_done(ResolvedFamily *r) {
        if (!r)
                return;
        free(r->family);
        free(r->variant);
        free(r->constructor);
        value_map_done(&r->arguments);
        value_map_done(&r->selectors);
        *r = (ResolvedFamily) {};
}

static bool name_allowed(const char *const *allow_names, const char *name) {
        if (!allow_names)
                return false;
        for (const char *const *a = allow_names; *a; a++)
                if (streq(*a, name))
                        return true;
        return false;
}

static int string_ptr_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

static bool name_known(const Family *f, const char *const *allow_names, const char *name) {
        return name_allowed(allow_names, name) || family_find_selector(f, name) || family_find_argument(f, name);
}

/* The failure path only: every unknown key, sorted (keys of a ValueMap are unique). */
static int unknown_arguments(const Family *f, const ValueMap *arguments, const char *const *allow_names,
                             FamilyError *ret_error) {
        _cleanup_free_ char **unknown = calloc(arguments->n, sizeof(char *));
        size_t n = 0;

        if (!unknown)
                return -ENOMEM;
        for (size_t i = 0; i < arguments->n; i++)
                if (!name_known(f, allow_names, arguments->items[i].name))
                        unknown[n++] = arguments->items[i].name;
        qsort(unknown, n, sizeof(char *), string_ptr_cmp);

        _cleanup_free_ char *list = repr_string_list(unknown, n);
        if (!list)
                return -ENOMEM;
        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "UNKNOWN_ARGUMENTS", "arguments",
                                "%s: unknown arguments: %s", f->name, list);
}

/*
 * Step 2. Reserved runtime names are never declared (the loader refuses them), so they are
 * unknown here unless the caller allows them. This runs on every Resolve and Build, so the
 * success path allocates nothing: the first type mismatch in sorted key order is the smallest
 * mismatching key, found in one pass.
 */
int resolve_check_arguments(const Family *f, const ValueMap *arguments,
                            const char *const *allow_names, FamilyError *ret_error) {
        const TypedField *bad_field = NULL;
        const char *bad_name = NULL, *bad_what = NULL;

        if (!f || !arguments)
                return -EINVAL;

        for (size_t i = 0; i < arguments->n; i++)
                if (!name_known(f, allow_names, arguments->items[i].name))
                        return unknown_arguments(f, arguments, allow_names, ret_error);

        for (size_t i = 0; i < arguments->n; i++) {
                const NamedValue *nv = &arguments->items[i];
                const TypedField *field;
                const char *what = "selector";

                if (name_allowed(allow_names, nv->name))
                        continue;
                if (bad_name && strcmp(nv->name, bad_name) >= 0)
                        continue;

                field = family_find_selector(f, nv->name);
                if (!field) {
                        field = family_find_argument(f, nv->name);
                        what = "argument";
                }
                if (!field || value_matches_type(&nv->value, field->type))
                        continue;

                bad_name = nv->name;
                bad_field = field;
                bad_what = what;
        }
        if (!bad_name)
                return 0;

        _cleanup_free_ char *q = repr_string(bad_name);
        if (!q)
                return -ENOMEM;
        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "ARGUMENT_TYPE", bad_name,
                                "%s %s must be %s", bad_what, q, field_type_to_string(bad_field->type));
}

static void axis_field(Axis a, char buf[static 16]) {
        (void) snprintf(buf, 16, "%s_size", axis_to_string(a));
}

/* Steps 3-5. */
int resolve_axis_sizes(MeshTable *meshes, const JobContext *ctx, int64_t ret_size[_AXIS_MAX],
                       Mesh **ret_mesh, FamilyError *ret_error) {
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        int64_t size[_AXIS_MAX];
        char field[16];
        int r;

        if (!ctx || !ret_size)
                return -EINVAL;

        for (Axis a = 0; a < _AXIS_MAX; a++)
                if (ctx->has_size[a] && ctx->size[a] < 1) {
                        axis_field(a, field);
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_SIZE", field,
                                                "%s_size must be a positive integer", axis_to_string(a));
                }

        if (!isempty(ctx->mesh_id)) {
                /* No table: every id is unknown. */
                if (meshes)
                        r = mesh_table_get(meshes, ctx->mesh_id, &mesh, ret_error);
                else
                        r = mesh_table_not_found(ctx->mesh_id, ret_error);
                if (r < 0)
                        return r;

                /* Axis flags are ignored with a mesh: the mesh's sizes are the job's. */
                for (Axis a = 0; a < _AXIS_MAX; a++) {
                        size[a] = mesh->axis_size[a];
                        if (ctx->has_size[a] && ctx->size[a] != size[a]) {
                                axis_field(a, field);
                                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                        "CONTEXT_MESH_DISAGREE", field,
                                                        "context and mesh disagree on %s_size", axis_to_string(a));
                        }
                }
        } else
                for (Axis a = 0; a < _AXIS_MAX; a++) {
                        if (ctx->has_size[a])
                                size[a] = ctx->size[a];
                        else if (ctx->active[a]) {
                                axis_field(a, field);
                                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "AXIS_REQUIRED",
                                                        field, "%s_size is required when %s is active",
                                                        axis_to_string(a), axis_to_string(a));
                        } else
                                size[a] = 1;
                }

        memcpy(ret_size, size, sizeof(size));
        if (ret_mesh)
                *ret_mesh = TAKE_PTR(mesh);
        return 0;
}

void resolve_job_flags(const JobContext *ctx, const Mesh *mesh, bool ret_flag[_JOB_FLAG_MAX]) {
        const MeshSpec *s = mesh ? &mesh->spec : NULL;

        ret_flag[JOB_FLAG_SEQUENCE_PARALLEL] = s ? s->sequence_parallel : ctx && ctx->sequence_parallel;
        ret_flag[JOB_FLAG_LOSS_PARALLEL] = s ? s->loss_parallel : ctx && ctx->loss_parallel;
}

/*
 * A rule's `when` value against an effective selector value. Kinds must agree, as value_equal
 * has it, with one exception: an int and a float compare by numeric value. A float selector
 * may be given an int (step 2 accepts it) and a YAML rule may write `1` for a float selector;
 * both mean the number one, and Python's `1 == 1.0` agrees. The comparison is exact: an int
 * equals a float only when the float is integral, in range and converts to that very int.
 */
static bool when_value_equal(const Value *want, const Value *have) {
        const Value *i = NULL, *f = NULL;

        if (want->kind == VALUE_INT && have->kind == VALUE_FLOAT)
                i = want, f = have;
        else if (want->kind == VALUE_FLOAT && have->kind == VALUE_INT)
                i = have, f = want;
        else
                return value_equal(want, have);

        /* -2^63 and 2^63 bound the doubles that convert to int64 without undefined behaviour. */
        if (!(f->f >= -9223372036854775808.0 && f->f < 9223372036854775808.0))
                return false;
        return (double) (int64_t) f->f == f->f && (int64_t) f->f == i->i;
}

/*
 * The effective selectors, in declaration order: the caller's value as given, else the default.
 * A float selector given an int keeps the int (Python's effective selector is the value passed):
 * converting it to a double would lose precision past 2^53, and when_value_equal compares an
 * int with a float exactly.
 */
static int effective_selectors(const Family *f, const ValueMap *arguments, ValueMap *ret) {
        _cleanup_(value_map_done) ValueMap m = {};
        int r;

        for (size_t i = 0; i < f->n_selectors; i++) {
                const TypedField *s = &f->selectors[i];
                const Value *given = value_map_get(arguments, s->name);
                _cleanup_(value_done) Value v = {};

                r = value_copy(given ? given : &s->default_value, &v);
                if (r < 0)
                        return r;

                r = value_map_put(&m, s->name, &v);
                if (r < 0)
                        return r;
        }

        *ret = m;
        m = (ValueMap) {};
        return 0;
}

static bool rule_matches(const Rule *rule, const ValueMap *selectors, bool parallel,
                         const bool flag[_JOB_FLAG_MAX]) {
        for (size_t i = 0; i < rule->n_when; i++) {
                const RuleCondition *c = &rule->when[i];
                JobFlag jf = job_flag_from_string(c->key);

                if (streq(c->key, "parallel") || jf >= 0) {
                        bool have = jf >= 0 ? flag[jf] : parallel;

                        if (c->value.kind != VALUE_BOOL || c->value.b != have)
                                return false;
                        continue;
                }

                const Value *have = value_map_get(selectors, c->key);
                if (!have || !when_value_equal(&c->value, have))
                        return false;
        }
        return true;
}

static const Requirement *variant_requirement(const Variant *v, Axis a) {
        for (size_t i = 0; i < v->n_requires; i++)
                if (v->requires[i].axis == a)
                        return &v->requires[i];
        return NULL;
}

/* Step 7. */
static int check_requires(const Variant *v, const int64_t size[_AXIS_MAX], const bool flag[_JOB_FLAG_MAX],
                          FamilyError *e) {
        for (Axis a = 0; a < _AXIS_MAX; a++) {
                const Requirement *req = variant_requirement(v, a);
                const char *axis = axis_to_string(a);
                bool ok = false;

                if (!req)
                        continue;
                for (size_t i = 0; i < req->n_values; i++)
                        if (req->values[i] == size[a])
                                ok = true;
                if (ok)
                        continue;

                _cleanup_free_ char *q = repr_string(v->name);
                if (!q)
                        return -ENOMEM;
                if (req->is_list) {
                        _cleanup_free_ char *list = repr_int_list(req->values, req->n_values);
                        if (!list)
                                return -ENOMEM;
                        return family_error_set(e, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT", axis,
                                                "variant %s requires %s in %s; job has %s=%" PRId64,
                                                q, axis, list, axis, size[a]);
                }
                return family_error_set(e, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT", axis,
                                        "variant %s requires %s=%" PRId64 "; job has %s=%" PRId64,
                                        q, axis, req->n_values > 0 ? req->values[0] : 0, axis, size[a]);
        }

        /* Then the flags, sequence_parallel before loss_parallel, in Python's spelling. */
        for (JobFlag f = 0; f < _JOB_FLAG_MAX; f++) {
                const char *name = job_flag_to_string(f);

                if (!v->requires_flag[f] || v->required_value[f] == flag[f])
                        continue;

                _cleanup_free_ char *q = repr_string(v->name);
                if (!q)
                        return -ENOMEM;
                return family_error_set(e, FAMILY_STATUS_FAILED_PRECONDITION, "REQUIREMENT", name,
                                        "variant %s requires %s=%s; job has %s=%s", q, name,
                                        v->required_value[f] ? "True" : "False", name,
                                        flag[f] ? "True" : "False");
        }
        return 0;
}

/* Steps 6-8. */
int resolve_select(const Family *f, const ValueMap *arguments, const int64_t size[_AXIS_MAX],
                   const bool flag_or_null[_JOB_FLAG_MAX], ResolvedFamily *ret, FamilyError *ret_error) {
        _cleanup_(resolved_family_done) ResolvedFamily res = {};
        const bool *flag = flag_or_null ? flag_or_null : (const bool[_JOB_FLAG_MAX]) {};
        const Variant *v = NULL;
        int r;

        if (!f || !arguments || !size || !ret)
                return -EINVAL;

        bool parallel = f->parallel_axis >= 0 && f->parallel_axis < _AXIS_MAX && size[f->parallel_axis] > 1;

        r = effective_selectors(f, arguments, &res.selectors);
        if (r < 0)
                return r;

        for (size_t i = 0; i < f->n_rules && !v; i++) {
                const Rule *rule = &f->rules[i];

                if (!rule_matches(rule, &res.selectors, parallel, flag))
                        continue;

                switch (rule->outcome) {
                case RULE_OUTCOME_VARIANT:
                        v = family_find_variant(f, rule->text);
                        if (!v)
                                /* The loader checks this; a hand-made family may not. */
                                return family_error_set(ret_error, FAMILY_STATUS_INTERNAL, "RULE_VARIANT", "rules",
                                                        "rule names an unknown variant");
                        break;
                case RULE_OUTCOME_ERROR:
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "RULE_ERROR", NULL,
                                                "%s", strempty(rule->text));
                case RULE_OUTCOME_UNSUPPORTED:
                        return family_error_set(ret_error, FAMILY_STATUS_UNIMPLEMENTED, "RULE_UNSUPPORTED", NULL,
                                                "%s", strempty(rule->text));
                default:
                        return -EINVAL;
                }
        }

        if (!v) {
                if (!f->default_variant)
                        return registry_no_default_variant(ret_error);
                v = family_find_variant(f, f->default_variant);
                if (!v)
                        return registry_no_default_variant(ret_error);
        }

        if (streq_ptr(v->constructor, f->baseline))
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "MEMBER_IS_FACTORY", "variant",
                                        "a concrete family member cannot be its public factory");

        r = check_requires(v, size, flag, ret_error);
        if (r < 0)
                return r;

        /* The caller's arguments in the caller's order, selectors consumed. */
        for (size_t i = 0; i < arguments->n; i++) {
                const NamedValue *nv = &arguments->items[i];
                _cleanup_(value_done) Value copy = {};

                if (family_find_selector(f, nv->name))
                        continue;
                r = value_copy(&nv->value, &copy);
                if (r < 0)
                        return r;
                r = value_map_put(&res.arguments, nv->name, &copy);
                if (r < 0)
                        return r;
        }

        res.family = strdup(strempty(f->name));
        res.variant = strdup(strempty(v->name));
        res.constructor = strdup(strempty(v->constructor));
        if (!res.family || !res.variant || !res.constructor)
                return -ENOMEM;
        memcpy(res.axis_size, size, sizeof(res.axis_size));
        memcpy(res.flag, flag, sizeof(res.flag));

        *ret = res;
        res = (ResolvedFamily) {};
        return 0;
}

int resolve_family(const Registry *reg, MeshTable *meshes, const ResolveRequest *req,
                   ResolvedFamily *ret, FamilyError *ret_error) {
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        const Family *f = NULL;
        int64_t size[_AXIS_MAX];
        bool flag[_JOB_FLAG_MAX];
        int r;

        if (!reg || !req || !ret)
                return -EINVAL;

        /* Step 1, both halves: the target and its default_variant. */
        r = registry_find(reg, strempty(req->family), &f, ret_error);
        if (r < 0)
                return r;

        r = resolve_check_arguments(f, &req->arguments, NULL, ret_error);
        if (r < 0)
                return r;

        r = resolve_axis_sizes(meshes, &req->context, size, &mesh, ret_error);
        if (r < 0)
                return r;

        resolve_job_flags(&req->context, mesh, flag);
        return resolve_select(f, &req->arguments, size, flag, ret, ret_error);
}

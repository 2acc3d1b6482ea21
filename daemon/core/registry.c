/* registry.c: the registry snapshot's lifetime, lookups and load diagnostics. */
#include <stdio.h>

#include "placement-case.h"
#include "registry.h"
#include "repr.h"

static void typed_field_done(TypedField *t) {
        free(t->name);
        value_done(&t->default_value);
}

static void rule_done(Rule *r) {
        for (size_t i = 0; i < r->n_when; i++) {
                free(r->when[i].key);
                value_done(&r->when[i].value);
        }
        free(r->when);
        free(r->text);
}

void init_number_done(InitNumber *x) {
        if (!x)
                return;
        free(x->field);
        init_expr_free(x->expr);
        *x = (InitNumber) {};
}

void init_spec_done(InitSpec *s) {
        if (!s)
                return;
        init_number_done(&s->a);
        init_number_done(&s->b);
        init_number_done(&s->c);
        init_number_done(&s->d);
}

void parameter_spec_done(ParameterSpec *p) {
        if (!p)
                return;
        free(p->name);
        for (size_t i = 0; i < p->n_dims; i++)
                expr_free(p->shape[i]);
        free(p->shape);
        for (size_t i = 0; i < p->n_placements; i++) {
                free(p->placements[i].axis);
                if (p->placement_cases)
                        placement_cases_done(&p->placement_cases[i]);
        }
        free(p->placements);
        free(p->placement_cases);
        init_spec_done(&p->init);
        free(p->init_text);
        free(p->dtype);
        checkpoint_source_done(&p->checkpoint);
        *p = (ParameterSpec) {};
}

static void parameter_specs_free(ParameterSpec *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                parameter_spec_done(&p[i]);
        free(p);
}

static void variant_done(Variant *v) {
        free(v->name);
        free(v->constructor);
        for (size_t i = 0; i < v->n_accepts; i++)
                free(v->accepts[i]);
        free(v->accepts);
        for (size_t i = 0; i < v->n_requires; i++)
                free(v->requires[i].values);
        free(v->requires);
        parameter_specs_free(v->parameters, v->n_parameters);
}

void family_done(Family *f) {
        if (!f)
                return;
        free(f->name);
        free(f->baseline);
        free(f->default_variant);
        for (size_t i = 0; i < f->n_selectors; i++)
                typed_field_done(&f->selectors[i]);
        free(f->selectors);
        for (size_t i = 0; i < f->n_arguments; i++)
                typed_field_done(&f->arguments[i]);
        free(f->arguments);
        for (size_t i = 0; i < f->n_variants; i++)
                variant_done(&f->variants[i]);
        free(f->variants);
        for (size_t i = 0; i < f->n_rules; i++)
                rule_done(&f->rules[i]);
        free(f->rules);
        parameter_specs_free(f->parameters, f->n_parameters);
        activation_layout_done(&f->layout);
        free(f->source);
        *f = (Family) { .parallel_axis = _AXIS_INVALID };
}

static Registry *registry_free(Registry *r) {
        if (!r)
                return NULL;
        for (size_t i = 0; i < r->n_families; i++)
                family_done(&r->families[i]);
        free(r->families);
        free(r->path);
        return mfree(r);
}

Registry *registry_ref(Registry *r) {
        if (!r)
                return NULL;
        atomic_fetch_add_explicit(&r->n_ref, 1, memory_order_relaxed);
        return r;
}

Registry *registry_unref(Registry *r) {
        if (!r)
                return NULL;
        /* Release/acquire so that the thread dropping the last reference sees every other
         * thread's reads finished before it frees (the usual refcount pattern). */
        if (atomic_fetch_sub_explicit(&r->n_ref, 1, memory_order_release) == 1) {
                atomic_thread_fence(memory_order_acquire);
                registry_free(r);
        }
        return NULL;
}

int registry_new(const char *path, uint64_t generation, Family *families, size_t n_families,
                 Registry **ret) {
        Registry *r;

        if (!ret || (n_families > 0 && !families))
                return -EINVAL;

        r = calloc(1, sizeof(Registry));
        if (!r)
                return -ENOMEM;
        if (path) {
                r->path = strdup(path);
                if (!r->path) {
                        free(r);
                        return -ENOMEM;
                }
        }
        atomic_init(&r->n_ref, 1);
        r->generation = generation;
        r->families = families;
        r->n_families = n_families;

        *ret = r;
        return 0;
}

static int target_not_found(const char *target, FamilyStatus status, const char *reason,
                            FamilyError *ret_error) {
        _cleanup_free_ char *quoted = repr_string(target);
        if (!quoted)
                return -ENOMEM;
        return family_error_set(ret_error, status, reason, "family",
                                "family name %s must identify exactly one registration", quoted);
}

int registry_lookup(const Registry *r, const char *target, const Family **ret,
                    FamilyError *ret_error) {
        const Family *found = NULL;
        size_t n_matches = 0;

        if (!r || !target)
                return -EINVAL;

        /* A baseline is unique and names exactly one family, whatever the names say. */
        for (size_t i = 0; i < r->n_families; i++)
                if (streq(r->families[i].baseline, target)) {
                        if (ret)
                                *ret = &r->families[i];
                        return 0;
                }

        for (size_t i = 0; i < r->n_families; i++)
                if (streq(r->families[i].name, target)) {
                        if (!found)
                                found = &r->families[i];
                        n_matches++;
                }

        if (n_matches == 0)
                return target_not_found(target, FAMILY_STATUS_NOT_FOUND, "UNKNOWN_FAMILY", ret_error);
        if (n_matches > 1)
                return target_not_found(target, FAMILY_STATUS_INVALID_ARGUMENT, "AMBIGUOUS_FAMILY",
                                        ret_error);

        if (ret)
                *ret = found;
        return 0;
}

int registry_no_default_variant(FamilyError *ret_error) {
        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "NO_DEFAULT_VARIANT", "family",
                                "FamilyRequest requires a family with a concrete default_variant");
}

int registry_find(const Registry *r, const char *target, const Family **ret, FamilyError *ret_error) {
        const Family *f;
        int k;

        k = registry_lookup(r, target, &f, ret_error);
        if (k < 0)
                return k;

        if (!f->default_variant)
                return registry_no_default_variant(ret_error);

        if (ret)
                *ret = f;
        return 0;
}

const Variant *family_find_variant(const Family *f, const char *name) {
        if (!f || !name)
                return NULL;
        for (size_t i = 0; i < f->n_variants; i++)
                if (streq(f->variants[i].name, name))
                        return &f->variants[i];
        return NULL;
}

static const TypedField *typed_field_find(const TypedField *fields, size_t n, const char *name) {
        if (!name)
                return NULL;
        for (size_t i = 0; i < n; i++)
                if (streq(fields[i].name, name))
                        return &fields[i];
        return NULL;
}

const TypedField *family_find_selector(const Family *f, const char *name) {
        return f ? typed_field_find(f->selectors, f->n_selectors, name) : NULL;
}

const TypedField *family_find_argument(const Family *f, const char *name) {
        return f ? typed_field_find(f->arguments, f->n_arguments, name) : NULL;
}

void variant_parameters(const Family *f, const Variant *v, const ParameterSpec **ret, size_t *ret_n) {
        const ParameterSpec *p = NULL;
        size_t n = 0;

        if (v && v->has_parameters) {
                p = v->parameters;
                n = v->n_parameters;
        } else if (f) {
                p = f->parameters;
                n = f->n_parameters;
        }

        if (ret)
                *ret = p;
        if (ret_n)
                *ret_n = n;
}

static const char *const placement_kind_table[_PLACEMENT_KIND_MAX] = {
        [PLACEMENT_SHARD] = "shard",
        [PLACEMENT_REPLICATE] = "replicate",
};

const char *placement_kind_to_string(PlacementKind k) {
        if (k < 0 || k >= _PLACEMENT_KIND_MAX)
                return NULL;
        return placement_kind_table[k];
}

static const char *const init_kind_table[_INIT_KIND_MAX] = {
        [INIT_ZEROS] = "zeros",
        [INIT_ONES] = "ones",
        [INIT_CONSTANT] = "constant",
        [INIT_NORMAL] = "normal",
        [INIT_UNIFORM] = "uniform",
        [INIT_TRUNC_NORMAL] = "trunc_normal",
        [INIT_MODULE] = "module",
};

const char *init_kind_to_string(InitKind k) {
        if (k < 0 || k >= _INIT_KIND_MAX)
                return NULL;
        return init_kind_table[k];
}

static const char *const job_flag_table[_JOB_FLAG_MAX] = {
        [JOB_FLAG_SEQUENCE_PARALLEL] = "sequence_parallel",
        [JOB_FLAG_LOSS_PARALLEL] = "loss_parallel",
};

const char *job_flag_to_string(JobFlag f) {
        if (f < 0 || f >= _JOB_FLAG_MAX)
                return NULL;
        return job_flag_table[f];
}

JobFlag job_flag_from_string(const char *s) {
        if (!s)
                return _JOB_FLAG_INVALID;
        for (JobFlag f = 0; f < _JOB_FLAG_MAX; f++)
                if (streq(job_flag_table[f], s))
                        return f;
        return _JOB_FLAG_INVALID;
}

bool is_reserved_runtime_name(const char *name) {
        static const char *const reserved[] = { "config", "module", "module_fqn", "context" };

        if (!name)
                return false;
        for (size_t i = 0; i < ELEMENTSOF(reserved); i++)
                if (streq(reserved[i], name))
                        return true;
        return false;
}

void load_diagnostics_done(LoadDiagnostics *d) {
        if (!d)
                return;
        for (size_t i = 0; i < d->n; i++)
                free(d->lines[i]);
        free(d->lines);
        *d = (LoadDiagnostics) {};
}

int load_diagnostics_add(LoadDiagnostics *d, const char *file, unsigned line, unsigned column,
                         const char *format, ...) {
        _cleanup_free_ char *text = NULL;
        char *s = NULL;
        va_list ap;
        int k;

        if (!d || !format)
                return -EINVAL;

        va_start(ap, format);
        k = vasprintf(&text, format, ap);
        va_end(ap);
        if (k < 0) {
                text = NULL;
                return -ENOMEM;
        }

        /* line 0 marks a problem with a whole file or the directory, which has no position. */
        if (!file)
                k = asprintf(&s, "%s", text);
        else if (line == 0)
                k = asprintf(&s, "%s: %s", file, text);
        else
                k = asprintf(&s, "%s:%u:%u: %s", file, line, column, text);
        if (k < 0)
                return -ENOMEM;

        if (!GREEDY_REALLOC(d->lines, d->allocated, d->n + 1)) {
                free(s);
                return -ENOMEM;
        }
        d->lines[d->n++] = s;
        return 0;
}

char *load_diagnostics_join(const LoadDiagnostics *d) {
        size_t len = 0;
        char *s, *p;

        if (!d)
                return NULL;
        for (size_t i = 0; i < d->n; i++)
                len += strlen(d->lines[i]) + 1;

        s = malloc(len + 1);
        if (!s)
                return NULL;
        p = s;
        for (size_t i = 0; i < d->n; i++) {
                if (i > 0)
                        *p++ = '\n';
                size_t l = strlen(d->lines[i]);
                memcpy(p, d->lines[i], l);
                p += l;
        }
        *p = 0;
        return s;
}

/* build-request.c: the BuildRequest of `familyctl build` from its command line: config fields
 * from --config FILE.json and KEY=VALUE, --arg KEY=VALUE, the --module FILE.json. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

/* The request is on the heap, every string and array malloc()ed, so that protobuf-c's
 * free_unpacked (which frees with the default allocator) releases all of it. */

static int value_from_json(json_t *j, Familyd__V1__Value **ret, const char **ret_why);

static int list_from_json(json_t *j, Familyd__V1__Value *v, const char **ret_why) {
        Familyd__V1__ValueList *l = malloc(sizeof(*l));
        size_t n = json_array_size(j);

        if (!l)
                return -ENOMEM;
        familyd__v1__value_list__init(l);
        v->kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
        v->list_value = l;      /* the caller's from here on */
        if (n > 0) {
                l->values = calloc(n, sizeof(*l->values));
                if (!l->values)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                int r = value_from_json(json_array_get(j, i), &l->values[i], ret_why);

                if (r < 0)
                        return r;
                l->n_values++;
        }
        return 0;
}

/* A JSON number (an integer without '.', 'e' or 'E' is an int), string, bool, or list of them. */
static int value_from_json(json_t *j, Familyd__V1__Value **ret, const char **ret_why) {
        Familyd__V1__Value *v;
        int r = 0;

        if (json_is_null(j) || json_is_object(j)) {
                *ret_why = json_is_null(j) ? "null is not a value" : "objects are not values";
                return -EINVAL;
        }
        v = malloc(sizeof(*v));
        if (!v)
                return -ENOMEM;
        familyd__v1__value__init(v);
        if (json_is_boolean(j)) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
                v->bool_value = json_is_true(j);
        } else if (json_is_integer(j)) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
                v->int_value = json_integer_value(j);
        } else if (json_is_real(j)) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                v->double_value = json_real_value(j);
        } else if (json_is_string(j)) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_STRING_VALUE;
                v->string_value = strdup(json_string_value(j));
                if (!v->string_value)
                        r = -ENOMEM;
        } else
                r = list_from_json(j, v, ret_why);
        if (r < 0) {
                familyd__v1__value__free_unpacked(v, NULL);
                return r;
        }
        *ret = v;
        return 0;
}

/* Sets key to v in config (replacing an earlier value of that key); takes v. */
static int config_set(Familyd__V1__Config *config, const char *key, Familyd__V1__Value *v) {
        Familyd__V1__Config__FieldsEntry *e, **grown;

        for (size_t i = 0; i < config->n_fields; i++)
                if (streq_ptr(config->fields[i]->key, key)) {
                        familyd__v1__value__free_unpacked(config->fields[i]->value, NULL);
                        config->fields[i]->value = v;
                        return 0;
                }
        grown = realloc(config->fields, (config->n_fields + 1) * sizeof(*grown));
        if (!grown)
                goto fail;
        config->fields = grown;
        e = malloc(sizeof(*e));
        if (!e)
                goto fail;
        familyd__v1__config__fields_entry__init(e);
        e->key = strdup(key);
        if (!e->key) {
                free(e);
                goto fail;
        }
        e->value = v;
        config->fields[config->n_fields++] = e;
        return 0;
fail:
        familyd__v1__value__free_unpacked(v, NULL);
        return -ENOMEM;
}

/* A value of KEY=VALUE text, heap-allocated (the string copied). */
static int value_from_text(const char *text, Familyd__V1__Value **ret) {
        Familyd__V1__Value tmp, *v;

        (void) ctl_parse_value(text, &tmp);
        v = malloc(sizeof(*v));
        if (!v)
                return -ENOMEM;
        *v = tmp;
        if (v->kind_case == FAMILYD__V1__VALUE__KIND_STRING_VALUE) {
                v->string_value = strdup(text);
                if (!v->string_value) {
                        free(v);
                        return -ENOMEM;
                }
        }
        *ret = v;
        return 0;
}

static int argument_set(Familyd__V1__BuildRequest *req, const char *key, Familyd__V1__Value *v) {
        Familyd__V1__BuildRequest__ArgumentsEntry *e, **grown;

        for (size_t i = 0; i < req->n_arguments; i++)
                if (streq_ptr(req->arguments[i]->key, key)) {
                        familyd__v1__value__free_unpacked(req->arguments[i]->value, NULL);
                        req->arguments[i]->value = v;
                        return 0;
                }
        grown = realloc(req->arguments, (req->n_arguments + 1) * sizeof(*grown));
        if (!grown)
                goto fail;
        req->arguments = grown;
        e = malloc(sizeof(*e));
        if (!e)
                goto fail;
        familyd__v1__build_request__arguments_entry__init(e);
        e->key = strdup(key);
        if (!e->key) {
                free(e);
                goto fail;
        }
        e->value = v;
        req->arguments[req->n_arguments++] = e;
        return 0;
fail:
        familyd__v1__value__free_unpacked(v, NULL);
        return -ENOMEM;
}

static int ensure_config(Familyd__V1__BuildRequest *req) {
        if (req->config)
                return 0;
        req->config = malloc(sizeof(*req->config));
        if (!req->config)
                return -ENOMEM;
        familyd__v1__config__init(req->config);
        return 0;
}

int build_request_argument(Familyd__V1__BuildRequest *req, const char *kv) {
        _cleanup_free_ char *key = strdup(kv);
        Familyd__V1__Value *v = NULL;
        char *eq;
        int r;

        if (!key)
                return ctl_fail("parse --arg", -ENOMEM, NULL);
        eq = strchr(key, '=');
        if (!eq || eq == key)
                return ctl_usage_error("build", "--arg needs KEY=VALUE, not '%s'", kv);
        *eq = 0;
        r = value_from_text(eq + 1, &v);
        if (r >= 0)
                r = argument_set(req, key, v);
        if (r < 0)
                return ctl_fail("parse --arg", r, NULL);
        return EXIT_OK;
}

/* One parameter_dtypes entry (a later one for the same name replaces it). */
static int parameter_dtype_set(Familyd__V1__BuildRequest *req, const char *name, const char *dtype) {
        Familyd__V1__BuildRequest__ParameterDtypesEntry *e, **grown;
        char *value = strdup(dtype);

        if (!value)
                return -ENOMEM;
        for (size_t i = 0; i < req->n_parameter_dtypes; i++)
                if (streq_ptr(req->parameter_dtypes[i]->key, name)) {
                        free(req->parameter_dtypes[i]->value);
                        req->parameter_dtypes[i]->value = value;
                        return 0;
                }
        grown = realloc(req->parameter_dtypes, (req->n_parameter_dtypes + 1) * sizeof(*grown));
        if (grown)
                req->parameter_dtypes = grown;
        e = grown ? malloc(sizeof(*e)) : NULL;
        if (e) {
                familyd__v1__build_request__parameter_dtypes_entry__init(e);
                e->key = strdup(name);
                e->value = value;
        }
        if (!e || !e->key) {
                free(e);
                free(value);
                return -ENOMEM;
        }
        req->parameter_dtypes[req->n_parameter_dtypes++] = e;
        return 0;
}

int build_request_parameter_dtype(Familyd__V1__BuildRequest *req, const char *kv) {
        _cleanup_free_ char *name = strdup(kv);
        char *eq;
        int r;

        if (!name)
                return ctl_fail("parse --dtype-of", -ENOMEM, NULL);
        eq = strchr(name, '=');
        if (!eq || eq == name || isempty(eq + 1))
                return ctl_usage_error("build", "--dtype-of needs NAME=DTYPE, not '%s'", kv);
        *eq = 0;
        r = parameter_dtype_set(req, name, eq + 1);
        if (r < 0)
                return ctl_fail("parse --dtype-of", r, NULL);
        return EXIT_OK;
}

int build_request_config_field(Familyd__V1__BuildRequest *req, const char *kv) {
        const char *eq = strchr(kv, '=');
        _cleanup_free_ char *key = NULL;
        Familyd__V1__Value *v = NULL;
        int r;

        if (!eq || eq == kv)
                return ctl_usage_error("build", "expected KEY=VALUE, not '%s'", kv);
        key = strndup(kv, (size_t) (eq - kv));
        r = key ? ensure_config(req) : -ENOMEM;
        if (r >= 0)
                r = value_from_text(eq + 1, &v);
        if (r >= 0)
                r = config_set(req->config, key, v);
        if (r < 0)
                return ctl_fail("parse KEY=VALUE", r, NULL);
        return EXIT_OK;
}

int build_request_config_file(Familyd__V1__BuildRequest *req, const char *path) {
        _cleanup_(json_decrefp) json_t *doc = NULL;
        const char *key;
        json_t *value;
        int r;

        r = ctl_json_load("build", "--config ", path, &doc);
        if (r != EXIT_OK)
                return r;
        if (!json_is_object(doc))
                return ctl_usage_error("build", "--config %s: expected a JSON object of field names to values", path);

        r = ensure_config(req);
        if (r < 0)
                return ctl_fail("read --config", r, NULL);
        json_object_foreach(doc, key, value) {
                Familyd__V1__Value *v = NULL;
                const char *bad = NULL;

                r = value_from_json(value, &v, &bad);
                if (r == -EINVAL)
                        return ctl_usage_error("build", "--config %s: field '%s': %s", path, key, bad);
                if (r >= 0)
                        r = config_set(req->config, key, v);
                if (r < 0)
                        return ctl_fail("read --config", r, NULL);
        }
        return EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* --module FILE.json */

static bool key_in(const char *key, const char *const *names) {
        for (size_t i = 0; names[i]; i++)
                if (streq(key, names[i]))
                        return true;
        return false;
}

/* parameters[i]: {"name": ..., "shape": [...], "dtype": ...}, into m->parameters[i]. */
static int module_parameter(const char *path, size_t i, json_t *p, Familyd__V1__SourceModule *m) {
        static const char *const keys[] = { "name", "shape", "dtype", NULL };
        json_t *name, *shape, *dtype, *value;
        Familyd__V1__SourceParameter *sp;
        const char *key;

        if (!json_is_object(p))
                return ctl_usage_error("build", "--module %s: parameters[%zu] must be an object", path, i);
        json_object_foreach(p, key, value)
                if (!key_in(key, keys))
                        return ctl_usage_error("build", "--module %s: parameters[%zu]: unknown key '%s' (name, shape, dtype)",
                                               path, i, key);
        name = json_object_get(p, "name");
        shape = json_object_get(p, "shape");
        dtype = json_object_get(p, "dtype");
        if (!json_is_string(name))
                return ctl_usage_error("build", "--module %s: parameters[%zu] needs a string name", path, i);
        if (shape && !json_is_array(shape))
                return ctl_usage_error("build", "--module %s: parameters[%zu].shape must be a list of integers", path, i);
        if (dtype && !json_is_string(dtype))
                return ctl_usage_error("build", "--module %s: parameters[%zu].dtype must be a string", path, i);

        sp = malloc(sizeof(*sp));
        if (!sp)
                return ctl_fail("read --module", -ENOMEM, NULL);
        familyd__v1__source_parameter__init(sp);
        m->parameters[m->n_parameters++] = sp;
        sp->name = strdup(json_string_value(name));
        if (!sp->name || (dtype && !(sp->dtype = strdup(json_string_value(dtype)))))
                return ctl_fail("read --module", -ENOMEM, NULL);
        if (json_array_size(shape) > 0) {
                sp->shape = calloc(json_array_size(shape), sizeof(*sp->shape));
                if (!sp->shape)
                        return ctl_fail("read --module", -ENOMEM, NULL);
        }
        for (size_t k = 0; k < json_array_size(shape); k++) {
                if (!json_is_integer(json_array_get(shape, k)))
                        return ctl_usage_error("build", "--module %s: parameters[%zu].shape must be a list of integers",
                                               path, i);
                sp->shape[sp->n_shape++] = json_integer_value(json_array_get(shape, k));
        }
        return EXIT_OK;
}

int build_request_module_file(Familyd__V1__BuildRequest *req, const char *path) {
        static const char *const keys[] = { "fqn", "parameters", NULL };
        _cleanup_(json_decrefp) json_t *doc = NULL;
        json_t *fqn, *params, *value;
        Familyd__V1__SourceModule *m;
        const char *key;
        int r;

        r = ctl_json_load("build", "--module ", path, &doc);
        if (r != EXIT_OK)
                return r;
        if (!json_is_object(doc))
                return ctl_usage_error("build", "--module %s: expected an object {\"fqn\": ..., \"parameters\": [...]}", path);
        json_object_foreach(doc, key, value)
                if (!key_in(key, keys))
                        return ctl_usage_error("build", "--module %s: unknown key '%s' (fqn, parameters)", path, key);
        fqn = json_object_get(doc, "fqn");
        params = json_object_get(doc, "parameters");
        if (fqn && !json_is_string(fqn))
                return ctl_usage_error("build", "--module %s: fqn must be a string", path);
        if (params && !json_is_array(params))
                return ctl_usage_error("build", "--module %s: parameters must be a list", path);

        m = malloc(sizeof(*m));
        if (!m)
                return ctl_fail("read --module", -ENOMEM, NULL);
        familyd__v1__source_module__init(m);
        if (req->module)
                familyd__v1__source_module__free_unpacked(req->module, NULL);
        req->module = m;
        if (fqn && !(m->fqn = strdup(json_string_value(fqn))))
                return ctl_fail("read --module", -ENOMEM, NULL);
        if (json_array_size(params) == 0)
                return EXIT_OK;
        m->parameters = calloc(json_array_size(params), sizeof(*m->parameters));
        if (!m->parameters)
                return ctl_fail("read --module", -ENOMEM, NULL);
        for (size_t i = 0; i < json_array_size(params); i++) {
                r = module_parameter(path, i, json_array_get(params, i), m);
                if (r != EXIT_OK)
                        return r;
        }
        return EXIT_OK;
}

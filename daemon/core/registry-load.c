/* registry-load.c: registry_load: a directory of YAML files to an immutable Registry. */

/*
 * DESIGN
 *
 * Two stages per file. registry-yaml.c turns the text into a small tree of YNodes, rejecting
 * aliases, bounding nesting and node count, and keeping explicit tags and scalar styles. A schema
 * walker then fills Family structs in place, diagnosing every violation it can see and carrying
 * on with the siblings, so one Reload reports everything at once; a child's -EINVAL means
 * "diagnosed", anything else aborts.
 *
 * Diagnostics name a file by its entry name in the registry directory (the directory itself is
 * the registry path the operator configured), "name.yaml:line:column: context: text", 1-based.
 * Family.source uses the same name: "name.yaml:line". Problems with a whole file or the
 * directory have no position: "name.yaml: text".
 *
 * Scalars resolve like the YAML 1.2 core schema (see registry-yaml.c). Mapping keys are taken as
 * text. A null value is the wrong type wherever it appears.
 */

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>

#include "resource-limits.h"
#include "registry.h"
#include "registry-yaml.h"
#include "repr.h"

#define LOAD_MAX_DIAGNOSTICS    1000u    /* past this the operator has seen enough */


typedef struct Loader {
        const char *file; /* the file's entry name, for diagnostics */
        LoadDiagnostics *diag;
        bool truncated;   /* LOAD_MAX_DIAGNOSTICS reached */
} Loader;

static int loader_diag_atv(Loader *l, unsigned line, unsigned column, const char *ctx,
                           const char *format, va_list ap) _printf_(5, 0);
static int loader_diag_atv(Loader *l, unsigned line, unsigned column, const char *ctx,
                           const char *format, va_list ap) {
        _cleanup_free_ char *text = NULL;
        int k;

        if (l->diag->n >= LOAD_MAX_DIAGNOSTICS) {
                l->truncated = true;
                return -EINVAL;
        }

        k = vasprintf(&text, format, ap);
        if (k < 0) {
                text = NULL;
                return -ENOMEM;
        }

        if (ctx)
                k = load_diagnostics_add(l->diag, l->file, line, column, "%s: %s", ctx, text);
        else
                k = load_diagnostics_add(l->diag, l->file, line, column, "%s", text);
        return k < 0 ? k : -EINVAL;
}

static int loader_diag_at(Loader *l, unsigned line, unsigned column, const char *ctx,
                          const char *format, ...) _printf_(5, 6);
static int loader_diag_at(Loader *l, unsigned line, unsigned column, const char *ctx,
                          const char *format, ...) {
        va_list ap;
        int r;

        va_start(ap, format);
        r = loader_diag_atv(l, line, column, ctx, format, ap);
        va_end(ap);
        return r;
}

/* The YNodeDiagFunc for ynode_parse(): the tree builder's problems have no schema context. */
static int loader_yaml_diag(void *userdata, unsigned line, unsigned column, const char *format,
                            va_list ap) {
        return loader_diag_atv(userdata, line, column, NULL, format, ap);
}

#define loader_diag(l, node, ctx, ...) \
        loader_diag_at((l), (node)->line, (node)->column, (ctx), __VA_ARGS__)

/* The same, with one user-supplied string quoted Python-style into the single %s of format. */
static int loader_diag_q(Loader *l, const YNode *n, const char *ctx, const char *format,
                         const char *s) {
        _cleanup_free_ char *q = repr_string(s);
        if (!q)
                return -ENOMEM;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        return loader_diag(l, n, ctx, format, q);
#pragma GCC diagnostic pop
}

/* Folds a child's result into *acc: -EINVAL (diagnosed) is remembered and walking continues;
 * any other failure (-ENOMEM) is returned to abort the load. */
static int fold(int *acc, int r) {
        if (r == -EINVAL) {
                *acc = -EINVAL;
                return 0;
        }
        return r < 0 ? r : 0;
}

/* ---- scalars ---- */

/* Resolves n (any node) to a Value; collections come back as VALUE_LIST with no items, which
 * matches no scalar type. Diagnoses bad numbers. */
static int node_value(Loader *l, const YNode *n, const char *ctx, const char *what, Value *ret) {
        const char *problem = NULL;
        int r;

        if (n->kind != YNODE_SCALAR) {
                *ret = (Value) { .kind = VALUE_LIST };
                return 0;
        }
        r = ynode_scalar_resolve(n, ret, &problem);
        if (r == -EINVAL)
                return loader_diag(l, n, ctx, "%s: %s", what, problem);
        return r;
}

static const char *value_kind_noun(ValueKind k) {
        switch (k) {
        case VALUE_NONE:
                return "null";
        case VALUE_BOOL:
                return "a bool";
        case VALUE_INT:
                return "an int";
        case VALUE_FLOAT:
                return "a float";
        case VALUE_STRING:
                return "a string";
        default:
                return "a collection";
        }
}

static int load_string(Loader *l, const YNode *n, const char *ctx, const char *what,
                       size_t max_len, char **ret) {
        Value v = {};
        int r;

        r = node_value(l, n, ctx, what, &v);
        if (r < 0)
                return r;
        if (v.kind != VALUE_STRING) {
                ValueKind kind = v.kind;
                value_done(&v);
                return loader_diag(l, n, ctx, "%s must be a string, not %s", what,
                                   value_kind_noun(kind));
        }
        if (strlen(v.s) > max_len) {
                value_done(&v);
                return loader_diag(l, n, ctx, "%s is longer than %zu bytes", what, max_len);
        }

        *ret = v.s;
        return 0;
}

static bool is_identifier(const char *s) {
        if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_'))
                return false;
        for (s++; *s; s++)
                if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_' ||
                      (*s >= '0' && *s <= '9')))
                        return false;
        return true;
}

/* "a.b.C": identifiers joined by single dots. */
static bool is_dotted_path(const char *s) {
        _cleanup_free_ char *copy = strdup(s);
        char *save = NULL;

        if (!copy)
                return false;
        if (!*s || *s == '.' || s[strlen(s) - 1] == '.' || strstr(s, ".."))
                return false;
        for (char *c = strtok_r(copy, ".", &save); c; c = strtok_r(NULL, ".", &save))
                if (!is_identifier(c))
                        return false;
        return true;
}

static int load_name(Loader *l, const YNode *n, const char *ctx, const char *what, char **ret) {
        _cleanup_free_ char *s = NULL;
        int r;

        r = load_string(l, n, ctx, what, FAMILYD_MAX_NAME_LENGTH, &s);
        if (r < 0)
                return r;
        if (!*s)
                return loader_diag(l, n, ctx, "%s must not be empty", what);
        *ret = TAKE_PTR(s);
        return 0;
}

static int load_dotted_path(Loader *l, const YNode *n, const char *ctx, const char *what, char **ret) {
        _cleanup_free_ char *s = NULL;
        int r;

        r = load_name(l, n, ctx, what, &s);
        if (r < 0)
                return r;
        if (!is_dotted_path(s)) {
                _cleanup_free_ char *q = repr_string(s);
                if (!q)
                        return -ENOMEM;
                return loader_diag(l, n, ctx, "%s must be a dotted path, got %s", what, q);
        }
        *ret = TAKE_PTR(s);
        return 0;
}

/* A value of a declared type; an int where float is declared becomes a float. */
static int load_typed(Loader *l, const YNode *n, const char *ctx, const char *what, FieldType t,
                      Value *ret) {
        Value v = {};
        int r;

        r = node_value(l, n, ctx, what, &v);
        if (r < 0)
                return r;
        if (!value_matches_type(&v, t)) {
                value_done(&v);
                return loader_diag(l, n, ctx, "%s must be %s", what, field_type_to_string(t));
        }
        if (t == FIELD_TYPE_FLOAT && v.kind == VALUE_INT)
                v = (Value) { .kind = VALUE_FLOAT, .f = (double) v.i };
        if (v.kind == VALUE_STRING && strlen(v.s) > FAMILYD_MAX_STRING_VALUE_LENGTH) {
                value_done(&v);
                return loader_diag(l, n, ctx, "%s is longer than %u bytes", what,
                                   FAMILYD_MAX_STRING_VALUE_LENGTH);
        }
        *ret = v;
        return 0;
}

static int load_int(Loader *l, const YNode *n, const char *ctx, const char *what, int64_t *ret) {
        Value v = {};
        int r;

        r = node_value(l, n, ctx, what, &v);
        if (r < 0)
                return r;
        if (v.kind != VALUE_INT) {
                value_done(&v);
                return -ENOTTY; /* the caller words the complaint */
        }
        *ret = v.i;
        return 0;
}

/* ---- mappings ---- */

static int expect_kind(Loader *l, const YNode *n, const char *ctx, const char *what, YNodeKind kind) {
        if (n->kind == kind)
                return 0;
        return loader_diag(l, n, ctx, "%s must be a %s", what,
                           kind == YNODE_MAPPING ? "mapping" : "list");
}

/*
 * Matches a mapping's keys against a fixed set: values[i] gets the value of keys[i] (first
 * occurrence); unknown and repeated keys are diagnosed.
 */
static int map_fixed(Loader *l, const YNode *m, const char *ctx, const char *const *keys,
                     const YNode **values, size_t n_keys) {
        int acc = 0, r;

        for (size_t i = 0; i < ynode_n_pairs(m); i++) {
                const YNode *k = ynode_key(m, i);
                size_t j;

                if (k->kind != YNODE_SCALAR) {
                        r = fold(&acc, loader_diag(l, k, ctx, "mapping keys must be strings"));
                        if (r < 0)
                                return r;
                        continue;
                }
                for (j = 0; j < n_keys; j++)
                        if (streq(keys[j], k->text))
                                break;
                if (j >= n_keys)
                        r = loader_diag_q(l, k, ctx, "unknown key %s", k->text);
                else if (values[j])
                        r = loader_diag_q(l, k, ctx, "duplicate key %s", k->text);
                else {
                        values[j] = ynode_value(m, i);
                        r = 0;
                }
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

static int missing_key(Loader *l, const YNode *m, const char *ctx, const char *key) {
        return loader_diag_q(l, m, ctx, "missing key %s", key);
}

typedef struct Entry {
        const char *key;
        const YNode *key_node;
        const YNode *value;
        size_t index;
} Entry;

static int entry_cmp(const void *a, const void *b) {
        const Entry *x = a, *y = b;
        int c = strcmp(x->key, y->key);
        if (c != 0)
                return c;
        return x->index < y->index ? -1 : x->index > y->index;
}

static int entry_index_cmp(const void *a, const void *b) {
        const Entry *x = a, *y = b;
        return x->index < y->index ? -1 : x->index > y->index;
}

/*
 * The entries of a mapping of free names (selectors, variants, ...), in file order, without
 * repeated or non-scalar keys (diagnosed) and with non-empty, bounded names. Duplicates are
 * found by sorting, so a large mapping costs n log n, never n^2.
 */
static int map_entries(Loader *l, const YNode *m, const char *ctx, const char *what, size_t max,
                       Entry **ret, size_t *ret_n) {
        _cleanup_free_ Entry *e = NULL;
        size_t n = 0, n_pairs;
        int acc = 0, r;

        r = expect_kind(l, m, ctx, what, YNODE_MAPPING);
        if (r < 0)
                return r;
        n_pairs = ynode_n_pairs(m);
        if (n_pairs > max)
                return loader_diag(l, m, ctx, "%s has more than %zu entries", what, max);

        e = calloc(n_pairs ? n_pairs : 1, sizeof(Entry));
        if (!e)
                return -ENOMEM;

        for (size_t i = 0; i < n_pairs; i++) {
                const YNode *k = ynode_key(m, i);

                if (k->kind != YNODE_SCALAR)
                        r = loader_diag(l, k, ctx, "%s: keys must be strings", what);
                else if (!*k->text)
                        r = loader_diag(l, k, ctx, "%s: names must not be empty", what);
                else if (strlen(k->text) > FAMILYD_MAX_NAME_LENGTH)
                        r = loader_diag(l, k, ctx, "%s: names must not be longer than %u bytes",
                                        what, FAMILYD_MAX_NAME_LENGTH);
                else {
                        e[n++] = (Entry) { .key = k->text, .key_node = k,
                                           .value = ynode_value(m, i), .index = i };
                        r = 0;
                }
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }

        /* Sort by (key, index), drop every entry that equals its predecessor, restore order. */
        qsort(e, n, sizeof(Entry), entry_cmp);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
                if (kept > 0 && streq(e[kept - 1].key, e[i].key)) {
                        r = fold(&acc, loader_diag_q(l, e[i].key_node, ctx, "duplicate key %s",
                                                     e[i].key));
                        if (r < 0)
                                return r;
                        continue;
                }
                e[kept++] = e[i];
        }
        qsort(e, kept, sizeof(Entry), entry_index_cmp);

        *ret = TAKE_PTR(e);
        *ret_n = kept;
        return acc;
}

static char *ctx_push(const char *ctx, const char *kind, const char *name) {
        _cleanup_free_ char *q = repr_string(name);
        char *s;

        if (!q)
                return NULL;
        if (asprintf(&s, "%s%s%s %s", strempty(ctx), ctx ? ": " : "", kind, q) < 0)
                return NULL;
        return s;
}

/* ---- families ---- */

static const char *const family_keys[] = {
        "name", "baseline", "default_variant", "parallel_axis", "selectors", "arguments",
        "variants", "rules", "parameters",
};
enum {
        FK_NAME, FK_BASELINE, FK_DEFAULT_VARIANT, FK_PARALLEL_AXIS, FK_SELECTORS, FK_ARGUMENTS,
        FK_VARIANTS, FK_RULES, FK_PARAMETERS, _FK_MAX,
};

static int load_typed_fields(Loader *l, const Family *f, const YNode *n, const char *ctx,
                             bool selectors, TypedField **ret, size_t *ret_n) {
        static const char *const keys[] = { "type", "default" };
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc = 0, r;

        r = map_entries(l, n, ctx, selectors ? "'selectors'" : "'arguments'", FAMILYD_MAX_ARGUMENTS,
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
                fctx = ctx_push(ctx, selectors ? "selector" : "argument", e[i].key);
                if (!t->name || !fctx)
                        return -ENOMEM;

                if (selectors && streq(e[i].key, "parallel"))
                        r = loader_diag(l, e[i].key_node, ctx, "selector name 'parallel' is reserved");
                else if (!selectors && is_reserved_runtime_name(e[i].key))
                        r = loader_diag_q(l, e[i].key_node, ctx, "argument name %s is reserved",
                                          e[i].key);
                else if (!selectors && family_find_selector(f, e[i].key))
                        r = loader_diag_q(l, e[i].key_node, ctx,
                                          "%s is both a selector and an argument", e[i].key);
                else
                        r = 0;
                r = fold(&acc, r);
                if (r < 0)
                        return r;

                r = expect_kind(l, e[i].value, fctx, "the declaration", YNODE_MAPPING);
                if (r == -EINVAL) {
                        acc = r;
                        continue;
                }
                if (r < 0)
                        return r;
                r = fold(&acc, map_fixed(l, e[i].value, fctx, keys, values, ELEMENTSOF(keys)));
                if (r < 0)
                        return r;

                if (!values[0]) {
                        r = fold(&acc, missing_key(l, e[i].value, fctx, "type"));
                        if (r < 0)
                                return r;
                        continue;
                }
                _cleanup_free_ char *type = NULL;
                r = load_string(l, values[0], fctx, "'type'", FAMILYD_MAX_NAME_LENGTH, &type);
                if (r >= 0) {
                        t->type = field_type_from_string(type);
                        if (t->type < 0)
                                r = loader_diag(l, values[0], fctx,
                                                "'type' must be one of bool, int, float, string");
                }
                r = fold(&acc, r);
                if (r < 0)
                        return r;
                if (t->type < 0)
                        continue;

                if (!values[1])
                        r = selectors ? missing_key(l, e[i].value, fctx, "default") : 0;
                else
                        r = load_typed(l, values[1], fctx, "'default'", t->type, &t->default_value);
                r = fold(&acc, r);
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

                r = load_int(l, item, ctx, "'requires'", &values[j]);
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

static int load_requires(Loader *l, const YNode *n, const char *ctx, Variant *v) {
        Requirement slots[_AXIS_MAX] = {};
        bool present[_AXIS_MAX] = {};
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = map_entries(l, n, ctx, "'requires'", _AXIS_MAX * 2, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        for (size_t i = 0; i < n_e; i++) {
                Axis a = axis_from_string(e[i].key);

                if (a < 0)
                        r = loader_diag_q(l, e[i].key_node, ctx,
                                          "'requires': unknown axis %s (axes are tp, cp, ep, pp)",
                                          e[i].key);
                else {
                        r = load_requirement(l, e[i].value, ctx, a, &slots[a]);
                        present[a] = r >= 0;
                }
                r = fold(&acc, r);
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

/* "shard(d)" or "replicate". */
static int parse_placement(const char *s, PlacementKind *ret_kind, int64_t *ret_dim) {
        const char *p;
        char *end;

        if (streq(s, "replicate")) {
                *ret_kind = PLACEMENT_REPLICATE;
                *ret_dim = 0;
                return 0;
        }
        if (strncmp(s, "shard(", 6) != 0)
                return -EINVAL;
        p = s + 6;
        while (*p == ' ')
                p++;
        if (!(*p == '-' || (*p >= '0' && *p <= '9')))
                return -EINVAL;
        errno = 0;
        long long d = strtoll(p, &end, 10);
        if (errno == ERANGE || end == p)
                return -EINVAL;
        while (*end == ' ')
                end++;
        if (!streq(end, ")"))
                return -EINVAL;

        *ret_kind = PLACEMENT_SHARD;
        *ret_dim = d;
        return 0;
}

static void format_number(double v, char buf[static 32]) {
        /* The shortest of %.15g..%.17g that reads back as the same double: "0.02", not
         * "0.02000000000000000042". */
        for (int prec = 15; prec <= 17; prec++) {
                snprintf(buf, 32, "%.*g", prec, v);
                if (strtod(buf, NULL) == v)
                        return;
        }
}

static int load_init_number(Loader *l, const YNode *n, const char *ctx, const char *what,
                            InitNumber *ret) {
        Value v = {};
        int r;

        r = node_value(l, n, ctx, what, &v);
        if (r < 0)
                return r;
        switch (v.kind) {
        case VALUE_INT:
                *ret = (InitNumber) { .value = (double) v.i };
                return 0;
        case VALUE_FLOAT:
                if (!isfinite(v.f))
                        return loader_diag(l, n, ctx, "%s must be finite", what);
                *ret = (InitNumber) { .value = v.f };
                return 0;
        case VALUE_STRING:
                if (is_identifier(v.s) && strlen(v.s) <= FAMILYD_MAX_NAME_LENGTH) {
                        *ret = (InitNumber) { .field = TAKE_PTR(v.s) };
                        return 0;
                }
                break;
        default:
                break;
        }
        value_done(&v);
        return loader_diag(l, n, ctx, "%s must be a number or a config field name", what);
}

static const char *init_number_text(const InitNumber *x, char buf[static 32]) {
        if (x->field)
                return x->field;
        format_number(x->value, buf);
        return buf;
}

static int init_make_text(ParameterSpec *p) {
        char a[32], b[32];
        int k;

        switch (p->init.kind) {
        case INIT_ZEROS:
        case INIT_ONES:
                p->init_text = strdup(init_kind_to_string(p->init.kind));
                return p->init_text ? 0 : -ENOMEM;
        case INIT_CONSTANT:
                k = asprintf(&p->init_text, "constant(value=%s)", init_number_text(&p->init.a, a));
                break;
        case INIT_NORMAL:
                k = asprintf(&p->init_text, "normal(mean=%s, std=%s)", init_number_text(&p->init.a, a),
                             init_number_text(&p->init.b, b));
                break;
        case INIT_UNIFORM:
                k = asprintf(&p->init_text, "uniform(low=%s, high=%s)", init_number_text(&p->init.a, a),
                             init_number_text(&p->init.b, b));
                break;
        default:
                return -EINVAL;
        }
        if (k < 0) {
                p->init_text = NULL;
                return -ENOMEM;
        }
        return 0;
}

static int load_init(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p) {
        static const char *const kinds[] = { "constant", "normal", "uniform" };
        static const char *const constant_keys[] = { "value" };
        static const char *const normal_keys[] = { "mean", "std" };
        static const char *const uniform_keys[] = { "low", "high" };
        static const char *const *const arg_keys[] = { constant_keys, normal_keys, uniform_keys };
        static const size_t n_arg_keys[] = { 1, 2, 2 };
        static const InitKind kind_of[] = { INIT_CONSTANT, INIT_NORMAL, INIT_UNIFORM };
        static const char *const usage =
                "'init' must be zeros, ones, or one of constant: {value}, normal: {mean, std}, uniform: {low, high}";
        const YNode *values[ELEMENTSOF(kinds)] = {}, *args[2] = {}, *m = NULL;
        size_t which = 0, n_present = 0;
        int acc = 0, r;

        if (n->kind == YNODE_SCALAR) {
                _cleanup_free_ char *s = NULL;

                r = load_string(l, n, ctx, "'init'", FAMILYD_MAX_NAME_LENGTH, &s);
                if (r < 0)
                        return r;
                if (streq(s, "zeros"))
                        p->init = (InitSpec) { .kind = INIT_ZEROS };
                else if (streq(s, "ones"))
                        p->init = (InitSpec) { .kind = INIT_ONES };
                else
                        return loader_diag(l, n, ctx, "%s", usage);
                return 0;
        }
        if (n->kind != YNODE_MAPPING)
                return loader_diag(l, n, ctx, "%s", usage);

        r = map_fixed(l, n, ctx, kinds, values, ELEMENTSOF(kinds));
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(kinds); i++)
                if (values[i]) {
                        which = i;
                        n_present++;
                }
        if (n_present != 1)
                return loader_diag(l, n, ctx, "%s", usage);

        m = values[which];
        _cleanup_free_ char *ictx = NULL;
        if (asprintf(&ictx, "%s: init %s", ctx, kinds[which]) < 0)
                return -ENOMEM;
        r = expect_kind(l, m, ictx, "the init's arguments", YNODE_MAPPING);
        if (r < 0)
                return r;
        r = map_fixed(l, m, ictx, arg_keys[which], args, n_arg_keys[which]);
        if (r < 0)
                return r;

        InitSpec init = { .kind = kind_of[which] };
        for (size_t i = 0; i < n_arg_keys[which]; i++) {
                _cleanup_free_ char *what = NULL;
                InitNumber *x = i == 0 ? &init.a : &init.b;

                if (!args[i]) {
                        /* normal's mean is the one optional number; it defaults to 0. */
                        if (kind_of[which] == INIT_NORMAL && i == 0)
                                continue;
                        r = missing_key(l, m, ictx, arg_keys[which][i]);
                } else {
                        if (asprintf(&what, "'%s'", arg_keys[which][i]) < 0)
                                r = -ENOMEM;
                        else
                                r = load_init_number(l, args[i], ictx, what, x);
                }
                r = fold(&acc, r);
                if (r < 0)
                        break;
        }
        if (r < 0 || acc < 0) {
                free(init.a.field);
                free(init.b.field);
                return r < 0 ? r : acc;
        }
        p->init = init;
        return 0;
}

static int load_shape(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p) {
        int acc = 0, r;

        r = expect_kind(l, n, ctx, "'shape'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        if (n->n_items > FAMILYD_MAX_SHAPE_RANK)
                return loader_diag(l, n, ctx, "'shape' has more than %u dimensions",
                                   FAMILYD_MAX_SHAPE_RANK);

        p->shape = calloc(n->n_items ? n->n_items : 1, sizeof(Expr *));
        if (!p->shape)
                return -ENOMEM;

        for (size_t i = 0; i < n->n_items; i++) {
                const YNode *item = n->items[i];
                _cleanup_free_ char *text = NULL, *message = NULL;
                Value v = {};

                r = node_value(l, item, ctx, "'shape'", &v);
                if (r < 0) {
                        r = fold(&acc, r);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (v.kind == VALUE_INT) {
                        if (asprintf(&text, "%" PRId64, v.i) < 0)
                                return -ENOMEM;
                } else if (v.kind == VALUE_STRING)
                        text = TAKE_PTR(v.s);
                value_done(&v);
                if (!text) {
                        r = fold(&acc, loader_diag(l, item, ctx,
                                                   "'shape' entries must be integers or expressions"));
                        if (r < 0)
                                return r;
                        continue;
                }

                r = expr_parse(text, &p->shape[p->n_dims], &message);
                if (r == -EINVAL)
                        r = loader_diag(l, item, ctx, "'shape': %s", message);
                else if (r >= 0)
                        p->n_dims++;
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

static int load_placements(Loader *l, const YNode *n, const char *ctx, ParameterSpec *p,
                           bool rank_known) {
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = map_entries(l, n, ctx, "'placements'", FAMILYD_MAX_MESH_DIMS, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        p->placements = calloc(n_e ? n_e : 1, sizeof(Placement));
        if (!p->placements)
                return -ENOMEM;

        for (size_t i = 0; i < n_e; i++) {
                _cleanup_free_ char *s = NULL, *what = NULL;
                PlacementKind kind;
                int64_t dim, rank = (int64_t) p->n_dims;

                what = ctx_push(NULL, "placement", e[i].key);
                if (!what)
                        return -ENOMEM;
                r = load_string(l, e[i].value, ctx, what, FAMILYD_MAX_NAME_LENGTH, &s);
                if (r >= 0 && parse_placement(s, &kind, &dim) < 0)
                        r = loader_diag(l, e[i].value, ctx, "%s must be shard(d) or replicate", what);
                else if (r >= 0 && kind == PLACEMENT_SHARD && rank_known && (dim < -rank || dim >= rank))
                        r = loader_diag(l, e[i].value, ctx,
                                        "%s: shard(%" PRId64 ") is out of range for %" PRId64 " dimensions",
                                        what, dim, rank);
                else if (r >= 0) {
                        Placement *pl = &p->placements[p->n_placements];
                        pl->axis = strdup(e[i].key);
                        if (!pl->axis)
                                return -ENOMEM;
                        pl->kind = kind;
                        pl->dim = dim;
                        p->n_placements++;
                }
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

static int load_parameters(Loader *l, const YNode *n, const char *ctx, ParameterSpec **ret,
                           size_t *ret_n) {
        static const char *const keys[] = { "shape", "placements", "init" };
        _cleanup_free_ Entry *e = NULL;
        size_t n_e = 0;
        int acc, r;

        r = map_entries(l, n, ctx, "'parameters'", FAMILYD_MAX_LIST_VALUES, &e, &n_e);
        if (r < 0 && r != -EINVAL)
                return r;
        acc = r;

        *ret = calloc(n_e ? n_e : 1, sizeof(ParameterSpec));
        if (!*ret)
                return -ENOMEM;

        for (size_t i = 0; i < n_e; i++) {
                const YNode *values[ELEMENTSOF(keys)] = {};
                _cleanup_free_ char *pctx = NULL;
                ParameterSpec *p = &(*ret)[(*ret_n)++];
                int pacc = 0;

                p->name = strdup(e[i].key);
                pctx = ctx_push(ctx, "parameter", e[i].key);
                if (!p->name || !pctx)
                        return -ENOMEM;

                r = expect_kind(l, e[i].value, pctx, "the parameter", YNODE_MAPPING);
                if (r >= 0)
                        r = map_fixed(l, e[i].value, pctx, keys, values, ELEMENTSOF(keys));
                r = fold(&pacc, r);
                if (r < 0)
                        return r;
                if (e[i].value->kind != YNODE_MAPPING) {
                        acc = -EINVAL;
                        continue;
                }

                int shape_r = 0;
                if (!values[0])
                        shape_r = missing_key(l, e[i].value, pctx, "shape");
                else
                        shape_r = load_shape(l, values[0], pctx, p);
                r = fold(&pacc, shape_r);
                if (r < 0)
                        return r;

                if (values[1]) {
                        r = fold(&pacc, load_placements(l, values[1], pctx, p, shape_r >= 0));
                        if (r < 0)
                                return r;
                }

                p->init = (InitSpec) { .kind = INIT_ZEROS };
                if (values[2]) {
                        r = fold(&pacc, load_init(l, values[2], pctx, p));
                        if (r < 0)
                                return r;
                }
                r = init_make_text(p);
                if (r < 0)
                        return r;
                if (pacc < 0)
                        acc = pacc;
        }
        return acc;
}

static int load_accepts(Loader *l, const Family *f, const YNode *n, const char *ctx, Variant *v) {
        int acc = 0, r;

        r = expect_kind(l, n, ctx, "'accepts'", YNODE_SEQUENCE);
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

                r = load_name(l, n->items[i], ctx, "'accepts' entries", &s);
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
                r = fold(&acc, r);
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

        r = map_entries(l, n, ctx, "'variants'", FAMILYD_MAX_LIST_VALUES, &e, &n_e);
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
                vctx = ctx_push(ctx, "variant", e[i].key);
                if (!v->name || !vctx)
                        return -ENOMEM;

                r = expect_kind(l, e[i].value, vctx, "the variant", YNODE_MAPPING);
                if (r >= 0)
                        r = map_fixed(l, e[i].value, vctx, keys, values, ELEMENTSOF(keys));
                r = fold(&acc, r);
                if (r < 0)
                        return r;
                if (e[i].value->kind != YNODE_MAPPING)
                        continue;

                if (!values[0])
                        r = missing_key(l, e[i].value, vctx, "constructor");
                else
                        r = load_dotted_path(l, values[0], vctx, "'constructor'", &v->constructor);
                r = fold(&acc, r);
                if (r < 0)
                        return r;

                if (!values[1])
                        r = missing_key(l, e[i].value, vctx, "accepts");
                else
                        r = load_accepts(l, f, values[1], vctx, v);
                r = fold(&acc, r);
                if (r < 0)
                        return r;

                if (values[2]) {
                        r = fold(&acc, load_requires(l, values[2], vctx, v));
                        if (r < 0)
                                return r;
                }

                if (values[3]) {
                        v->has_parameters = true;
                        r = fold(&acc, load_parameters(l, values[3], vctx, &v->parameters,
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

        r = expect_kind(l, n, ctx, "a rule", YNODE_MAPPING);
        if (r < 0)
                return r;
        r = fold(&acc, map_fixed(l, n, ctx, keys, values, ELEMENTSOF(keys)));
        if (r < 0)
                return r;

        if (!values[0])
                r = missing_key(l, n, ctx, "when");
        else {
                r = map_entries(l, values[0], ctx, "'when'", FAMILYD_MAX_ARGUMENTS + 1, &e, &n_e);
                if (r >= 0 && n_e == 0)
                        r = loader_diag(l, values[0], ctx, "'when' must not be empty");
        }
        r = fold(&acc, r);
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

                if (!streq(e[i].key, "parallel")) {
                        sel = family_find_selector(f, e[i].key);
                        if (!sel) {
                                r = fold(&acc, loader_diag_q(l, e[i].key_node, ctx,
                                                             "'when': %s is not a declared selector (nor 'parallel')",
                                                             e[i].key));
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        if (sel->type < 0) /* already diagnosed at the selector */
                                continue;
                        t = sel->type;
                }

                what = ctx_push(NULL, "'when':", e[i].key);
                if (!what)
                        return -ENOMEM;
                r = load_typed(l, e[i].value, ctx, what, t, &v);
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
                r = fold(&acc, r);
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
                r = load_name(l, values[1], ctx, "'variant'", &rule->text);
                if (r >= 0 && !family_find_variant(f, rule->text))
                        r = loader_diag_q(l, values[1], ctx, "'variant': %s is not a variant of this family",
                                          rule->text);
        } else {
                r = load_string(l, values[which], ctx, which == 2 ? "'error'" : "'unsupported'",
                                FAMILYD_MAX_STRING_VALUE_LENGTH, &rule->text);
                if (r >= 0 && !*rule->text)
                        r = loader_diag(l, values[which], ctx, "'%s' must not be empty", keys[which]);
        }
        r = fold(&acc, r);
        if (r < 0)
                return r;
        return acc;
}

static int load_rules(Loader *l, Family *f, const YNode *n, const char *ctx) {
        int acc = 0, r;

        r = expect_kind(l, n, ctx, "'rules'", YNODE_SEQUENCE);
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
                r = fold(&acc, load_rule(l, f, n->items[i], rctx, &f->rules[f->n_rules++]));
                if (r < 0)
                        return r;
        }
        return acc;
}

/* Fills *f (zeroed by the caller, parallel_axis _AXIS_INVALID) from one family mapping. */
static int load_family(Loader *l, const YNode *n, Family *f, unsigned *ret_baseline_line,
                       unsigned *ret_baseline_column) {
        const YNode *v[_FK_MAX] = {};
        _cleanup_free_ char *ctx = NULL;
        int acc = 0, r;

        if (asprintf(&f->source, "%s:%u", l->file, n->line) < 0) {
                f->source = NULL;
                return -ENOMEM;
        }

        r = expect_kind(l, n, NULL, "a family", YNODE_MAPPING);
        if (r < 0)
                return r;

        /* The name first, so that every later diagnostic can say whose it is. */
        for (size_t i = 0; i < ynode_n_pairs(n); i++) {
                const YNode *k = ynode_key(n, i);
                if (k->kind == YNODE_SCALAR && streq(k->text, "name")) {
                        if (load_name(l, ynode_value(n, i), "family", "'name'", &f->name) == -ENOMEM)
                                return -ENOMEM;
                        break;
                }
        }
        ctx = f->name ? ctx_push(NULL, "family", f->name) : strdup("family");
        if (!ctx)
                return -ENOMEM;

        r = fold(&acc, map_fixed(l, n, ctx, family_keys, v, _FK_MAX));
        if (r < 0)
                return r;

        if (!v[FK_NAME])
                r = missing_key(l, n, ctx, "name");
        else if (!f->name)
                r = -EINVAL; /* diagnosed above */
        else
                r = 0;
        r = fold(&acc, r);
        if (r < 0)
                return r;

        if (!v[FK_BASELINE])
                r = missing_key(l, n, ctx, "baseline");
        else {
                r = load_dotted_path(l, v[FK_BASELINE], ctx, "'baseline'", &f->baseline);
                *ret_baseline_line = v[FK_BASELINE]->line;
                *ret_baseline_column = v[FK_BASELINE]->column;
        }
        r = fold(&acc, r);
        if (r < 0)
                return r;

        if (v[FK_SELECTORS]) {
                r = fold(&acc, load_typed_fields(l, f, v[FK_SELECTORS], ctx, true, &f->selectors,
                                                 &f->n_selectors));
                if (r < 0)
                        return r;
        }
        if (v[FK_ARGUMENTS]) {
                r = fold(&acc, load_typed_fields(l, f, v[FK_ARGUMENTS], ctx, false, &f->arguments,
                                                 &f->n_arguments));
                if (r < 0)
                        return r;
        }
        if (f->n_selectors + f->n_arguments > FAMILYD_MAX_ARGUMENTS) {
                r = fold(&acc, loader_diag(l, n, ctx, "more than %u selectors and arguments",
                                           FAMILYD_MAX_ARGUMENTS));
                if (r < 0)
                        return r;
        }

        if (!v[FK_VARIANTS])
                r = missing_key(l, n, ctx, "variants");
        else
                r = load_variants(l, f, v[FK_VARIANTS], ctx);
        r = fold(&acc, r);
        if (r < 0)
                return r;

        if (v[FK_DEFAULT_VARIANT]) {
                r = load_name(l, v[FK_DEFAULT_VARIANT], ctx, "'default_variant'", &f->default_variant);
                if (r >= 0 && v[FK_VARIANTS] && !family_find_variant(f, f->default_variant))
                        r = loader_diag_q(l, v[FK_DEFAULT_VARIANT], ctx,
                                          "'default_variant': %s is not a variant of this family",
                                          f->default_variant);
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }

        if (v[FK_PARALLEL_AXIS]) {
                _cleanup_free_ char *axis = NULL;

                r = load_string(l, v[FK_PARALLEL_AXIS], ctx, "'parallel_axis'", FAMILYD_MAX_NAME_LENGTH,
                                &axis);
                if (r >= 0) {
                        f->parallel_axis = axis_from_string(axis);
                        if (f->parallel_axis < 0)
                                r = loader_diag(l, v[FK_PARALLEL_AXIS], ctx,
                                                "'parallel_axis' must be one of tp, cp, ep, pp");
                }
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }

        if (v[FK_RULES]) {
                r = fold(&acc, load_rules(l, f, v[FK_RULES], ctx));
                if (r < 0)
                        return r;
        }

        if (v[FK_PARAMETERS]) {
                r = fold(&acc, load_parameters(l, v[FK_PARAMETERS], ctx, &f->parameters,
                                               &f->n_parameters));
                if (r < 0)
                        return r;
        }

        return acc;
}

/* ---- files and the directory ---- */

typedef struct FamilyList {
        Family *families;
        size_t n;
        size_t allocated;
        /* Where each family's baseline stands, for the cross-file uniqueness check. */
        struct BaselinePos {
                const char *file;
                unsigned line, column;
        } *pos;
        size_t allocated_pos;
} FamilyList;

static void family_list_done(FamilyList *fl) {
        for (size_t i = 0; i < fl->n; i++)
                family_done(&fl->families[i]);
        free(fl->families);
        free(fl->pos);
        *fl = (FamilyList) {};
}

static int load_one_family(Loader *l, const YNode *n, FamilyList *fl) {
        unsigned line = 0, column = 0;
        int r;

        if (fl->n >= FAMILYD_MAX_FAMILIES)
                return loader_diag(l, n, NULL, "more than %u families in the registry",
                                   FAMILYD_MAX_FAMILIES);
        if (!GREEDY_REALLOC(fl->families, fl->allocated, fl->n + 1) ||
            !GREEDY_REALLOC(fl->pos, fl->allocated_pos, fl->n + 1))
                return -ENOMEM;

        Family *f = &fl->families[fl->n];
        *f = (Family) { .parallel_axis = _AXIS_INVALID };
        fl->n++; /* owned by the list from here on, even half-filled */

        r = load_family(l, n, f, &line, &column);
        fl->pos[fl->n - 1] = (struct BaselinePos) { .file = l->file, .line = line, .column = column };
        return r;
}

static int load_tree(Loader *l, const YNode *root, FamilyList *fl) {
        static const char *const list_keys[] = { "families" };
        const YNode *list = NULL;
        bool is_list = false;
        int acc = 0, r;

        if (!root)
                return 0; /* no document: a file of comments holds no family */

        if (root->kind != YNODE_MAPPING)
                return loader_diag(l, root, NULL,
                                   "a registry file holds one family (a mapping) or 'families:' with a list");

        for (size_t i = 0; i < ynode_n_pairs(root); i++) {
                const YNode *k = ynode_key(root, i);
                if (k->kind == YNODE_SCALAR && streq(k->text, "families"))
                        is_list = true;
        }
        if (!is_list)
                return load_one_family(l, root, fl);

        r = fold(&acc, map_fixed(l, root, NULL, list_keys, &list, 1));
        if (r < 0)
                return r;
        r = expect_kind(l, list, NULL, "'families'", YNODE_SEQUENCE);
        if (r < 0)
                return r;
        for (size_t i = 0; i < list->n_items; i++) {
                r = fold(&acc, load_one_family(l, list->items[i], fl));
                if (r < 0)
                        return r;
                if (l->truncated || fl->n >= FAMILYD_MAX_FAMILIES)
                        break;
        }
        return acc;
}

static int read_file(Loader *l, int dir_fd, const char *name, char **ret, size_t *ret_size) {
        _cleanup_close_ int fd = -1;
        _cleanup_free_ char *buf = NULL;
        size_t size = 0, allocated = 0;
        struct stat st;

        /* O_NONBLOCK: a FIFO named *.yaml must not hang the load; regular files ignore it. */
        fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return loader_diag_at(l, 0, 0, NULL, "not a regular file");
        if (st.st_size > (off_t) FAMILYD_MAX_REGISTRY_FILE_BYTES)
                return loader_diag_at(l, 0, 0, NULL, "file is larger than %u bytes",
                                      FAMILYD_MAX_REGISTRY_FILE_BYTES);

        /* Sized by fstat(), but read to the end and up to one byte past the limit: the file may
         * change between fstat() and read(). One byte is always kept for the NUL. */
        if (!GREEDY_REALLOC(buf, allocated, (size_t) st.st_size + 2))
                return -ENOMEM;
        while (size <= FAMILYD_MAX_REGISTRY_FILE_BYTES) {
                size_t room;
                ssize_t k;

                if (size + 1 >= allocated && !GREEDY_REALLOC(buf, allocated, size + 4096))
                        return -ENOMEM;
                room = allocated - size - 1;
                if (room > FAMILYD_MAX_REGISTRY_FILE_BYTES + 1 - size)
                        room = FAMILYD_MAX_REGISTRY_FILE_BYTES + 1 - size;
                k = read(fd, buf + size, room);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                size += (size_t) k;
        }
        if (size > FAMILYD_MAX_REGISTRY_FILE_BYTES)
                return loader_diag_at(l, 0, 0, NULL, "file is larger than %u bytes",
                                      FAMILYD_MAX_REGISTRY_FILE_BYTES);
        buf[size] = 0;

        *ret = TAKE_PTR(buf);
        *ret_size = size;
        return 0;
}

static bool is_registry_file(const char *name) {
        size_t n = strlen(name);

        if (name[0] == '.')
                return false;
        return (n > 5 && streq(name + n - 5, ".yaml")) || (n > 4 && streq(name + n - 4, ".yml"));
}

static int name_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

typedef struct NameList {
        char **names;
        size_t n;
        size_t allocated;
} NameList;

static void name_list_done(NameList *nl) {
        for (size_t i = 0; i < nl->n; i++)
                free(nl->names[i]);
        free(nl->names);
        *nl = (NameList) {};
}

static void closedirp(DIR **d) {
        if (*d)
                (void) closedir(*d);
}

static int list_directory(DIR *d, NameList *ret) {
        _cleanup_(name_list_done) NameList nl = {};

        for (;;) {
                struct dirent *de;

                errno = 0;
                de = readdir(d);
                if (!de) {
                        if (errno != 0)
                                return -errno;
                        break;
                }
                if (!is_registry_file(de->d_name))
                        continue;
                if (nl.n >= FAMILYD_MAX_REGISTRY_FILES)
                        return -E2BIG;
                if (!GREEDY_REALLOC(nl.names, nl.allocated, nl.n + 1))
                        return -ENOMEM;
                nl.names[nl.n] = strdup(de->d_name);
                if (!nl.names[nl.n])
                        return -ENOMEM;
                nl.n++;
        }

        /* Byte order of names, independent of the locale (not alphasort/strcoll). */
        if (nl.n > 1)
                qsort(nl.names, nl.n, sizeof(char *), name_cmp);
        *ret = nl;
        nl = (NameList) {};
        return 0;
}

static int baseline_index_cmp(const void *a, const void *b, void *userdata) {
        const Family *families = userdata;
        size_t x = *(const size_t *) a, y = *(const size_t *) b;
        int c = strcmp(families[x].baseline, families[y].baseline);
        if (c != 0)
                return c;
        return x < y ? -1 : x > y;
}

/* Every baseline once across the registry; the later registration is the one reported. */
static int check_baselines(LoadDiagnostics *diag, const FamilyList *fl, bool *truncated) {
        _cleanup_free_ size_t *idx = NULL;
        size_t n = 0;
        int acc = 0;

        idx = calloc(fl->n ? fl->n : 1, sizeof(size_t));
        if (!idx)
                return -ENOMEM;
        for (size_t i = 0; i < fl->n; i++)
                if (fl->families[i].baseline)
                        idx[n++] = i;
        qsort_r(idx, n, sizeof(size_t), baseline_index_cmp, fl->families);

        size_t first = 0;
        for (size_t i = 1; i < n; i++) {
                const Family *a = &fl->families[idx[first]], *b = &fl->families[idx[i]];
                const struct BaselinePos *pos = &fl->pos[idx[i]];
                Loader l = { .file = pos->file, .diag = diag };
                _cleanup_free_ char *ctx = NULL, *q = NULL;
                int r;

                if (!streq(a->baseline, b->baseline)) {
                        first = i;
                        continue;
                }
                ctx = b->name ? ctx_push(NULL, "family", b->name) : strdup("family");
                q = repr_string(b->baseline);
                if (!ctx || !q)
                        return -ENOMEM;
                r = loader_diag_at(&l, pos->line, pos->column, ctx,
                                   "baseline %s is already registered (family at %s)", q, a->source);
                if (l.truncated)
                        *truncated = true;
                r = fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

int registry_load(const char *dir, uint64_t generation, Registry **ret, LoadDiagnostics *ret_diag) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(family_list_done) FamilyList fl = {};
        _cleanup_(name_list_done) NameList names = {};
        _cleanup_(closedirp) DIR *d = NULL;
        bool truncated = false;
        int r = 0, failure = 0;

        if (!dir || !ret)
                return -EINVAL;

        d = opendir(dir);
        if (!d) {
                r = -errno;
                if (load_diagnostics_add(&diag, dir, 0, 0, "cannot open the registry directory: %m") < 0)
                        return -ENOMEM;
                goto finish;
        }
        r = list_directory(d, &names);
        if (r == -ENOMEM)
                return r;
        if (r == -E2BIG) {
                if (load_diagnostics_add(&diag, dir, 0, 0, "more than %u registry files",
                                         FAMILYD_MAX_REGISTRY_FILES) < 0)
                        return -ENOMEM;
                goto finish;
        }
        if (r < 0) {
                errno = -r;
                if (load_diagnostics_add(&diag, dir, 0, 0, "cannot read the registry directory: %m") < 0)
                        return -ENOMEM;
                goto finish;
        }

        for (size_t i = 0; i < names.n && !truncated; i++) {
                _cleanup_(ynode_freep) YNode *root = NULL;
                _cleanup_free_ char *buf = NULL;
                Loader l = { .file = names.names[i], .diag = &diag };
                size_t size = 0;

                r = read_file(&l, dirfd(d), names.names[i], &buf, &size);
                if (r >= 0)
                        r = ynode_parse(buf, size, loader_yaml_diag, &l, &root);
                if (r >= 0)
                        r = load_tree(&l, root, &fl);
                truncated = l.truncated;

                if (r == -ENOMEM)
                        return r;
                if (r < 0 && r != -EINVAL) {
                        /* A file that cannot be read is a diagnostic, and its errno the result. */
                        errno = -r;
                        if (load_diagnostics_add(&diag, names.names[i], 0, 0, "cannot read the file: %m") < 0)
                                return -ENOMEM;
                        if (failure == 0)
                                failure = r;
                }
        }

        if (!truncated) {
                r = check_baselines(&diag, &fl, &truncated);
                if (r == -ENOMEM)
                        return r;
        }
        if (truncated &&
            load_diagnostics_add(&diag, dir, 0, 0, "more than %u problems, stopped",
                                 LOAD_MAX_DIAGNOSTICS) < 0)
                return -ENOMEM;

finish:
        if (diag.n > 0) {
                if (ret_diag) {
                        load_diagnostics_done(ret_diag);
                        *ret_diag = diag;
                        diag = (LoadDiagnostics) {};
                }
                if (failure < 0)
                        return failure;
                return r < 0 && r != -EINVAL ? r : -EINVAL;
        }

        Registry *reg;
        r = registry_new(dir, generation, fl.families, fl.n, &reg);
        if (r < 0)
                return r;
        free(fl.pos);
        fl = (FamilyList) {};
        *ret = reg;
        return 0;
}

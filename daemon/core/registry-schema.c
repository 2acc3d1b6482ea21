/* registry-schema.c: the loader's diagnostics and its scalar and mapping primitives. */

#include <stdio.h>

#include "resource-limits.h"
#include "registry-load.h"
#include "repr.h"

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

int loader_diag_at(Loader *l, unsigned line, unsigned column, const char *ctx,
                   const char *format, ...) {
        va_list ap;
        int r;

        va_start(ap, format);
        r = loader_diag_atv(l, line, column, ctx, format, ap);
        va_end(ap);
        return r;
}

int loader_yaml_diag(void *userdata, unsigned line, unsigned column, const char *format,
                     va_list ap) {
        return loader_diag_atv(userdata, line, column, NULL, format, ap);
}

int loader_diag_q(Loader *l, const YNode *n, const char *ctx, const char *format,
                  const char *s) {
        _cleanup_free_ char *q = repr_string(s);
        if (!q)
                return -ENOMEM;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        return loader_diag(l, n, ctx, format, q);
#pragma GCC diagnostic pop
}

int loader_fold(int *acc, int r) {
        if (r == -EINVAL) {
                *acc = -EINVAL;
                return 0;
        }
        return r < 0 ? r : 0;
}

/* ---- scalars ---- */

int loader_node_value(Loader *l, const YNode *n, const char *ctx, const char *what, Value *ret) {
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

int loader_string(Loader *l, const YNode *n, const char *ctx, const char *what,
                size_t max_len, char **ret) {
        Value v = {};
        int r;

        r = loader_node_value(l, n, ctx, what, &v);
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

bool loader_is_identifier(const char *s) {
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
                if (!loader_is_identifier(c))
                        return false;
        return true;
}

int loader_name(Loader *l, const YNode *n, const char *ctx, const char *what, char **ret) {
        _cleanup_free_ char *s = NULL;
        int r;

        r = loader_string(l, n, ctx, what, FAMILYD_MAX_NAME_LENGTH, &s);
        if (r < 0)
                return r;
        if (!*s)
                return loader_diag(l, n, ctx, "%s must not be empty", what);
        *ret = TAKE_PTR(s);
        return 0;
}

int loader_dotted_path(Loader *l, const YNode *n, const char *ctx, const char *what, char **ret) {
        _cleanup_free_ char *s = NULL;
        int r;

        r = loader_name(l, n, ctx, what, &s);
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

int loader_typed(Loader *l, const YNode *n, const char *ctx, const char *what, FieldType t,
               Value *ret) {
        Value v = {};
        int r;

        r = loader_node_value(l, n, ctx, what, &v);
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

int loader_int(Loader *l, const YNode *n, const char *ctx, const char *what, int64_t *ret) {
        Value v = {};
        int r;

        r = loader_node_value(l, n, ctx, what, &v);
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

int loader_expect_kind(Loader *l, const YNode *n, const char *ctx, const char *what, YNodeKind kind) {
        if (n->kind == kind)
                return 0;
        return loader_diag(l, n, ctx, "%s must be a %s", what,
                           kind == YNODE_MAPPING ? "mapping" : "list");
}

int loader_map_fixed(Loader *l, const YNode *m, const char *ctx, const char *const *keys,
              const YNode **values, size_t n_keys) {
        int acc = 0, r;

        for (size_t i = 0; i < ynode_n_pairs(m); i++) {
                const YNode *k = ynode_key(m, i);
                size_t j;

                if (k->kind != YNODE_SCALAR) {
                        r = loader_fold(&acc, loader_diag(l, k, ctx, "mapping keys must be strings"));
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
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }
        return acc;
}

int loader_missing_key(Loader *l, const YNode *m, const char *ctx, const char *key) {
        return loader_diag_q(l, m, ctx, "missing key %s", key);
}

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

int loader_map_entries(Loader *l, const YNode *m, const char *ctx, const char *what, size_t max,
                Entry **ret, size_t *ret_n) {
        _cleanup_free_ Entry *e = NULL;
        size_t n = 0, n_pairs;
        int acc = 0, r;

        r = loader_expect_kind(l, m, ctx, what, YNODE_MAPPING);
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
                r = loader_fold(&acc, r);
                if (r < 0)
                        return r;
        }

        /* Sort by (key, index), drop every entry that equals its predecessor, restore order. */
        qsort(e, n, sizeof(Entry), entry_cmp);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
                if (kept > 0 && streq(e[kept - 1].key, e[i].key)) {
                        r = loader_fold(&acc, loader_diag_q(l, e[i].key_node, ctx, "duplicate key %s",
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

char *loader_ctx_push(const char *ctx, const char *kind, const char *name) {
        _cleanup_free_ char *q = repr_string(name);
        char *s;

        if (!q)
                return NULL;
        if (asprintf(&s, "%s%s%s %s", strempty(ctx), ctx ? ": " : "", kind, q) < 0)
                return NULL;
        return s;
}

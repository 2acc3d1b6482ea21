/* value.c: typed values and ordered value maps. */
#include <stdlib.h>

#include "value.h"

static const char *const field_type_table[_FIELD_TYPE_MAX] = {
        [FIELD_TYPE_BOOL] = "bool",
        [FIELD_TYPE_INT] = "int",
        [FIELD_TYPE_FLOAT] = "float",
        [FIELD_TYPE_STRING] = "string",
};

const char *field_type_to_string(FieldType t) {
        if (t < 0 || t >= _FIELD_TYPE_MAX)
                return NULL;
        return field_type_table[t];
}

FieldType field_type_from_string(const char *s) {
        if (!s)
                return _FIELD_TYPE_INVALID;
        for (FieldType t = 0; t < _FIELD_TYPE_MAX; t++)
                if (streq(field_type_table[t], s))
                        return t;
        return _FIELD_TYPE_INVALID;
}

bool value_matches_type(const Value *v, FieldType t) {
        switch (t) {
        case FIELD_TYPE_BOOL:
                return v->kind == VALUE_BOOL;
        case FIELD_TYPE_INT:
                return v->kind == VALUE_INT;
        case FIELD_TYPE_FLOAT:
                return v->kind == VALUE_FLOAT || v->kind == VALUE_INT;
        case FIELD_TYPE_STRING:
                return v->kind == VALUE_STRING;
        default:
                return false;
        }
}

void value_done(Value *v) {
        if (!v)
                return;
        switch (v->kind) {
        case VALUE_STRING:
                free(v->s);
                break;
        case VALUE_LIST:
                for (size_t i = 0; i < v->list.n; i++)
                        value_done(&v->list.items[i]);
                free(v->list.items);
                break;
        default:
                break;
        }
        *v = (Value) { .kind = VALUE_NONE };
}

int value_copy(const Value *src, Value *ret) {
        Value v = *src;

        switch (src->kind) {
        case VALUE_STRING:
                v.s = strdup(src->s);
                if (!v.s)
                        return -ENOMEM;
                break;
        case VALUE_LIST:
                v.list.items = NULL;
                v.list.n = 0;
                if (src->list.n > 0) {
                        v.list.items = calloc(src->list.n, sizeof(Value));
                        if (!v.list.items)
                                return -ENOMEM;
                }
                for (size_t i = 0; i < src->list.n; i++) {
                        int r = value_copy(&src->list.items[i], &v.list.items[i]);
                        if (r < 0) {
                                value_done(&v);
                                return r;
                        }
                        v.list.n++;
                }
                break;
        default:
                break;
        }

        *ret = v;
        return 0;
}

bool value_equal(const Value *a, const Value *b) {
        if (a->kind != b->kind)
                return false;
        switch (a->kind) {
        case VALUE_NONE:
                return true;
        case VALUE_BOOL:
                return a->b == b->b;
        case VALUE_INT:
                return a->i == b->i;
        case VALUE_FLOAT:
                return a->f == b->f;
        case VALUE_STRING:
                return streq(a->s, b->s);
        case VALUE_LIST:
                if (a->list.n != b->list.n)
                        return false;
                for (size_t i = 0; i < a->list.n; i++)
                        if (!value_equal(&a->list.items[i], &b->list.items[i]))
                                return false;
                return true;
        default:
                return false;
        }
}

void value_map_done(ValueMap *m) {
        if (!m)
                return;
        for (size_t i = 0; i < m->n; i++) {
                free(m->items[i].name);
                value_done(&m->items[i].value);
        }
        free(m->items);
        *m = (ValueMap) {};
}

const Value *value_map_get(const ValueMap *m, const char *name) {
        for (size_t i = 0; i < m->n; i++)
                if (streq(m->items[i].name, name))
                        return &m->items[i].value;
        return NULL;
}

int value_map_put(ValueMap *m, const char *name, Value *value) {
        for (size_t i = 0; i < m->n; i++)
                if (streq(m->items[i].name, name)) {
                        value_done(&m->items[i].value);
                        m->items[i].value = *value;
                        *value = (Value) { .kind = VALUE_NONE };
                        return 0;
                }

        if (!GREEDY_REALLOC(m->items, m->allocated, m->n + 1))
                return -ENOMEM;
        char *n = strdup(name);
        if (!n)
                return -ENOMEM;
        m->items[m->n++] = (NamedValue) { .name = n, .value = *value };
        *value = (Value) { .kind = VALUE_NONE };
        return 0;
}

int value_map_copy(const ValueMap *src, ValueMap *ret) {
        _cleanup_(value_map_done) ValueMap m = {};

        for (size_t i = 0; i < src->n; i++) {
                Value v;
                int r = value_copy(&src->items[i].value, &v);
                if (r < 0)
                        return r;
                r = value_map_put(&m, src->items[i].name, &v);
                if (r < 0) {
                        value_done(&v);
                        return r;
                }
        }

        *ret = m;
        m = (ValueMap) {};
        return 0;
}

static int named_value_cmp(const void *a, const void *b) {
        return strcmp(((const NamedValue *) a)->name, ((const NamedValue *) b)->name);
}

void value_map_sort(ValueMap *m) {
        if (m->n > 1)
                qsort(m->items, m->n, sizeof(NamedValue), named_value_cmp);
}

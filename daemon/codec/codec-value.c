/* codec-value.c: familyd.v1.Value and map<string, Value> to core Values and back. */
#include <stddef.h>

#include "codec.h"
#include "core/resource-limits.h"

_Static_assert(offsetof(CodecValueEntry, key) == offsetof(Familyd__V1__ResolveRequest__ArgumentsEntry, key),
               "map entry layout");
_Static_assert(offsetof(CodecValueEntry, value) == offsetof(Familyd__V1__ResolveRequest__ArgumentsEntry, value),
               "map entry layout");
_Static_assert(offsetof(CodecValueEntry, value) == offsetof(Familyd__V1__Config__FieldsEntry, value),
               "map entry layout");
_Static_assert(offsetof(CodecValueEntry, value) == offsetof(Familyd__V1__Rule__WhenEntry, value),
               "map entry layout");

static int value_limit_error(FamilyError *e, const char *what) {
        return family_error_set(e, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT", NULL, "%s", what);
}

static int value_decode(const Familyd__V1__Value *pb, unsigned depth, Value *ret,
                        FamilyError *ret_error) {
        Value v = { .kind = VALUE_NONE };

        if (depth > FAMILYD_MAX_VALUE_DEPTH)
                return value_limit_error(ret_error, "values nest deeper than the limit");

        switch (pb ? pb->kind_case : FAMILYD__V1__VALUE__KIND__NOT_SET) {
        case FAMILYD__V1__VALUE__KIND_BOOL_VALUE:
                v = (Value) { .kind = VALUE_BOOL, .b = pb->bool_value };
                break;
        case FAMILYD__V1__VALUE__KIND_INT_VALUE:
                v = (Value) { .kind = VALUE_INT, .i = pb->int_value };
                break;
        case FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE:
                v = (Value) { .kind = VALUE_FLOAT, .f = pb->double_value };
                break;
        case FAMILYD__V1__VALUE__KIND_STRING_VALUE:
                if (strlen(pb->string_value) > FAMILYD_MAX_STRING_VALUE_LENGTH)
                        return value_limit_error(ret_error, "a string value is longer than the limit");
                v.s = strdup(pb->string_value);
                if (!v.s)
                        return -ENOMEM;
                v.kind = VALUE_STRING;
                break;
        case FAMILYD__V1__VALUE__KIND_LIST_VALUE: {
                const Familyd__V1__ValueList *l = pb->list_value;
                size_t n = l ? l->n_values : 0;

                if (n > FAMILYD_MAX_LIST_VALUES)
                        return value_limit_error(ret_error, "a list value is longer than the limit");
                v.kind = VALUE_LIST;
                if (n > 0) {
                        v.list.items = calloc(n, sizeof(Value));
                        if (!v.list.items)
                                return -ENOMEM;
                }
                for (size_t i = 0; i < n; i++) {
                        int r = value_decode(l->values[i], depth + 1, &v.list.items[i], ret_error);
                        if (r < 0) {
                                value_done(&v);
                                return r;
                        }
                        v.list.n++;
                }
                break;
        }
        default:
                /* A value with no kind set matches nothing; keep it as such. */
                break;
        }

        *ret = v;
        return 0;
}

int codec_value_decode(const Familyd__V1__Value *pb, Value *ret, FamilyError *ret_error) {
        return value_decode(pb, 0, ret, ret_error);
}

int codec_value_encode(Arena *a, const Value *v, Familyd__V1__Value **ret) {
        Familyd__V1__Value *pb = MSG_NEW(a, Familyd__V1__Value, familyd__v1__value__init);
        if (!pb)
                return -ENOMEM;

        switch (v->kind) {
        case VALUE_BOOL:
                pb->kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
                pb->bool_value = v->b;
                break;
        case VALUE_INT:
                pb->kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
                pb->int_value = v->i;
                break;
        case VALUE_FLOAT:
                pb->kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                pb->double_value = v->f;
                break;
        case VALUE_STRING:
                pb->kind_case = FAMILYD__V1__VALUE__KIND_STRING_VALUE;
                pb->string_value = arena_strdup(a, v->s);
                if (!pb->string_value)
                        return -ENOMEM;
                break;
        case VALUE_LIST: {
                Familyd__V1__ValueList *l = MSG_NEW(a, Familyd__V1__ValueList,
                                                    familyd__v1__value_list__init);
                if (!l || !ARRAY_NEW(a, l->values, v->list.n))
                        return -ENOMEM;
                pb->kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
                pb->list_value = l;
                for (size_t i = 0; i < v->list.n; i++) {
                        int r = codec_value_encode(a, &v->list.items[i], &l->values[i]);
                        if (r < 0)
                                return r;
                }
                l->n_values = v->list.n;
                break;
        }
        default:
                break;
        }

        *ret = pb;
        return 0;
}

int codec_value_map_decode(void *const *entries, size_t n, const char *what, ValueMap *ret,
                           FamilyError *ret_error) {
        _cleanup_(value_map_done) ValueMap m = {};

        if (n > FAMILYD_MAX_ARGUMENTS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT", what,
                                        "%s has more than %u entries", what,
                                        FAMILYD_MAX_ARGUMENTS);

        for (size_t i = 0; i < n; i++) {
                const CodecValueEntry *e = entries[i];
                Value v;
                int r;

                if (strlen(e->key) > FAMILYD_MAX_NAME_LENGTH)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                                what, "%s: a key is longer than %u bytes", what,
                                                FAMILYD_MAX_NAME_LENGTH);

                r = codec_value_decode(e->value, &v, ret_error);
                if (r < 0)
                        return r;
                r = value_map_put(&m, e->key, &v);
                if (r < 0) {
                        value_done(&v);
                        return r;
                }
        }

        *ret = m;
        m = (ValueMap) {};
        return 0;
}

int codec_value_map_encode(Arena *a, const ValueMap *m,
                           const ProtobufCMessageDescriptor *entry_desc, void ***ret_entries,
                           size_t *ret_n) {
        void **entries = NULL;

        if (!ARRAY_NEW(a, entries, m->n))
                return -ENOMEM;
        for (size_t i = 0; i < m->n; i++) {
                CodecValueEntry *e = arena_alloc(a, entry_desc->sizeof_message);
                if (!e)
                        return -ENOMEM;
                protobuf_c_message_init(entry_desc, e);
                e->key = arena_strdup(a, m->items[i].name);
                if (!e->key)
                        return -ENOMEM;
                int r = codec_value_encode(a, &m->items[i].value, &e->value);
                if (r < 0)
                        return r;
                entries[i] = e;
        }

        *ret_entries = entries;
        *ret_n = m->n;
        return 0;
}

int codec_check_length(const char *s, size_t max, const char *field, FamilyError *ret_error) {
        if (strnlen(s, max + 1) <= max)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT", field,
                                "%s is longer than %zu bytes", field, max);
}

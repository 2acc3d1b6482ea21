/* value.h: typed values (bool, int, float, string, list) and ordered name->value maps. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

typedef enum ValueKind {
        VALUE_NONE, /* no kind set: matches no declared type */
        VALUE_BOOL,
        VALUE_INT,
        VALUE_FLOAT,
        VALUE_STRING,
        VALUE_LIST,
        _VALUE_KIND_MAX,
        _VALUE_KIND_INVALID = -EINVAL,
} ValueKind;

typedef struct Value Value;
struct Value {
        ValueKind kind;
        union {
                bool b;
                int64_t i;
                double f;
                char *s;
                struct {
                        Value *items;
                        size_t n;
                } list;
        };
};

/* The declared type of a selector or argument. */
typedef enum FieldType {
        FIELD_TYPE_BOOL,
        FIELD_TYPE_INT,
        FIELD_TYPE_FLOAT,
        FIELD_TYPE_STRING,
        _FIELD_TYPE_MAX,
        _FIELD_TYPE_INVALID = -EINVAL,
} FieldType;

const char *field_type_to_string(FieldType t); /* "bool", "int", "float", "string" */
FieldType field_type_from_string(const char *s);

/* An int is not a bool, a bool is not an int, an int is accepted where float is declared. */
bool value_matches_type(const Value *v, FieldType t);

/* Deep copy; 0 or -ENOMEM. */
int value_copy(const Value *src, Value *ret);
/* Releases what v owns and sets it to VALUE_NONE. */
void value_done(Value *v);
/* Deep equality; an int and a float never compare equal. */
bool value_equal(const Value *a, const Value *b);

/* An ordered map of names to values, names unique. */
typedef struct NamedValue {
        char *name;
        Value value;
} NamedValue;

typedef struct ValueMap {
        NamedValue *items;
        size_t n;
        size_t allocated;
} ValueMap;

void value_map_done(ValueMap *m);
int value_map_copy(const ValueMap *src, ValueMap *ret);
const Value *value_map_get(const ValueMap *m, const char *name);
/* Inserts or replaces (a key sent twice: the last wins); takes ownership of *value on success. */
int value_map_put(ValueMap *m, const char *name, Value *value);
/* Sorts by name (byte order). */
void value_map_sort(ValueMap *m);

DEFINE_TRIVIAL_CLEANUP_FUNC(Value *, value_done);

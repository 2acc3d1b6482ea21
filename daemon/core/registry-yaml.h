/* registry-yaml.h: the YAML tree the registry loader walks: nodes with positions, tags and scalar typing. */
#pragma once

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/macro.h"
#include "value.h"

typedef enum YNodeKind {
        YNODE_SCALAR,
        YNODE_SEQUENCE,
        YNODE_MAPPING,
} YNodeKind;

typedef struct YNode YNode;
struct YNode {
        YNodeKind kind;
        unsigned line, column; /* 1-based */
        char *tag;             /* explicit tag, NULL when none */
        char *text;            /* scalar: NUL-free, NUL-terminated */
        bool plain;            /* scalar: plain style, subject to type resolution */
        YNode **items;         /* sequence items; mapping keys and values alternate */
        size_t n_items;
        size_t allocated;
};

YNode *ynode_free(YNode *n);
DEFINE_TRIVIAL_CLEANUP_FUNC(YNode *, ynode_free);

static inline size_t ynode_n_pairs(const YNode *m) {
        return m->n_items / 2;
}

static inline const YNode *ynode_key(const YNode *m, size_t i) {
        return m->items[2 * i];
}

static inline const YNode *ynode_value(const YNode *m, size_t i) {
        return m->items[2 * i + 1];
}

/* Records one problem at line:column (0:0 for none) and returns -EINVAL, or -ENOMEM. A callback
 * rather than a diagnostics list so the caller keeps its own file naming and limits. */
typedef int (*YNodeDiagFunc)(void *userdata, unsigned line, unsigned column, const char *format,
                             va_list ap) _printf_(4, 0);

/* Parses buf into *ret (NULL for a stream without a document). Every problem is reported through
 * diag, whose negative result is returned. */
int ynode_parse(const char *buf, size_t size, YNodeDiagFunc diag, void *userdata, YNode **ret);

/* Resolves a scalar to a Value; VALUE_NONE for null. On a bad number returns -EINVAL with a
 * static *ret_problem. */
int ynode_scalar_resolve(const YNode *n, Value *ret, const char **ret_problem);

/* repr.h: Python-repr formatting for error texts: 'x', ['a', 'b'], ('dp', 'tp'), ('dp',), (). */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* Each returns a newly allocated string, or NULL on OOM. */
char *repr_string(const char *s);                          /* 'x' with Python's quoting rules */
char *repr_string_list(char *const *items, size_t n);      /* ['a', 'b'] */
char *repr_string_tuple(char *const *items, size_t n);     /* ('a',) */
char *repr_int_list(const int64_t *items, size_t n);       /* [1, 2] */

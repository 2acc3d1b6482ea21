/* token.h: shard tokens: 128-bit random capabilities written as 32 lowercase hex characters. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

#define SHARD_TOKEN_BYTES  16u
#define SHARD_TOKEN_LENGTH (SHARD_TOKEN_BYTES * 2u) /* hex characters, without the NUL */

typedef struct ShardToken {
        char hex[SHARD_TOKEN_LENGTH + 1];
} ShardToken;

/* A fresh token. 0 or a negative errno from random_bytes(). */
int shard_token_new(ShardToken *ret);

/* True when s is exactly SHARD_TOKEN_LENGTH lowercase hex characters. */
bool shard_token_is_valid(const char *s);

/*
 * Compares a candidate against a known token in time that depends only on the candidate's
 * length (bounded by SHARD_TOKEN_LENGTH + 1), never on where they first differ. NULL is
 * equal to nothing.
 */
bool shard_token_equal(const char *known, const char *candidate);

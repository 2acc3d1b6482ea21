/* peer-key.h: the cluster key file: the one or two keys that prove a daemon belongs to the cluster. */
#pragma once

#include <stdint.h>

#include "common/macro.h"

/* A key: 32 random bytes, written in the file as 64 hexadecimal characters. */
#define PEER_KEY_BYTES 32u
#define PEER_KEYS_MAX 2u

/* The keys in file order: keys[0] dials, every one is accepted. n == 0: no key. */
typedef struct PeerKeys {
        uint8_t keys[PEER_KEYS_MAX][PEER_KEY_BYTES];
        unsigned n;
} PeerKeys;

/*
 * Reads FILE: one key per line (64 hexadecimal characters), one or two keys; blank lines and
 * lines starting with '#' are skipped. The file must be a regular file that belongs to this
 * process's user and that group and others cannot read or write. Logs one line naming the file
 * (and its mode, or the line) on failure: -EPERM for ownership or mode, -EINVAL for the
 * contents, else the errno of opening or reading it.
 */
int peer_keys_load(const char *path, PeerKeys *ret);

/* Zeroes the keys (sodium_memzero). */
void peer_keys_wipe(PeerKeys *k);

/* codec-build-holders.h: a build's sharing key, and what holds it in the Build message. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "codec-build.h"
#include "core/arena.h"
#include "core/build-table.h"

struct Familyd__V1__Build;

/*
 * The sharing key of b: the Build message it describes (no id, no tokens, no allocation sizes,
 * no shard socket: what the build is, not which copy) packed, then each of extra (mesh, seed,
 * ranks, writability, owner...) as a NUL-terminated string. Fields added to the Build message
 * count automatically. *ret is malloc'd.
 */
int codec_build_key(const CodecBuild *b, const char *const *extra, size_t n_extra, uint8_t **ret,
                    size_t *ret_size);

/* Fills Build fields 6-11 (references, pinned, grace deadline, writable, private, created) of
 * an encoded build from its holding, in a. */
int codec_build_holding_encode(Arena *a, const BuildHolding *h, struct Familyd__V1__Build *pb);

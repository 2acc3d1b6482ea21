/* codec-holders-record.h: the record of what holds a build, kept beside its build record. */
#pragma once

/*
 * DESIGN: a fixed little-endian layout rather than a protobuf message: the record is rewritten
 * whole on every change of its holders, is read by this daemon only, and must be refused
 * whole when damaged (a CRC-32C over everything before it). A record the daemon cannot read
 * means no holders (the build's grace period applies), never a lost build.
 *
 *   0  "FDHL"             4  u32 version (1)     8  u32 flags (1 pinned, 2 private,
 *                                                  4 owned, 8 shared with the group)
 *  12  u32 n_holders     16  i64 created_ms     24  u64 key_size
 *  32  key_size bytes of the sharing key
 *   +  n_holders x 32: i32 pid, u32 uid, u64 start_time, i64 since_ms, u32 count, u32 zero
 *   +  with flag 4 only: u32 the owner's uid (records written before owners had no flag 4
 *      and still read: the build has no known owner)
 *   +  with flag 16 only: i32 pid, u32 zero, u64 start_time of the one process a training
 *      handout is bound to (records without it read as not bound)
 *   +  with flag 32 only: u32 n (1 to BUILD_TABLE_MAX_PINNERS), then n u32 uids that pinned
 *      the build (records without it and with flag 1: a pin of unknown uid, its owner's)
 *   +  u32 CRC-32C of every byte before it
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/build-table.h"

#define HOLDERS_RECORD_VERSION 1u
/* A sharing key is the packed Build message (at most a reply's size) and a few strings. */
#define HOLDERS_RECORD_MAX_KEY_BYTES (8u * 1024u * 1024u)
#define HOLDERS_RECORD_MAX_BYTES \
        (60u + HOLDERS_RECORD_MAX_KEY_BYTES + 32u * BUILD_TABLE_MAX_HOLDERS + \
         4u * BUILD_TABLE_MAX_PINNERS)

/* The build table's own plain data (core/build-table.h). */
typedef BuildHoldingKept HoldersRecord;

/* *ret malloc'd. -E2BIG past the limits above. */
int codec_holders_record_encode(const HoldersRecord *h, uint8_t **ret, size_t *ret_size);
/* -EBADMSG (why says what, for the log) for anything but a whole record of this version;
 * -ENOMEM. On success *ret owns its key and holders (codec_holders_record_done()). */
int codec_holders_record_decode(const uint8_t *data, size_t size, HoldersRecord *ret, char *why,
                                size_t why_size);
void codec_holders_record_done(HoldersRecord *h);

/* segment.h: a shard's memory: a sealed memfd the daemon fills and hands out as descriptors. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "macro.h"

/*
 * DESIGN: a host segment is a memfd sealed against shrinking and growing (and against further
 * sealing) right after it gets its size, so no holder of a descriptor, the daemon included,
 * can ever truncate it under another's mapping (SIGBUS). The daemon fills it through its own
 * shared mapping, then drops the mapping with shard_segment_unmap(). Descriptors handed out
 * are new ones: a writable one is a dup of the memfd; a read-only one is the same memfd
 * reopened O_RDONLY through /proc/self/fd, so the kernel refuses a writable shared mapping of
 * it (EACCES). The inode is chmod 0400 too, so a client of another uid cannot reopen its
 * read-only descriptor O_RDWR through its own /proc/self/fd (one of the daemon's uid, or root,
 * still can: the mode is all that guards that, no seal does, since writable handouts of the
 * same memfd must keep working).
 *
 * Segments are reference-counted with an atomic count: the shard table, a Build record and the
 * shard socket's thread each hold references. A segment never changes after creation except
 * for the mapping, which only its creator touches (fill, then unmap) before it is shared.
 */

#define SHARD_SEGMENT_DEVICE_KIND_HOST "host"

typedef struct ShardSegment ShardSegment;

/*
 * A host segment of size bytes (> 0, else -EINVAL), mapped read-write for the daemon, zeroed.
 * name shows in /proc/PID/fd and maps (memfd:NAME); at most 249 bytes. device is the local
 * device index the shard belongs to.
 */
int shard_segment_new_host(const char *name, uint64_t size, int device, ShardSegment **ret);

/*
 * Takes over fd (on success only), a descriptor of a segment created earlier (the systemd fd
 * store, or a file under --state-dir): its size is its current size (> 0), its kind "host".
 * One not sealed against resizing is handed out read-only only. No mapping is made.
 */
int shard_segment_adopt(int fd, int device, ShardSegment **ret);

ShardSegment *shard_segment_ref(ShardSegment *s);
ShardSegment *shard_segment_unref(ShardSegment *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(ShardSegment *, shard_segment_unref);

/* The daemon's writable mapping for filling; NULL once unmapped (or for an adopted segment). */
void *shard_segment_data(const ShardSegment *s);
/* Drops the daemon's mapping; the memory lives on in the memfd. Idempotent. */
void shard_segment_unmap(ShardSegment *s);

uint64_t shard_segment_size(const ShardSegment *s);
const char *shard_segment_device_kind(const ShardSegment *s);
int shard_segment_device(const ShardSegment *s);
/* The segment's own descriptor (O_RDWR), still owned by the segment: for the fd store. */
int shard_segment_fd(const ShardSegment *s);
/* True when sealed against shrinking and growing (always, for a segment made here). */
bool shard_segment_is_sealed(const ShardSegment *s);

/*
 * A new O_CLOEXEC descriptor for a client: writable, a dup of the memfd; else read-only (see
 * DESIGN). -EPERM: writable asked of a segment that is not sealed. -EMFILE, -ENFILE: out of
 * descriptors.
 */
int shard_segment_open(const ShardSegment *s, bool writable, int *ret_fd);

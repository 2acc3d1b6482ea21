/* segment.h: a shard's memory: a sealed memfd, or a GPU allocation, handed out as descriptors. */
#pragma once

#include <stdbool.h>
#include <stdint.h>

#include "common/macro.h"

/*
 * DESIGN: a host segment is a memfd sealed against shrinking and growing right after it gets
 * its size, so no holder of a descriptor, the daemon included, can ever truncate it under
 * another's mapping (SIGBUS). The daemon fills it through its own shared mapping, drops the
 * mapping with shard_segment_unmap(), and seals it for good with shard_segment_seal() before
 * anyone may have it: a segment that does not allow writes is then sealed against writing
 * (F_SEAL_WRITE: no write(), no writable shared mapping, for every process, root included),
 * and every segment against further sealing (F_SEAL_SEAL), so no holder can seal a writable
 * build's memory under its other users. Nothing is handed out before that (-EBUSY).
 * Descriptors handed out are new ones: a writable one is a dup of the memfd; a read-only one
 * is the same memfd reopened O_RDONLY through /proc/self/fd, so the kernel refuses a writable
 * shared mapping of it (EACCES). The inode is chmod 0400 too. A reopen O_RDWR through
 * /proc/PID/fd (root, or the daemon's uid) gets a writable descriptor of the inode, but the
 * write seal refuses every write through it (EPERM). Copy-on-write mappings (MAP_PRIVATE,
 * PROT_WRITE) of a write-sealed memfd stay allowed: they never write the memfd.
 * Files under --state-dir cannot be sealed: there the mode is the only guard, and a root
 * process can write one (docs/security.md).
 *
 * Huge pages (huge-pages.h, --huge-pages): a host segment is a hugetlb memfd when the mode and
 * the host allow, its size rounded up to the huge page size (shard_segment_size() is the
 * rounded size, the handout's size too: a hugetlb mapping is unmapped whole pages only). The
 * daemon's mapping reserves its pages, so neither the fill nor a client can fault for want of
 * one. hugetlb memfds take the same seals as normal ones (measured on Linux 6.18: SHRINK, GROW,
 * WRITE, FUTURE_WRITE, SEAL all accepted), reopen O_RDONLY the same way, and the fd store
 * keeps them like any memfd. Otherwise a normal memfd, advised MADV_HUGEPAGE when shmem
 * transparent huge pages are in advise mode. Segments under --state-dir are tmpfs files:
 * normal pages always (the tmpfs mount's own huge= option decides there).
 *
 * A device segment (a GPU allocation, shard/backend-cuda.c) is an exported descriptor of the
 * allocation plus the backend's handle, released through the backend when the last reference
 * goes. Such descriptors cannot be sealed and carry no access mode: any process that imports
 * one may map it read-write, so for them "read-only" is advisory (docs/operating.md, "Accelerators"):
 * every handout is a dup of the exported descriptor.
 *
 * Writable handouts are for builds made writable (BuildRequest.writable): their bytes are
 * every user's. A segment refuses them unless its creator allowed them before sharing it
 * (shard_segment_allow_writes()); a trainer that wants to write its own copy maps a read-only
 * descriptor MAP_PRIVATE (copy-on-write), which needs nothing from the daemon.
 *
 * Segments are reference-counted with an atomic count: the shard table, a Build record and the
 * shard socket's thread each hold references. A segment never changes after creation except
 * for the mapping and the write permission, which only its creator touches (fill, then unmap,
 * allow) before it is shared.
 */

#define SHARD_SEGMENT_DEVICE_KIND_HOST "host"
#define SHARD_SEGMENT_DEVICE_KIND_CUDA "cuda"

/* How a device segment's memory goes: release(memory) once, from the last unref, on any
 * thread. */
typedef struct ShardSegmentDeviceOps {
        const char *kind; /* SHARD_SEGMENT_DEVICE_KIND_CUDA */
        void (*release)(void *memory);
} ShardSegmentDeviceOps;

typedef struct ShardSegment ShardSegment;

/*
 * A host segment of size bytes (> 0, else -EINVAL), mapped read-write for the daemon, zeroed;
 * on huge pages when --huge-pages allows (DESIGN: its size is then rounded up), else on normal
 * pages. -ENOMEM under --huge-pages require when its huge pages cannot be reserved. name shows
 * in /proc/PID/fd and maps (memfd:NAME); at most 249 bytes. device is the local device index
 * the shard belongs to.
 */
int shard_segment_new_host(const char *name, uint64_t size, int device, ShardSegment **ret);

/*
 * A host segment kept as the file name in the directory dir_fd (a tmpfs: --state-dir), so
 * that it outlives the daemon: created (O_EXCL, mode 0400), its blocks allocated up front
 * (fallocate, so a full tmpfs is -ENOSPC here rather than SIGBUS while filling; ramfs, which
 * cannot preallocate, gets ftruncate), mapped read-write for the daemon. Such a file cannot be
 * sealed: the segment is handed out read-only only. On failure the file is gone again.
 */
int shard_segment_new_file(int dir_fd, const char *name, uint64_t size, int device,
                           ShardSegment **ret);

/*
 * Takes over fd (on success only), a descriptor of a segment created earlier (the systemd fd
 * store, or a file under --state-dir): its size is its current size (> 0), its kind "host".
 * One not sealed against resizing is handed out read-only only. No mapping is made.
 */
int shard_segment_adopt(int fd, int device, ShardSegment **ret);

/*
 * A device segment: fd, the exported descriptor of an allocation of size bytes (its full size,
 * a multiple of the device's allocation granularity), and memory, the backend's handle of it;
 * both taken over on success only. No mapping is made.
 */
int shard_segment_new_device(const ShardSegmentDeviceOps *ops, void *memory, int fd,
                             uint64_t size, int device, ShardSegment **ret);

ShardSegment *shard_segment_ref(ShardSegment *s);
ShardSegment *shard_segment_unref(ShardSegment *s);
DEFINE_TRIVIAL_CLEANUP_FUNC(ShardSegment *, shard_segment_unref);

/* The daemon's writable mapping for filling; NULL once unmapped (or for an adopted segment). */
void *shard_segment_data(const ShardSegment *s);
/* Drops the daemon's mapping; the memory lives on in the memfd. Idempotent. */
void shard_segment_unmap(ShardSegment *s);

/* The descriptor's size: for a device segment the allocation's, rounded up to its granularity. */
uint64_t shard_segment_size(const ShardSegment *s);
/* "host" or "cuda". */
const char *shard_segment_device_kind(const ShardSegment *s);
bool shard_segment_is_host(const ShardSegment *s);
/* The backend's handle of a device segment; NULL for a host one. */
void *shard_segment_device_memory(const ShardSegment *s);
int shard_segment_device(const ShardSegment *s);
/* The segment's own descriptor (O_RDWR; a device segment's exported one), still owned by the
 * segment: for the fd store, which takes host segments only. */
int shard_segment_fd(const ShardSegment *s);
/* A hugetlb segment's page size (made here, or adopted: a hugetlbfs file); 0 on normal pages. */
uint64_t shard_segment_huge_page_size(const ShardSegment *s);
/* Whether s holds a rank of bytes bytes: its size is bytes, or, on huge pages, bytes rounded up
 * to whole pages (what a restart finds in the fd store for a rank made on huge pages). */
bool shard_segment_fits(const ShardSegment *s, uint64_t bytes);
/* True when sealed against shrinking and growing (always, for a host segment made here; never
 * for a device segment). */
bool shard_segment_is_sealed(const ShardSegment *s);

/* Allows writable handouts (a writable build's segment); before shard_segment_seal(). */
void shard_segment_allow_writes(ShardSegment *s);
bool shard_segment_writes_allowed(const ShardSegment *s);

/*
 * The last step before a segment is shared (DESIGN): a host memfd gets F_SEAL_SEAL, and
 * F_SEAL_WRITE unless writes were allowed. The daemon's mapping must be gone first (-EBUSY;
 * the kernel refuses a write seal while a writable shared mapping exists). Idempotent; nothing
 * to do for a device segment, a --state-dir file, or a memfd adopted with its seals final.
 */
int shard_segment_seal(ShardSegment *s);
/* Instead of shard_segment_seal() for a writable build that is published later (init: module,
 * build/build-publish.c): handed out from now on, its seals still open. -EBUSY while mapped. */
int shard_segment_finish_unsealed(ShardSegment *s);
/* The publish: no writable handouts any more, and the memfd sealed against writes and further
 * seals, so a descriptor handed out writable before cannot write either. -EBUSY while any
 * process maps it writable (shared), -EPERM when its seals are final without the write seal:
 * nothing changed then. Idempotent; nothing to seal for a device segment or a --state-dir
 * file. */
int shard_segment_seal_writes(ShardSegment *s);
bool shard_segment_is_final(const ShardSegment *s);
/* A host memfd's seals (F_GET_SEALS); -EINVAL for a device segment or a --state-dir file,
 * which have none. */
int shard_segment_seals(const ShardSegment *s);

/*
 * A new O_CLOEXEC descriptor for a client: writable, a dup of the memfd; else read-only (see
 * DESIGN); a device segment's is a dup of its exported descriptor either way. -EACCES:
 * writable asked of a segment that does not allow writes. -EBUSY: not yet through
 * shard_segment_seal(). -EPERM: writable asked of a host segment that is not sealed.
 * -EMFILE, -ENFILE: out of descriptors.
 */
int shard_segment_open(const ShardSegment *s, bool writable, int *ret_fd);

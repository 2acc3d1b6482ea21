/* segment.c: sealed memfd segments for host shards, and the descriptors of device shards. */
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "segment.h"

#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008U
#endif

#define SHARD_SEGMENT_SEALS (F_SEAL_SHRINK | F_SEAL_GROW)

struct ShardSegment {
        atomic_uint n_ref;
        int fd;
        uint64_t size;
        void *mapping; /* the daemon's, until shard_segment_unmap() */
        int device;
        bool sealed;
        bool writes_allowed; /* writable handouts: a writable build's segment */
        /* Device segments: how to let go of memory, the backend's handle. */
        const ShardSegmentDeviceOps *ops;
        void *memory;
};

static int memfd_new(const char *name) {
        /* Shard bytes are data: no exec (MFD_NOEXEC_SEAL, Linux 6.3+, implies ALLOW_SEALING);
         * older kernels refuse the flag with EINVAL. */
        int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
        if (fd < 0 && errno == EINVAL)
                fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
        return fd < 0 ? -errno : fd;
}

int shard_segment_new_host(const char *name, uint64_t size, int device, ShardSegment **ret) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;

        if (size == 0 || size > (uint64_t) SIZE_MAX || size > (uint64_t) INT64_MAX)
                return -EINVAL;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        atomic_init(&s->n_ref, 1);
        s->fd = -1;
        s->size = size;
        s->device = device;

        s->fd = memfd_new(isempty(name) ? "familyd-shard" : name);
        if (s->fd < 0)
                return s->fd;
        if (ftruncate(s->fd, (off_t) size) < 0)
                return -errno;
        /* Read-only handouts reopen the inode: see DESIGN in segment.h. */
        if (fchmod(s->fd, 0400) < 0)
                return -errno;
        /* Sealed before anything is mapped or shared: the size is final from here on. Shared
         * writable mappings stay allowed (no F_SEAL_WRITE), for the fill and writable handouts. */
        if (fcntl(s->fd, F_ADD_SEALS, SHARD_SEGMENT_SEALS | F_SEAL_SEAL) < 0)
                return -errno;
        s->sealed = true;

        void *p = mmap(NULL, (size_t) size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        s->mapping = p;

        *ret = TAKE_PTR(s);
        return 0;
}

int shard_segment_new_file(int dir_fd, const char *name, uint64_t size, int device,
                           ShardSegment **ret) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        int r;

        if (size == 0 || size > (uint64_t) SIZE_MAX || size > (uint64_t) INT64_MAX ||
            isempty(name) || strchr(name, '/'))
                return -EINVAL;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        atomic_init(&s->n_ref, 1);
        s->size = size;
        s->device = device;

        /* 0400 at creation still yields this O_RDWR descriptor; nobody can reopen it for
         * writing later (the daemon itself re-adopts it read-only). */
        s->fd = openat(dir_fd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW |
                                             O_NOCTTY, 0400);
        if (s->fd < 0)
                return -errno;

        r = fallocate(s->fd, 0, 0, (off_t) size) < 0 ? -errno : 0;
        if (r == -EOPNOTSUPP)
                r = ftruncate(s->fd, (off_t) size) < 0 ? -errno : 0;
        if (r >= 0) {
                void *p = mmap(NULL, (size_t) size, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
                if (p == MAP_FAILED)
                        r = -errno;
                else
                        s->mapping = p;
        }
        if (r < 0) {
                (void) unlinkat(dir_fd, name, 0);
                return r;
        }

        *ret = TAKE_PTR(s);
        return 0;
}

int shard_segment_adopt(int fd, int device, ShardSegment **ret) {
        struct stat st;
        ShardSegment *s;

        if (fd < 0)
                return -EBADF;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EBADFD;
        if (st.st_size <= 0)
                return -EINVAL;

        int seals = fcntl(fd, F_GET_SEALS);
        if (seals < 0 && errno != EINVAL) /* EINVAL: a file that cannot be sealed */
                return -errno;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        atomic_init(&s->n_ref, 1);
        s->fd = fd;
        s->size = (uint64_t) st.st_size;
        s->device = device;
        s->sealed = seals >= 0 && (seals & SHARD_SEGMENT_SEALS) == SHARD_SEGMENT_SEALS;
        *ret = s;
        return 0;
}

int shard_segment_new_device(const ShardSegmentDeviceOps *ops, void *memory, int fd,
                             uint64_t size, int device, ShardSegment **ret) {
        ShardSegment *s;

        if (!ops || !ops->release || !memory || fd < 0 || size == 0 ||
            size > (uint64_t) INT64_MAX)
                return -EINVAL;
        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        atomic_init(&s->n_ref, 1);
        s->fd = fd;
        s->size = size;
        s->device = device;
        s->ops = ops;
        s->memory = memory;
        *ret = s;
        return 0;
}

ShardSegment *shard_segment_ref(ShardSegment *s) {
        if (s)
                atomic_fetch_add_explicit(&s->n_ref, 1, memory_order_relaxed);
        return s;
}

ShardSegment *shard_segment_unref(ShardSegment *s) {
        if (!s || atomic_fetch_sub_explicit(&s->n_ref, 1, memory_order_acq_rel) != 1)
                return NULL;
        shard_segment_unmap(s);
        safe_close(s->fd);
        if (s->ops)
                s->ops->release(s->memory);
        return mfree(s);
}

void *shard_segment_data(const ShardSegment *s) {
        return s->mapping;
}

void shard_segment_unmap(ShardSegment *s) {
        if (!s->mapping)
                return;
        (void) munmap(s->mapping, (size_t) s->size);
        s->mapping = NULL;
}

uint64_t shard_segment_size(const ShardSegment *s) {
        return s->size;
}

const char *shard_segment_device_kind(const ShardSegment *s) {
        return s->ops ? s->ops->kind : SHARD_SEGMENT_DEVICE_KIND_HOST;
}

bool shard_segment_is_host(const ShardSegment *s) {
        return !s->ops;
}

void *shard_segment_device_memory(const ShardSegment *s) {
        return s->memory;
}

int shard_segment_device(const ShardSegment *s) {
        return s->device;
}

int shard_segment_fd(const ShardSegment *s) {
        return s->fd;
}

bool shard_segment_is_sealed(const ShardSegment *s) {
        return s->sealed;
}

void shard_segment_allow_writes(ShardSegment *s) {
        s->writes_allowed = true;
}

bool shard_segment_writes_allowed(const ShardSegment *s) {
        return s->writes_allowed;
}

int shard_segment_open(const ShardSegment *s, bool writable, int *ret_fd) {
        int fd;

        if (writable && !s->writes_allowed)
                return -EACCES;
        if (s->ops) {
                /* Nothing to seal, no access mode to give: see DESIGN in segment.h. */
                fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 3);
                if (fd < 0)
                        return -errno;
                *ret_fd = fd;
                return 0;
        }
        if (writable) {
                /* Unsealed (adopted from --state-dir): a writer could truncate it under
                 * everyone's mapping, so it is never handed out writable. */
                if (!s->sealed)
                        return -EPERM;
                fd = fcntl(s->fd, F_DUPFD_CLOEXEC, 3);
        } else {
                char path[sizeof "/proc/self/fd/" + 3 * sizeof(int)];
                (void) snprintf(path, sizeof path, "/proc/self/fd/%i", s->fd);
                fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        }
        if (fd < 0)
                return -errno;
        *ret_fd = fd;
        return 0;
}

/* segment.c: sealed memfd segments for host shards, and the descriptors of device shards. */
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "huge-pages.h"
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
        bool final; /* shard_segment_seal() done: nothing may be sealed any more */
        uint64_t huge_page_size; /* a hugetlb memfd's page size; 0 on normal pages */
        bool writes_allowed; /* writable handouts: a writable build's segment */
        /* Device segments: how to let go of memory, the backend's handle. */
        const ShardSegmentDeviceOps *ops;
        void *memory;
};

/* The page size of a hugetlbfs file (a hugetlb memfd is one); 0 for any other. */
static uint64_t huge_page_size_of(int fd) {
        struct statfs sfs;
        struct stat st;

        if (fstatfs(fd, &sfs) < 0 || (uint64_t) sfs.f_type != HUGETLBFS_MAGIC ||
            fstat(fd, &st) < 0 || st.st_blksize <= 0)
                return 0;
        return (uint64_t) st.st_blksize;
}

static int memfd_new(const char *name, unsigned extra_flags) {
        /* Shard bytes are data: no exec (MFD_NOEXEC_SEAL, Linux 6.3+, implies ALLOW_SEALING);
         * older kernels refuse the flag with EINVAL. */
        int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL |
                                            extra_flags);
        if (fd < 0 && errno == EINVAL)
                fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING | extra_flags);
        return fd < 0 ? -errno : fd;
}

/* s's memfd of s->size bytes, sealed and mapped for the fill; huge: a hugetlb memfd, whose
 * pages the shared mapping reserves (-ENOMEM when too few are free), so the fill can never
 * fault for want of one (SIGBUS). Sets nothing in s on failure. */
/* A shared mapping of fd at an address aligned to a PMD (2 MiB), so that addresses and file
 * offsets agree modulo a huge page, which shmem THP needs to map huge entries. The kernel
 * aligns large shmem mappings itself, but not every process places them so (valgrind does its
 * own placing): a span of anonymous address space is taken and the file mapped inside it. */
#define SEGMENT_THP_ALIGN ((uintptr_t) 2 << 20)
static void *segment_map_thp_aligned(int fd, size_t size) {
        size_t page = (size_t) sysconf(_SC_PAGESIZE);
        size_t length = (size + page - 1) / page * page;
        size_t span = length + SEGMENT_THP_ALIGN;
        uint8_t *area, *start;
        void *p;

        area = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (area == MAP_FAILED)
                return MAP_FAILED;
        start = (uint8_t *) (((uintptr_t) area + SEGMENT_THP_ALIGN - 1) & ~(SEGMENT_THP_ALIGN - 1));
        p = mmap(start, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
        if (p == MAP_FAILED) {
                int e = errno;
                (void) munmap(area, span);
                errno = e;
                return MAP_FAILED;
        }
        if (start > area)
                (void) munmap(area, (size_t) (start - area));
        if (area + span > start + length)
                (void) munmap(start + length, (size_t) (area + span - (start + length)));
        return p;
}

static int segment_memfd(ShardSegment *s, const char *name, bool huge) {
        _cleanup_close_ int fd = -EBADF;
        void *p;

        fd = memfd_new(name, huge ? MFD_HUGETLB : 0);
        if (fd < 0)
                return fd;
        if (ftruncate(fd, (off_t) s->size) < 0)
                return -errno;
        /* Read-only handouts reopen the inode: see DESIGN in segment.h. */
        if (fchmod(fd, 0400) < 0)
                return -errno;
        /* Sealed before anything is mapped or shared: the size is final from here on. The
         * write seal and the seal of seals come in shard_segment_seal(), after the fill.
         * hugetlb memfds take the same seals (Linux 4.16+). */
        if (fcntl(fd, F_ADD_SEALS, SHARD_SEGMENT_SEALS) < 0)
                return -errno;
        /* shmem THP in advise mode: the fill's first touch then allocates huge folios, which
         * clients that ask the same (libfamilyd's populate) map with huge entries too. */
        bool thp = !huge && huge_pages_shmem_advise();
        p = thp ? segment_map_thp_aligned(fd, (size_t) s->size)
                : mmap(NULL, (size_t) s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        if (thp)
                (void) madvise(p, (size_t) s->size, MADV_HUGEPAGE);
        s->fd = TAKE_FD(fd);
        s->mapping = p;
        s->sealed = true;
        s->huge_page_size = huge ? huge_page_size_of(s->fd) : 0;
        return 0;
}

/* Makes s's memfd on huge pages when the mode and the host allow: 0 when it did, 1 when s is
 * to go on normal pages (auto's fallback is logged), -ENOMEM under require without pages. */
static int segment_memfd_huge(ShardSegment *s, const char *name, uint64_t size) {
        HugePagesMode mode = huge_pages_mode();
        HugePagesHost h = {};
        char why[160];
        int r;

        if (mode == HUGE_PAGES_NEVER)
                return 1;
        (void) huge_pages_host(&h);
        if (h.page_size == 0 || h.total == 0) {
                if (mode == HUGE_PAGES_REQUIRE)
                        return -ENOMEM;
                huge_pages_log_fallback(size, "the host has no huge pages reserved "
                                              "(vm.nr_hugepages is 0)");
                return 1;
        }
        if (!huge_pages_wanted(size, &h))
                return 1; /* under auto, smaller than a page: not worth one */
        if (size > UINT64_MAX - h.page_size)
                return -EINVAL;
        s->size = (size + h.page_size - 1) / h.page_size * h.page_size;
        if (s->size > (uint64_t) INT64_MAX)
                return -EINVAL;
        r = segment_memfd(s, name, true);
        if (r >= 0)
                return 0;
        s->size = size;
        if (mode == HUGE_PAGES_REQUIRE)
                return r == -ENOMEM || r == -ENOSPC ? -ENOMEM : r;
        (void) snprintf(why, sizeof why,
                        "its %" PRIu64 " huge pages of %" PRIu64 " kB could not be reserved "
                        "(%" PRIu64 " of %" PRIu64 " free): %s",
                        (size + h.page_size - 1) / h.page_size, h.page_size / 1024, h.available,
                        h.total, strerror(-r));
        huge_pages_log_fallback(size, why);
        return 1;
}

int shard_segment_new_host(const char *name, uint64_t size, int device, ShardSegment **ret) {
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        int r;

        if (size == 0 || size > (uint64_t) SIZE_MAX || size > (uint64_t) INT64_MAX)
                return -EINVAL;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        atomic_init(&s->n_ref, 1);
        s->fd = -1;
        s->size = size;
        s->device = device;

        if (isempty(name))
                name = "familyd-shard";
        r = segment_memfd_huge(s, name, size);
        if (r > 0)
                r = segment_memfd(s, name, false);
        if (r < 0)
                return r;

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
        s->final = seals < 0 || (seals & F_SEAL_SEAL);
        s->huge_page_size = huge_page_size_of(fd);
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
        s->final = true; /* nothing to seal */
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

uint64_t shard_segment_huge_page_size(const ShardSegment *s) {
        return s->huge_page_size;
}

bool shard_segment_fits(const ShardSegment *s, uint64_t bytes) {
        uint64_t page = s->huge_page_size;

        if (s->size == bytes)
                return true;
        /* A hugetlb segment is its bytes rounded up to whole pages, no more. */
        return page > 0 && bytes > 0 && bytes <= s->size && s->size - bytes < page &&
               s->size % page == 0;
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

int shard_segment_seal(ShardSegment *s) {
        int seals;

        if (s->final)
                return 0;
        if (s->mapping)
                return -EBUSY;
        seals = fcntl(s->fd, F_GET_SEALS);
        if (seals < 0 && errno != EINVAL)
                return -errno;
        /* EINVAL: a --state-dir file, which cannot be sealed (DESIGN). */
        if (seals >= 0 && !(seals & F_SEAL_SEAL)) {
                int add = F_SEAL_SEAL | (s->writes_allowed ? 0 : F_SEAL_WRITE);
                if (fcntl(s->fd, F_ADD_SEALS, add) < 0)
                        return -errno;
        }
        s->final = true;
        return 0;
}

int shard_segment_finish_unsealed(ShardSegment *s) {
        if (s->mapping)
                return -EBUSY;
        s->final = true;
        return 0;
}

int shard_segment_seal_writes(ShardSegment *s) {
        int seals;

        if (!s->ops) { /* device memory: nothing to seal (DESIGN in segment.h) */
                seals = fcntl(s->fd, F_GET_SEALS);
                if (seals < 0 && errno != EINVAL) /* EINVAL: a --state-dir file (DESIGN) */
                        return -errno;
                if (seals >= 0 && !(seals & F_SEAL_WRITE)) {
                        if (seals & F_SEAL_SEAL)
                                return -EPERM;
                        /* EBUSY while any process (or the daemon) maps it writable. */
                        if (fcntl(s->fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SEAL) < 0)
                                return -errno;
                }
        }
        s->writes_allowed = false;
        return 0;
}

bool shard_segment_is_final(const ShardSegment *s) {
        return s->final;
}

int shard_segment_seals(const ShardSegment *s) {
        int seals;

        if (s->ops)
                return -EINVAL;
        seals = fcntl(s->fd, F_GET_SEALS);
        return seals < 0 ? -errno : seals;
}

int shard_segment_open(const ShardSegment *s, bool writable, int *ret_fd) {
        int fd;

        if (writable && !s->writes_allowed)
                return -EACCES;
        if (!s->final)
                return -EBUSY;
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

/* shard.c: the shard socket client (proto/familyd/v1/shard.proto): tokens in, descriptors
 * out over SCM_RIGHTS, and mmap of what comes back; CUDA shards imported through the driver. */

/*
 * DESIGN (CUDA shards): libfamilyd never links CUDA. The driver is loaded on first use,
 * once per process and never unloaded ($FAMILYD_CUDA_DRIVER, else libcuda.so.1; the types are
 * the daemon's, hw/cuda-driver.h), so a process without a driver can still use everything
 * else and is told, in words, that it cannot map device memory. An import retains the
 * device's primary context (the one a CUDA runtime such as torch's uses, so the pointer is
 * valid there) and makes it current on the calling thread.
 */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

#include "common/cuda-driver.h"
#include "client-private.h"
#include "common/macro.h"

/* The daemon's frame limit: a longer reply is not a reply of this protocol. */
#define SHARD_MAX_FRAME_BYTES 65536u

typedef struct Exchange {
        int fd;
        int64_t deadline_ms;            /* -1: none */
        int fds[FAMILYD_SHARD_MAX_TOKENS];
        size_t n_fds;
        bool fd_overflow;               /* more descriptors than tokens: refused */
} Exchange;

static int64_t now_ms(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void exchange_close_fds(Exchange *x) {
        for (size_t i = 0; i < x->n_fds; i++)
                (void) safe_close(x->fds[i]);
        x->n_fds = 0;
}

/* Waits until fd is ready for events, or the deadline: 0, -ETIMEDOUT or -errno. */
static int exchange_wait(Exchange *x, short events) {
        for (;;) {
                struct pollfd p = { .fd = x->fd, .events = events };
                int timeout = -1, k;

                if (x->deadline_ms >= 0) {
                        int64_t left = x->deadline_ms - now_ms();

                        if (left <= 0)
                                return -ETIMEDOUT;
                        timeout = left > INT32_MAX ? INT32_MAX : (int) left;
                }
                k = poll(&p, 1, timeout);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        return -ETIMEDOUT;
                return 0;
        }
}

static int exchange_send(Exchange *x, const uint8_t *buf, size_t n) {
        while (n > 0) {
                ssize_t k;
                int r = exchange_wait(x, POLLOUT);

                if (r < 0)
                        return r;
                k = send(x->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                buf += k;
                n -= (size_t) k;
        }
        return 0;
}

/* Takes the descriptors of every SCM_RIGHTS message: any chunk may carry them, though the
 * daemon sends them with the first. */
static void exchange_take_rights(Exchange *x, struct msghdr *mh) {
        for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
                size_t n;
                int *fds;

                if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                        continue;
                n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                fds = (int *) (void *) CMSG_DATA(c);
                for (size_t i = 0; i < n; i++) {
                        int fd;

                        memcpy(&fd, fds + i, sizeof(fd));
                        if (x->n_fds < ELEMENTSOF(x->fds))
                                x->fds[x->n_fds++] = fd;
                        else {
                                (void) safe_close(fd);
                                x->fd_overflow = true;
                        }
                }
        }
}

/* Reads exactly n bytes (with any descriptors riding on them): 0, -ECONNRESET on early EOF,
 * -EBADMSG when the control data was truncated, -ETIMEDOUT or -errno. */
static int exchange_recv(Exchange *x, uint8_t *buf, size_t n) {
        while (n > 0) {
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * FAMILYD_SHARD_MAX_TOKENS)];
                } control;
                struct iovec iov = { .iov_base = buf, .iov_len = n };
                struct msghdr mh = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = &control,
                        .msg_controllen = sizeof(control),
                };
                ssize_t k;
                int r = exchange_wait(x, POLLIN);

                if (r < 0)
                        return r;
                k = recvmsg(x->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                if (k < 0) {
                        if (errno == EINTR || errno == EAGAIN)
                                continue;
                        return -errno;
                }
                exchange_take_rights(x, &mh);
                if (mh.msg_flags & MSG_CTRUNC)
                        return -EBADMSG;
                if (k == 0)
                        return -ECONNRESET;
                buf += k;
                n -= (size_t) k;
        }
        return 0;
}

static int default_shard_socket(FamilydClient *client, char **ret) {
        const char *api = familyd_client_get_socket_path(client);
        const char *slash;

        if (!api)
                return -EINVAL;
        slash = strrchr(api, '/');
        if (!slash)
                return (*ret = strdup("shard.sock")) ? 0 : -ENOMEM;
        if (asprintf(ret, "%.*s/shard.sock", (int) (slash - api), api) < 0) {
                *ret = NULL;
                return -ENOMEM;
        }
        return 0;
}

static int shard_error_set(FamilydError *error, int code, const char *message) {
        if (!error)
                return 0;
        error->code = code;
        error->message = strdup(message ? message : "");
        return error->message ? 0 : -ENOMEM;
}

/* Connects to the shard socket within the exchange's deadline. */
static int exchange_connect(Exchange *x, const struct sockaddr_un *sa) {
        int err = 0;
        socklen_t l = sizeof(err);
        int r;

        x->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (x->fd < 0)
                return -errno;
        if (connect(x->fd, (const struct sockaddr *) sa, sizeof(*sa)) >= 0)
                return 0;
        if (errno != EINPROGRESS && errno != EAGAIN)
                return -errno;
        /* A full backlog: wait for the connection, then ask how it went. */
        r = exchange_wait(x, POLLOUT);
        if (r < 0)
                return r;
        if (getsockopt(x->fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
                return -errno;
        return err ? -err : 0;
}

/* Sends the frame, with send_fds (if any) as SCM_RIGHTS on its first bytes: one sendmsg, the
 * rest (if the socket took only part) as plain bytes. */
static int exchange_send_frame(Exchange *x, const uint8_t *buf, size_t n, const int *send_fds,
                               size_t n_send_fds) {
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * FAMILYD_SHARD_MAX_TOKENS)];
        } control = {};
        struct iovec iov = { .iov_base = (void *) buf, .iov_len = n };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
        struct cmsghdr *c;
        ssize_t k;

        if (n_send_fds == 0)
                return exchange_send(x, buf, n);
        if (n_send_fds > FAMILYD_SHARD_MAX_TOKENS)
                return -E2BIG;
        mh.msg_control = &control;
        mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_send_fds);
        c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * n_send_fds);
        memcpy(CMSG_DATA(c), send_fds, sizeof(int) * n_send_fds);
        for (;;) {
                int r = exchange_wait(x, POLLOUT);

                if (r < 0)
                        return r;
                k = sendmsg(x->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k >= 0)
                        break;
                if (errno != EINTR && errno != EAGAIN)
                        return -errno;
        }
        return exchange_send(x, buf + k, n - (size_t) k);
}

int shard_socket_exchange(
                FamilydClient *client,
                const char *shard_socket_path,
                const Familyd__V1__ShardFdRequest *req,
                const int *send_fds,
                size_t n_send_fds,
                Familyd__V1__ShardFdReply **ret_reply,
                int *ret_fds,
                size_t *ret_n_fds,
                FamilydError *ret_error) {

        Familyd__V1__ShardFdReply *reply = NULL;
        _cleanup_free_ char *path_buf = NULL;
        _cleanup_free_ uint8_t *out = NULL, *in = NULL;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        Exchange x = { .fd = -1, .deadline_ms = -1 };
        uint32_t timeout_ms = familyd_client_get_timeout_ms(client);
        const char *path = shard_socket_path;
        uint8_t hdr[4];
        size_t packed, len;
        int r;

        if (isempty(path)) {
                if (!client)
                        return -EINVAL;
                r = default_shard_socket(client, &path_buf);
                if (r < 0)
                        return r;
                path = path_buf;
        }
        if (strlen(path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        memcpy(sa.sun_path, path, strlen(path) + 1);

        packed = familyd__v1__shard_fd_request__get_packed_size(req);
        if (packed > SHARD_MAX_FRAME_BYTES)
                return -E2BIG;
        out = malloc(4 + packed);
        if (!out)
                return -ENOMEM;
        out[0] = (uint8_t) packed;
        out[1] = (uint8_t) (packed >> 8);
        out[2] = (uint8_t) (packed >> 16);
        out[3] = (uint8_t) (packed >> 24);
        (void) familyd__v1__shard_fd_request__pack(req, out + 4);

        if (timeout_ms > 0)
                x.deadline_ms = now_ms() + timeout_ms;

        r = exchange_connect(&x, &sa);
        if (r < 0)
                goto finish;
        r = exchange_send_frame(&x, out, 4 + packed, send_fds, n_send_fds);
        if (r < 0)
                goto finish;

        r = exchange_recv(&x, hdr, sizeof(hdr));
        if (r < 0)
                goto finish;
        len = (size_t) hdr[0] | (size_t) hdr[1] << 8 | (size_t) hdr[2] << 16 | (size_t) hdr[3] << 24;
        if (len > SHARD_MAX_FRAME_BYTES) {
                r = -EBADMSG;
                goto finish;
        }
        in = malloc(len ? len : 1);
        if (!in) {
                r = -ENOMEM;
                goto finish;
        }
        r = exchange_recv(&x, in, len);
        if (r < 0)
                goto finish;

        reply = familyd__v1__shard_fd_reply__unpack(NULL, len, in);
        if (!reply) {
                r = -EBADMSG;
                goto finish;
        }
        if (reply->code != 0) {
                r = shard_error_set(ret_error, reply->code, reply->message);
                if (r >= 0)
                        r = -EPROTO;
                goto finish;
        }
        if (x.fd_overflow) {
                r = -EBADMSG;
                goto finish;
        }

        memcpy(ret_fds, x.fds, x.n_fds * sizeof(int));
        *ret_n_fds = x.n_fds;
        x.n_fds = 0;
        *ret_reply = TAKE_PTR(reply);
        r = 0;
finish:
        if (reply)
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        exchange_close_fds(&x);
        (void) safe_close(x.fd);
        return r;
}

static int shard_fetch(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *const *tokens,
                size_t n,
                bool writable,
                int *ret_fds,
                uint64_t *ret_sizes,
                FamilydShardInfo *ret_info,
                FamilydError *ret_error) {

        Familyd__V1__ShardFdRequest req = FAMILYD__V1__SHARD_FD_REQUEST__INIT;
        Familyd__V1__ShardFdReply *reply = NULL;
        int fds[FAMILYD_SHARD_MAX_TOKENS];
        size_t n_fds = 0;
        int r;

        familyd_error_clear(ret_error);
        if (!tokens || n == 0 || n > FAMILYD_SHARD_MAX_TOKENS || !ret_fds)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                if (!tokens[i])
                        return -EINVAL;

        req.n_tokens = n;
        req.tokens = (char **) tokens;
        req.writable = writable;
        r = shard_socket_exchange(client, shard_socket_path, &req, NULL, 0, &reply, fds, &n_fds,
                                  ret_error);
        if (r < 0)
                return r;
        if (n_fds != n || reply->n_sizes != n) {
                for (size_t i = 0; i < n_fds; i++)
                        (void) safe_close(fds[i]);
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
                return -EBADMSG;
        }

        for (size_t i = 0; i < n; i++) {
                ret_fds[i] = fds[i];
                if (ret_sizes)
                        ret_sizes[i] = reply->sizes[i];
                if (ret_info) {
                        /* Older daemons send no kinds: their shards are host memory. */
                        const char *kind = i < reply->n_device_kinds ? reply->device_kinds[i]
                                                                     : "host";
                        ret_info[i] = (FamilydShardInfo) {
                                .size = reply->sizes[i],
                                .device = i < reply->n_devices ? reply->devices[i] : 0,
                        };
                        (void) snprintf(ret_info[i].device_kind, sizeof ret_info[i].device_kind,
                                        "%s", kind ? kind : "");
                }
        }
        familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        return 0;
}

int familyd_shard_fetch(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *const *tokens,
                size_t n,
                bool writable,
                int *ret_fds,
                uint64_t *ret_sizes,
                FamilydError *ret_error) {
        return shard_fetch(client, shard_socket_path, tokens, n, writable, ret_fds, ret_sizes,
                           NULL, ret_error);
}

int familyd_shard_fetch_info(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *const *tokens,
                size_t n,
                bool writable,
                int *ret_fds,
                FamilydShardInfo *ret_info,
                FamilydError *ret_error) {
        if (!ret_info)
                return -EINVAL;
        return shard_fetch(client, shard_socket_path, tokens, n, writable, ret_fds, NULL,
                           ret_info, ret_error);
}

static const char *const map_mode_names[] = {
        [FAMILYD_MAP_READ_ONLY] = "read-only",
        [FAMILYD_MAP_PRIVATE] = "private",
        [FAMILYD_MAP_SHARED] = "shared",
};

int familyd_map_mode_from_string(const char *s, FamilydMapMode *ret_mode) {
        if (!s || !ret_mode)
                return -EINVAL;
        for (size_t i = 0; i < sizeof map_mode_names / sizeof map_mode_names[0]; i++)
                if (strcmp(s, map_mode_names[i]) == 0) {
                        *ret_mode = (FamilydMapMode) i;
                        return 0;
                }
        return -EINVAL;
}

const char *familyd_map_mode_to_string(FamilydMapMode mode) {
        if ((unsigned) mode >= sizeof map_mode_names / sizeof map_mode_names[0])
                return NULL;
        return map_mode_names[mode];
}

bool familyd_map_mode_fetch_writable(FamilydMapMode mode) {
        return mode == FAMILYD_MAP_SHARED;
}

/* ---- populating a mapping --------------------------------------------------------------- */

/*
 * A fresh mapping of a shard has no page table entries: its first read takes a fault per
 * 4 KiB page (or per huge page), one thread at a time. Populating asks the kernel for all of
 * them up front (MADV_POPULATE_READ/_WRITE, Linux 5.14+), split over a few threads, each its
 * own range; on an older kernel each thread reads one byte per page of its range instead.
 */

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

typedef struct PopulateJob {
        uint8_t *start;
        size_t length;
        int advice;
        int error; /* 0, or a positive errno */
} PopulateJob;

static int populate_range(uint8_t *start, size_t length, int advice) {
        size_t page = (size_t) sysconf(_SC_PAGESIZE);
        int r;

        do
                r = madvise(start, length, advice);
        while (r < 0 && (errno == EINTR || errno == EAGAIN));
        if (r == 0)
                return 0;
        if (errno != EINVAL)
                return errno;
        /* A kernel without MADV_POPULATE_*: a read per page faults it in. */
        for (size_t off = 0; off < length; off += page)
                (void) *(volatile const uint8_t *) (start + off);
        return 0;
}

static void *populate_job_run(void *userdata) {
        PopulateJob *j = userdata;
        j->error = populate_range(j->start, j->length, j->advice);
        return NULL;
}

int familyd_shard_populate(void *ptr, uint64_t size, FamilydMapMode mode) {
        PopulateJob jobs[FAMILYD_POPULATE_MAX_THREADS];
        pthread_t threads[FAMILYD_POPULATE_MAX_THREADS];
        bool started[FAMILYD_POPULATE_MAX_THREADS] = {};
        size_t page = (size_t) sysconf(_SC_PAGESIZE), n, per;
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        int r = 0;

        if (!ptr || size == 0 || size > SIZE_MAX || !familyd_map_mode_to_string(mode))
                return -EINVAL;
        /* A private mapping is read through (writing would copy every page); a shared
         * writable one is populated writable, so its first writes do not fault either. */
        int advice = mode == FAMILYD_MAP_SHARED ? MADV_POPULATE_WRITE : MADV_POPULATE_READ;
        n = (size_t) (size / FAMILYD_POPULATE_BYTES_PER_THREAD);
        n = MAX(n, (size_t) 1);
        n = MIN(n, (size_t) FAMILYD_POPULATE_MAX_THREADS);
        n = MIN(n, (size_t) MAX(cpus, 1L));
        /* Whole 2 MiB pieces per thread: a huge page never straddles two ranges. */
        per = ((size_t) size / n + (2u << 20) - 1) & ~(size_t) ((2u << 20) - 1);
        per = MAX(per, page);
        for (size_t i = 0; i < n; i++) {
                size_t off = MIN(i * per, (size_t) size);
                jobs[i] = (PopulateJob) { (uint8_t *) ptr + off, MIN(per, (size_t) size - off),
                                          advice, 0 };
        }
        /* Job 0 runs on this thread; a thread that cannot start has its job run here too. */
        for (size_t i = 1; i < n; i++)
                started[i] = jobs[i].length > 0 &&
                             pthread_create(&threads[i], NULL, populate_job_run, &jobs[i]) == 0;
        for (size_t i = 0; i < n; i++)
                if (!started[i] && jobs[i].length > 0)
                        (void) populate_job_run(&jobs[i]);
        for (size_t i = 1; i < n; i++)
                if (started[i])
                        (void) pthread_join(threads[i], NULL);
        for (size_t i = 0; i < n && r == 0; i++)
                r = -jobs[i].error;
        return r;
}

int familyd_shard_map_flags(int fd, uint64_t size, FamilydMapMode mode, unsigned flags,
                            void **ret_ptr) {
        int prot = PROT_READ, map_flags = MAP_SHARED, r;
        void *p;

        if (fd < 0 || size == 0 || size > SIZE_MAX || !ret_ptr ||
            !familyd_map_mode_to_string(mode) || (flags & ~FAMILYD_MAP_LAZY))
                return -EINVAL;
        if (mode != FAMILYD_MAP_READ_ONLY)
                prot |= PROT_WRITE;
        if (mode == FAMILYD_MAP_PRIVATE)
                map_flags = MAP_PRIVATE;
        p = mmap(NULL, (size_t) size, prot, map_flags, fd, 0);
        /* A private mapping of a hugetlb shard reserves a huge page for each possible copy;
         * where the pool has none left (the daemon's shards hold them), it maps without the
         * reservation: reads need none, and a write finding no free huge page is SIGBUS. */
        if (p == MAP_FAILED && errno == ENOMEM && mode == FAMILYD_MAP_PRIVATE)
                p = mmap(NULL, (size_t) size, prot, map_flags | MAP_NORESERVE, fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        /* Huge folios of a memfd under shmem THP `advise` are mapped huge only where the
         * mapping asks for them too; elsewhere (hugetlb, THP off) this does nothing. */
        (void) madvise(p, (size_t) size, MADV_HUGEPAGE);
        if (!(flags & FAMILYD_MAP_LAZY)) {
                r = familyd_shard_populate(p, size, mode);
                if (r < 0) {
                        (void) munmap(p, (size_t) size);
                        return r;
                }
        }
        *ret_ptr = p;
        return 0;
}

int familyd_shard_map_mode(int fd, uint64_t size, FamilydMapMode mode, void **ret_ptr) {
        return familyd_shard_map_flags(fd, size, mode, 0, ret_ptr);
}

int familyd_shard_map(int fd, uint64_t size, bool writable, void **ret_ptr) {
        return familyd_shard_map_mode(fd, size, writable ? FAMILYD_MAP_SHARED : FAMILYD_MAP_READ_ONLY, ret_ptr);
}

int familyd_shard_unmap(void *ptr, uint64_t size) {
        if (!ptr || size == 0 || size > SIZE_MAX)
                return -EINVAL;
        if (munmap(ptr, (size_t) size) < 0)
                return -errno;
        return 0;
}

/* ---- CUDA shards ------------------------------------------------------------------------ */

/* gRPC status numbers for the texts of CUDA failures. */
#define STATUS_INVALID_ARGUMENT 3
#define STATUS_FAILED_PRECONDITION 9
#define STATUS_UNAVAILABLE 14

/* The driver's entry points (common/cuda-driver.h), loaded on first use; why is not empty when
 * this process cannot use the driver, and says why. */
static CudaDriver client_cuda;
static char client_cuda_why[256];
static pthread_once_t client_cuda_once = PTHREAD_ONCE_INIT;

static void client_cuda_load(void) {
        const char *path = getenv(CUDA_DRIVER_ENV);
        char why[sizeof client_cuda_why - 64];
        CudaDriver d;

        int r = cuda_driver_load(&d, why, sizeof why);
        if (r == -ENOENT) {
                (void) snprintf(client_cuda_why, sizeof client_cuda_why,
                                "this client cannot map device memory: the CUDA driver (%s) is "
                                "not installed",
                                isempty(path) ? CUDA_DRIVER_LIBRARY : path);
                return;
        }
        if (r < 0) {
                (void) snprintf(client_cuda_why, sizeof client_cuda_why,
                                "this client cannot map device memory: %s", why);
                return;
        }
        if (!d.has_vmm) {
                (void) snprintf(client_cuda_why, sizeof client_cuda_why,
                                "this client cannot map device memory: the CUDA driver lacks %s",
                                d.vmm_missing);
                cuda_driver_close(&d);
                return;
        }
        client_cuda = d;
        CudaResult k = d.init(0);
        if (k != 0)
                (void) snprintf(client_cuda_why, sizeof client_cuda_why,
                                "this client cannot map device memory: cuInit failed: %s "
                                "(CUresult %d)",
                                cuda_driver_error(&d, k), k);
}

static int cuda_error_set(FamilydError *error, int code, const char *format, ...)
        __attribute__((format(printf, 3, 4)));
static int cuda_error_set(FamilydError *error, int code, const char *format, ...) {
        char text[512];
        va_list ap;

        if (!error)
                return 0;
        va_start(ap, format);
        (void) vsnprintf(text, sizeof text, format, ap);
        va_end(ap);
        return shard_error_set(error, code, text);
}

static const char *cuda_text(CudaResult r) {
        return cuda_driver_error(&client_cuda, r);
}

/* -EIO with the failed call in *error. */
static int cuda_call_failed(FamilydError *error, const char *call, int device, CudaResult r) {
        int k = cuda_error_set(error, STATUS_UNAVAILABLE, "%s on cuda:%d failed: %s (CUresult %d)",
                               call, device, cuda_text(r), r);
        return k < 0 ? k : -EIO;
}

struct FamilydCudaShard {
        int device;
        CudaDevice dev;
        CudaContext ctx;
        CudaMemHandle handle;
        CudaDevicePtr ptr;
        uint64_t size;
        bool imported, reserved, mapped, writable;
};

int familyd_cuda_available(FamilydError *ret_error) {
        familyd_error_clear(ret_error);
        (void) pthread_once(&client_cuda_once, client_cuda_load);
        if (!client_cuda_why[0])
                return 0;
        int k = cuda_error_set(ret_error, STATUS_FAILED_PRECONDITION, "%s", client_cuda_why);
        return k < 0 ? k : -ENOENT;
}

FamilydCudaShard *familyd_cuda_shard_free(FamilydCudaShard *s) {
        const CudaDriver *c = &client_cuda;

        if (!s)
                return NULL;
        if (s->ctx)
                (void) c->ctx_set_current(s->ctx);
        if (s->mapped)
                (void) c->mem_unmap(s->ptr, (size_t) s->size);
        if (s->reserved)
                (void) c->mem_address_free(s->ptr, (size_t) s->size);
        if (s->imported)
                (void) c->mem_release(s->handle);
        if (s->ctx)
                (void) c->primary_ctx_release(s->dev);
        free(s);
        return NULL;
}

int familyd_cuda_shard_import(int fd, uint64_t size, int device, bool writable,
                              FamilydCudaShard **ret_shard, FamilydError *ret_error) {
        const CudaDriver *c = &client_cuda;
        FamilydCudaShard *s;
        CudaResult r;
        int k;

        familyd_error_clear(ret_error);
        if (fd < 0 || size == 0 || size > SIZE_MAX || device < 0 || !ret_shard)
                return -EINVAL;
        k = familyd_cuda_available(ret_error);
        if (k < 0)
                return k;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        s->device = device;
        s->size = size;

        r = c->device_get(&s->dev, device);
        if (r != 0) {
                k = cuda_error_set(ret_error, STATUS_FAILED_PRECONDITION,
                                   "this process has no CUDA device %d: %s (CUresult %d)", device,
                                   cuda_text(r), r);
                familyd_cuda_shard_free(s);
                return k < 0 ? k : -ENODEV;
        }
        r = c->primary_ctx_retain(&s->ctx, s->dev);
        if (r != 0) {
                s->ctx = NULL;
                k = cuda_call_failed(ret_error, "cuDevicePrimaryCtxRetain", device, r);
                familyd_cuda_shard_free(s);
                return k;
        }
        r = c->ctx_set_current(s->ctx);
        if (r == 0) {
                r = c->mem_import_from_shareable_handle(
                        &s->handle, (void *) (intptr_t) fd,
                        CUDA_DRIVER_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
                s->imported = r == 0;
                if (r != 0)
                        k = cuda_call_failed(ret_error, "cuMemImportFromShareableHandle", device,
                                             r);
        } else
                k = cuda_call_failed(ret_error, "cuCtxSetCurrent", device, r);
        if (r == 0) {
                /* size is the allocation's (the shard socket's sizes): a multiple of its
                 * granularity, as reservations and mappings need. */
                r = c->mem_address_reserve(&s->ptr, (size_t) size, 0, 0, 0);
                s->reserved = r == 0;
                if (r != 0)
                        k = cuda_call_failed(ret_error, "cuMemAddressReserve", device, r);
        }
        if (r == 0) {
                r = c->mem_map(s->ptr, (size_t) size, 0, s->handle, 0);
                s->mapped = r == 0;
                if (r != 0)
                        k = cuda_call_failed(ret_error, "cuMemMap", device, r);
        }
        if (r == 0) {
                CudaMemAccessDesc access = {
                        .location = { .type = CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE, .id = device },
                        .flags = writable ? CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READWRITE
                                          : CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READ,
                };
                r = c->mem_set_access(s->ptr, (size_t) size, &access, 1);
                if (r != 0 && !writable) {
                        /* A driver without read-only device mappings: read-write, said so by
                         * familyd_cuda_shard_writable(). Read-only is advisory for GPU shards
                         * anyway (the descriptor carries no access mode). */
                        access.flags = CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READWRITE;
                        r = c->mem_set_access(s->ptr, (size_t) size, &access, 1);
                        writable = r == 0;
                }
                if (r != 0)
                        k = cuda_call_failed(ret_error, "cuMemSetAccess", device, r);
        }
        if (r != 0) {
                familyd_cuda_shard_free(s);
                return k;
        }
        s->writable = writable;
        *ret_shard = s;
        return 0;
}

/* Host memory a private copy goes through, at most this much at a time: the driver table
 * has no device-to-device copy, and a shard is copied once, when it is imported. */
#define PRIVATE_COPY_CHUNK ((size_t) 64 << 20)

/* A new allocation of s->size bytes on s's device (s->ctx current), mapped read-write. */
static int private_allocate(FamilydCudaShard *s, FamilydError *ret_error) {
        const CudaDriver *c = &client_cuda;
        CudaMemAllocationProp prop = {
                .type = CUDA_DRIVER_MEM_ALLOCATION_TYPE_PINNED,
                .location = { .type = CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE, .id = s->device },
        };
        CudaMemAccessDesc access = {
                .location = { .type = CUDA_DRIVER_MEM_LOCATION_TYPE_DEVICE, .id = s->device },
                .flags = CUDA_DRIVER_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        CudaResult r;

        r = c->mem_create(&s->handle, (size_t) s->size, &prop, 0);
        s->imported = r == 0;
        if (r != 0)
                return cuda_call_failed(ret_error, "cuMemCreate", s->device, r);
        r = c->mem_address_reserve(&s->ptr, (size_t) s->size, 0, 0, 0);
        s->reserved = r == 0;
        if (r != 0)
                return cuda_call_failed(ret_error, "cuMemAddressReserve", s->device, r);
        r = c->mem_map(s->ptr, (size_t) s->size, 0, s->handle, 0);
        s->mapped = r == 0;
        if (r != 0)
                return cuda_call_failed(ret_error, "cuMemMap", s->device, r);
        r = c->mem_set_access(s->ptr, (size_t) s->size, &access, 1);
        if (r != 0)
                return cuda_call_failed(ret_error, "cuMemSetAccess", s->device, r);
        s->writable = true;
        return 0;
}

/* The shard's bytes from src into dst, through host memory. */
static int private_copy(const FamilydCudaShard *src, FamilydCudaShard *dst,
                        FamilydError *ret_error) {
        const CudaDriver *c = &client_cuda;
        size_t chunk = (size_t) MIN((uint64_t) PRIVATE_COPY_CHUNK, src->size);
        uint8_t *buf = malloc(chunk);
        int k = 0;

        if (!buf)
                return -ENOMEM;
        for (uint64_t off = 0; off < src->size && k == 0; off += chunk) {
                size_t n = (size_t) MIN((uint64_t) chunk, src->size - off);
                CudaResult r = c->memcpy_dtoh(buf, src->ptr + off, n);
                if (r != 0)
                        k = cuda_call_failed(ret_error, "cuMemcpyDtoH", src->device, r);
                else if ((r = c->memcpy_htod(dst->ptr + off, buf, n)) != 0)
                        k = cuda_call_failed(ret_error, "cuMemcpyHtoD", dst->device, r);
        }
        free(buf);
        return k;
}

int familyd_cuda_shard_import_private(int fd, uint64_t size, int device,
                                      FamilydCudaShard **ret_shard, FamilydError *ret_error) {
        const CudaDriver *c = &client_cuda;
        FamilydCudaShard *src = NULL, *s;
        CudaResult r;
        int k;

        k = familyd_cuda_shard_import(fd, size, device, false, &src, ret_error);
        if (k < 0)
                return k;
        s = calloc(1, sizeof *s);
        if (!s) {
                familyd_cuda_shard_free(src);
                return -ENOMEM;
        }
        *s = (FamilydCudaShard) { .device = device, .dev = src->dev, .size = size };
        r = c->primary_ctx_retain(&s->ctx, s->dev);
        if (r != 0) {
                s->ctx = NULL;
                k = cuda_call_failed(ret_error, "cuDevicePrimaryCtxRetain", device, r);
        } else if ((r = c->ctx_set_current(s->ctx)) != 0)
                k = cuda_call_failed(ret_error, "cuCtxSetCurrent", device, r);
        else
                k = private_allocate(s, ret_error);
        if (k == 0)
                k = private_copy(src, s, ret_error);
        familyd_cuda_shard_free(src);
        if (k < 0) {
                familyd_cuda_shard_free(s);
                return k;
        }
        *ret_shard = s;
        return 0;
}

uint64_t familyd_cuda_shard_pointer(const FamilydCudaShard *s) {
        return s ? s->ptr : 0;
}

uint64_t familyd_cuda_shard_size(const FamilydCudaShard *s) {
        return s ? s->size : 0;
}

int familyd_cuda_shard_device(const FamilydCudaShard *s) {
        return s ? s->device : -1;
}

bool familyd_cuda_shard_writable(const FamilydCudaShard *s) {
        return s && s->writable;
}

int familyd_cuda_shard_read(const FamilydCudaShard *s, uint64_t offset, void *dst, size_t n,
                            FamilydError *ret_error) {
        const CudaDriver *c = &client_cuda;
        CudaResult r;

        familyd_error_clear(ret_error);
        if (!s || (!dst && n > 0) || offset > s->size || n > s->size - offset)
                return -EINVAL;
        if (n == 0)
                return 0;
        r = c->ctx_set_current(s->ctx);
        if (r == 0)
                r = c->memcpy_dtoh(dst, s->ptr + offset, n);
        if (r != 0)
                return cuda_call_failed(ret_error, "cuMemcpyDtoH", s->device, r);
        return 0;
}

/* shard.c: the shard socket client (design/api.md, "Shard handout"): tokens in, descriptors
 * out over SCM_RIGHTS, and mmap of what comes back. */

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "familyd-v1-shard.pb-c.h"
#include "familyd.h"
#include "macro.h"

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

int familyd_shard_fetch(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *const *tokens,
                size_t n,
                bool writable,
                int *ret_fds,
                uint64_t *ret_sizes,
                FamilydError *ret_error) {

        Familyd__V1__ShardFdRequest req = FAMILYD__V1__SHARD_FD_REQUEST__INIT;
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

        familyd_error_clear(ret_error);
        if (!tokens || n == 0 || n > FAMILYD_SHARD_MAX_TOKENS || !ret_fds)
                return -EINVAL;
        for (size_t i = 0; i < n; i++)
                if (!tokens[i])
                        return -EINVAL;
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

        req.n_tokens = n;
        req.tokens = (char **) tokens;
        req.writable = writable;
        packed = familyd__v1__shard_fd_request__get_packed_size(&req);
        if (packed > SHARD_MAX_FRAME_BYTES)
                return -E2BIG;
        out = malloc(4 + packed);
        if (!out)
                return -ENOMEM;
        out[0] = (uint8_t) packed;
        out[1] = (uint8_t) (packed >> 8);
        out[2] = (uint8_t) (packed >> 16);
        out[3] = (uint8_t) (packed >> 24);
        (void) familyd__v1__shard_fd_request__pack(&req, out + 4);

        if (timeout_ms > 0)
                x.deadline_ms = now_ms() + timeout_ms;

        x.fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (x.fd < 0)
                return -errno;
        if (connect(x.fd, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                if (errno != EINPROGRESS && errno != EAGAIN) {
                        r = -errno;
                        goto finish;
                }
                /* A full backlog: wait for the connection, then ask how it went. */
                int err = 0;
                socklen_t l = sizeof(err);

                r = exchange_wait(&x, POLLOUT);
                if (r < 0)
                        goto finish;
                if (getsockopt(x.fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0 || err != 0) {
                        r = err ? -err : -errno;
                        goto finish;
                }
        }

        r = exchange_send(&x, out, 4 + packed);
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
        if (x.fd_overflow || x.n_fds != n || reply->n_sizes != n) {
                r = -EBADMSG;
                goto finish;
        }

        for (size_t i = 0; i < n; i++) {
                ret_fds[i] = x.fds[i];
                if (ret_sizes)
                        ret_sizes[i] = reply->sizes[i];
        }
        x.n_fds = 0;
        r = 0;
finish:
        if (reply)
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        exchange_close_fds(&x);
        (void) safe_close(x.fd);
        return r;
}

int familyd_shard_map(int fd, uint64_t size, bool writable, void **ret_ptr) {
        void *p;

        if (fd < 0 || size == 0 || size > SIZE_MAX || !ret_ptr)
                return -EINVAL;
        p = mmap(NULL, (size_t) size, PROT_READ | (writable ? PROT_WRITE : 0), MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        *ret_ptr = p;
        return 0;
}

int familyd_shard_unmap(void *ptr, uint64_t size) {
        if (!ptr || size == 0 || size > SIZE_MAX)
                return -EINVAL;
        if (munmap(ptr, (size_t) size) < 0)
                return -errno;
        return 0;
}

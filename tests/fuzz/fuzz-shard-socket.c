/* fuzz-shard-socket.c: a byte stream sent to the real shard socket server, its replies checked. */

/*
 * DESIGN: the daemon's own ShardServer (daemon/handout/shard-socket.c, its thread and epoll loop)
 * runs in this process on a temporary socket, over a shard table holding two live tokens and a
 * released one. Each input is the byte stream one client sends on one connection: frames of a
 * 4-byte little-endian length and a ShardFdRequest, or anything else. The 32-character
 * placeholders "aaa...a", "bbb...b" and "ccc...c" in the input are replaced by the live tokens
 * and the released one before it is sent, so the fuzzer reaches the success paths (lookup,
 * descriptors over SCM_RIGHTS, read-only and writable handouts, back-pressure until the client
 * has read them) as well as the errors. No function of the server is called directly: no edit
 * of shard-socket.c was needed, and nothing of it is left out.
 *
 * The client sends without blocking while it reads, closes its sending side at the end, and
 * reads until the server closes. The replies are checked against a model of the protocol
 * (proto/familyd/v1/shard.proto), computed from the same bytes with the same protobuf-c:
 *  - one reply per complete frame, in order; none for a trailing partial frame;
 *  - a length over 65,536: the connection ends there, without a reply;
 *  - a frame that is not a ShardFdRequest: INVALID_ARGUMENT, then the connection ends;
 *  - more than 253 tokens: INVALID_ARGUMENT; any token not live: NOT_FOUND, no descriptor;
 *  - otherwise OK with one descriptor per token, the segment's size, kind and device, opened
 *    O_RDWR when writable was asked and O_RDONLY otherwise;
 *  - nothing left unanswered: the server ends the connection within 10 s (a stall aborts).
 */

#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>

#include "familyd-v1-shard.pb-c.h"
#include "common/log.h"
#include "shm/segment.h"
#include "handout/shard-socket.h"
#include "handout/shard-table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_TIMEOUT_MS 10000
#define FUZZ_N_SEGMENTS 3 /* the third is released */

static const uint64_t segment_sizes[FUZZ_N_SEGMENTS] = { 4096, 8192, 4096 };
static char *fuzz_dir, *fuzz_path;
static ShardTable *table;
static ShardServer *server;
static CheckpointDeposits *deposits;
static ShardSegment *segments[FUZZ_N_SEGMENTS];
static ShardToken tokens[FUZZ_N_SEGMENTS];

enum { EXPECT_OK, EXPECT_ERROR };

typedef struct Expect {
        int code;
        size_t n;            /* tokens, for OK */
        bool writable;
        int segment[SHARD_SOCKET_MAX_TOKENS];
} Expect;

static void cleanup(void) {
        server = shard_server_free(server);
        deposits = checkpoint_deposits_free(deposits);
        for (size_t i = 0; i < FUZZ_N_SEGMENTS; i++)
                segments[i] = shard_segment_unref(segments[i]);
        table = shard_table_unref(table);
        if (fuzz_dir)
                (void) rmdir(fuzz_dir);
        free(fuzz_path);
        free(fuzz_dir);
}

static void setup(void) {
        const char *tmp = getenv("TMPDIR");

        /* The server's debug lines (a connection closed, a frame refused) are noise here. */
        log_set_max_level(LOG_WARNING);
        if (asprintf(&fuzz_dir, "%s/fuzz-shard-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0 ||
            !mkdtemp(fuzz_dir) || asprintf(&fuzz_path, "%s/shard.sock", fuzz_dir) < 0)
                abort();
        if (shard_table_new(0, &table) < 0)
                abort();
        for (size_t i = 0; i < FUZZ_N_SEGMENTS; i++) {
                if (shard_segment_new_host("fuzz", segment_sizes[i], (int) i, &segments[i]) < 0)
                        abort();
                shard_segment_unmap(segments[i]);
                /* A writable build's segments: writable handouts are part of what is fuzzed
                 * (test-segment.c has the refusal of the others). */
                shard_segment_allow_writes(segments[i]);
                if (shard_segment_seal(segments[i]) < 0)
                        abort();
                if (shard_table_add(table, i < 2 ? "bld-live" : "bld-gone", segments[i],
                                    &tokens[i]) != 0)
                        abort();
        }
        if (shard_table_remove_group(table, "bld-gone") != 1)
                abort();
        if (shard_server_new(fuzz_path, table, &server) < 0 ||
            checkpoint_deposits_new(&deposits) < 0)
                abort();
        /* Deposits are served: a frame naming checkpoint files carries no descriptors here, so
         * it is refused for the count (descriptors are test_checkpoint_build.py's). */
        shard_server_set_checkpoint_deposits(server, deposits);
        atexit(cleanup);
}

/* Replaces the placeholders of the three tokens in place. */
static void substitute(uint8_t *buf, size_t n) {
        for (size_t i = 0; i + SHARD_TOKEN_LENGTH <= n; i++) {
                uint8_t c = buf[i];
                if (c < 'a' || c >= 'a' + FUZZ_N_SEGMENTS)
                        continue;
                size_t k = 1;
                while (k < SHARD_TOKEN_LENGTH && buf[i + k] == c)
                        k++;
                if (k < SHARD_TOKEN_LENGTH)
                        continue;
                memcpy(buf + i, tokens[c - 'a'].hex, SHARD_TOKEN_LENGTH);
                i += SHARD_TOKEN_LENGTH - 1;
        }
}

/* The replies the stream must get (DESIGN); returns how many, in ret (allocated). */
static size_t model(const uint8_t *buf, size_t n, Expect **ret) {
        Expect *e = NULL;
        size_t n_e = 0, pos = 0;

        while (n - pos >= 4) {
                uint32_t len = (uint32_t) buf[pos] | (uint32_t) buf[pos + 1] << 8 |
                               (uint32_t) buf[pos + 2] << 16 | (uint32_t) buf[pos + 3] << 24;
                if (len > SHARD_SOCKET_MAX_FRAME_BYTES || n - pos - 4 < len)
                        break;
                e = realloc(e, (n_e + 1) * sizeof *e);
                if (!e)
                        abort();
                Expect *x = &e[n_e++];
                *x = (Expect) { .code = 0 };

                Familyd__V1__ShardFdRequest *req =
                        familyd__v1__shard_fd_request__unpack(NULL, len, buf + pos + 4);
                pos += 4 + len;
                if (!req) {
                        x->code = 3; /* INVALID_ARGUMENT, then closed */
                        break;
                }
                if (req->n_tokens > SHARD_SOCKET_MAX_TOKENS || req->n_checkpoint_files > 0)
                        x->code = 3;
                else
                        for (size_t i = 0; i < req->n_tokens && x->code == 0; i++) {
                                x->segment[i] = -1;
                                for (int s = 0; s < 2; s++)
                                        if (streq(req->tokens[i], tokens[s].hex))
                                                x->segment[i] = s;
                                if (x->segment[i] < 0)
                                        x->code = 5; /* NOT_FOUND */
                        }
                x->n = req->n_tokens;
                x->writable = req->writable;
                familyd__v1__shard_fd_request__free_unpacked(req, NULL);
        }
        *ret = e;
        return n_e;
}

static int64_t now_ms(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void check_reply(const Expect *x, const uint8_t *payload, size_t size, int *fds,
                        size_t *n_fds) {
        Familyd__V1__ShardFdReply *reply = familyd__v1__shard_fd_reply__unpack(NULL, size, payload);

        if (!reply || reply->code != x->code) {
                fprintf(stderr, "fuzz-shard-socket: reply code %d, expected %d\n",
                        reply ? reply->code : -1, x->code);
                abort();
        }
        if (x->code != 0) {
                if (reply->n_sizes != 0 || isempty(reply->message))
                        abort();
        } else {
                if (reply->n_sizes != x->n || reply->n_device_kinds != x->n ||
                    reply->n_devices != x->n || *n_fds < x->n)
                        abort();
                for (size_t i = 0; i < x->n; i++) {
                        int s = x->segment[i];
                        if (reply->sizes[i] != segment_sizes[s] || reply->devices[i] != s ||
                            !streq(reply->device_kinds[i], "host"))
                                abort();
                        int mode = fcntl(fds[i], F_GETFL);
                        if (mode < 0 || (mode & O_ACCMODE) != (x->writable ? O_RDWR : O_RDONLY))
                                abort();
                        if (lseek(fds[i], 0, SEEK_END) != (off_t) segment_sizes[s])
                                abort();
                        close(fds[i]);
                }
                memmove(fds, fds + x->n, (*n_fds - x->n) * sizeof(int));
                *n_fds -= x->n;
        }
        familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
}

/* Checks every complete reply frame in in[0, *n_in), in order, and takes it out. */
static void take_replies(uint8_t *in, size_t *n_in, const Expect *expect, size_t n_expect,
                         size_t *n_got, int *fds, size_t *n_fds) {
        for (;;) {
                if (*n_in < 4)
                        return;
                uint32_t len = (uint32_t) in[0] | (uint32_t) in[1] << 8 |
                               (uint32_t) in[2] << 16 | (uint32_t) in[3] << 24;
                if (len > SHARD_SOCKET_MAX_FRAME_BYTES)
                        abort();
                if (*n_in - 4 < len)
                        return;
                if (*n_got >= n_expect) {
                        fprintf(stderr, "fuzz-shard-socket: more replies than complete frames "
                                        "(%zu)\n", n_expect);
                        abort();
                }
                check_reply(&expect[(*n_got)++], in + 4, len, fds, n_fds);
                memmove(in, in + 4 + len, *n_in - 4 - len);
                *n_in -= 4 + len;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!server)
                setup();

        uint8_t *out = malloc(size ? size : 1);
        if (!out)
                abort();
        memcpy(out, data, size);
        substitute(out, size);

        Expect *expect = NULL;
        size_t n_expect = model(out, size, &expect), n_got = 0;

        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        memcpy(sa.sun_path, fuzz_path, strlen(fuzz_path));
        if (fd < 0 || connect(fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                abort();

        size_t sent = 0, n_in = 0, cap = 0, n_fds = 0;
        uint8_t *in = NULL;
        int fds[4 * SHARD_SOCKET_MAX_TOKENS];
        bool wr_open = true;
        int64_t deadline = now_ms() + FUZZ_TIMEOUT_MS;

        for (;;) {
                if (wr_open && sent == size) {
                        (void) shutdown(fd, SHUT_WR);
                        wr_open = false;
                }
                struct pollfd p = { .fd = fd, .events = POLLIN | (wr_open ? POLLOUT : 0) };
                int64_t left = deadline - now_ms();
                if (left <= 0) {
                        fprintf(stderr, "fuzz-shard-socket: the server did not end the "
                                        "connection within %d ms\n", FUZZ_TIMEOUT_MS);
                        abort();
                }
                if (poll(&p, 1, (int) left) < 0 && errno != EINTR)
                        abort();
                if (wr_open && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
                        ssize_t k = send(fd, out + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
                        if (k > 0)
                                sent += (size_t) k;
                        else if (k < 0 && errno != EAGAIN && errno != EINTR)
                                sent = size; /* the server has closed: stop sending */
                }
                if (!(p.revents & (POLLIN | POLLHUP | POLLERR)))
                        continue;

                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * SHARD_SOCKET_MAX_TOKENS)];
                } control;
                /* Complete frames are taken out below: less than one frame is ever left. */
                if (!in) {
                        cap = 2 * (SHARD_SOCKET_MAX_FRAME_BYTES + 4);
                        in = malloc(cap);
                        if (!in)
                                abort();
                }
                struct iovec iov = { .iov_base = in + n_in, .iov_len = cap - n_in };
                struct msghdr mh = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = control.buf,
                        .msg_controllen = sizeof control.buf,
                };
                ssize_t k = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
                if (k < 0 && (errno == EAGAIN || errno == EINTR))
                        continue;
                /* ECONNRESET: the server closed with our bytes unread (a frame it refused);
                 * what it sent before was read already. msg_controllen is stale then. */
                if (k < 0)
                        break;
                if (mh.msg_flags & MSG_CTRUNC)
                        abort();
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        size_t m = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        if (n_fds + m > ELEMENTSOF(fds))
                                abort();
                        memcpy(fds + n_fds, CMSG_DATA(c), m * sizeof(int));
                        n_fds += m;
                }
                if (k == 0)
                        break; /* EOF: the server ended the connection */
                n_in += (size_t) k;

                take_replies(in, &n_in, expect, n_expect, &n_got, fds, &n_fds);
        }

        if (n_got != n_expect || n_in != 0 || n_fds != 0) {
                fprintf(stderr, "fuzz-shard-socket: %zu replies of %zu expected, %zu bytes and "
                                "%zu descriptors left over\n", n_got, n_expect, n_in, n_fds);
                abort();
        }
        close(fd);
        free(in);
        free(expect);
        free(out);
        return 0;
}

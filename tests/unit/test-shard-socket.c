/* test-shard-socket.c: handout/shard-socket.c: tokens in, descriptors out over a real Unix socket; framing, limits, back-pressure, timeouts. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "familyd-v1-shard.pb-c.h"
#include "common/macro.h"
#include "shm/segment.h"
#include "handout/shard-socket.h"
#include "handout/shard-table.h"
#include "handout/token.h"
#include "sealed-segments.h"

typedef Familyd__V1__ShardFdRequest Request;
typedef Familyd__V1__ShardFdReply Reply;

static uint64_t now_ms(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000u + (uint64_t) ts.tv_nsec / 1000000u;
}

static size_t count_open_fds(void) {
        DIR *d = opendir("/proc/self/fd");
        size_t n = 0;

        assert_non_null(d);
        for (struct dirent *de; (de = readdir(d));)
                if (de->d_name[0] != '.')
                        n++;
        closedir(d);
        return n;
}

/* The server's thread closes its copies of handed-out descriptors just after sending them, so
 * a count taken right after a reply can still include them: this waits for it to settle. */

static size_t settled_open_fds(void) {
        size_t n = count_open_fds();
        for (unsigned i = 0; i < 100; i++) {
                usleep(10 * 1000);
                size_t m = count_open_fds();
                if (m == n)
                        return n;
                n = m;
        }
        fail_msg("the number of open descriptors does not settle");
        return 0;
}

/* ---- tokens ---- */

typedef struct Fixture {
        char dir[64];
        char path[128];
        ShardTable *table;
        ShardServer *server;
        ShardSegment *segments[3];
        ShardToken tokens[3];
        size_t fds_before;
} Fixture;

static const uint64_t fixture_sizes[3] = { 4096, 100, 1u << 20 };

static int fixture_setup(void **state) {
        Fixture *f = calloc(1, sizeof *f);

        assert_non_null(f);
        f->fds_before = count_open_fds();
        strcpy(f->dir, "/tmp/test-shm-XXXXXX");
        assert_non_null(mkdtemp(f->dir));
        (void) snprintf(f->path, sizeof f->path, "%s/shard.sock", f->dir);
        assert_int_equal(shard_table_new(0, &f->table), 0);
        for (unsigned i = 0; i < 3; i++) {
                /* A writable build's. */
                f->segments[i] = segment_make(fixture_sizes[i], (int) i + 1, (uint8_t) (0x10 + i),
                                              true);
                assert_int_equal(shard_table_add(f->table, "bld-test", f->segments[i],
                                                 &f->tokens[i]), 0);
        }
        /* A stale socket file is replaced. */
        int stale = open(f->path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
        assert_true(stale >= 0);
        close(stale);
        assert_int_equal(shard_server_new(f->path, f->table, &f->server), 0);
        struct stat st;
        assert_int_equal(stat(f->path, &st), 0);
        assert_true(S_ISSOCK(st.st_mode));
        assert_int_equal(st.st_mode & 0777, 0660);
        *state = f;
        return 0;
}

static int fixture_teardown(void **state) {
        Fixture *f = *state;

        f->server = shard_server_free(f->server);
        assert_int_equal(access(f->path, F_OK), -1);
        for (unsigned i = 0; i < 3; i++)
                shard_segment_unref(f->segments[i]);
        shard_table_unref(f->table);
        assert_int_equal(rmdir(f->dir), 0);
        /* The server's thread, epoll, connections and pending descriptors are all gone. */
        assert_int_equal(count_open_fds(), f->fds_before);
        free(f);
        return 0;
}

static int client_connect(const Fixture *f) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        struct timeval tv = { .tv_sec = 10 };
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

        assert_true(fd >= 0);
        strcpy(sa.sun_path, f->path);
        assert_int_equal(connect(fd, (struct sockaddr *) &sa, sizeof sa), 0);
        /* A hung server fails the test instead of hanging it. */
        assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
        return fd;
}

static void send_all(int fd, const void *data, size_t size) {
        const uint8_t *p = data;
        while (size > 0) {
                ssize_t k = send(fd, p, size, MSG_NOSIGNAL);
                assert_true(k > 0);
                p += k;
                size -= (size_t) k;
        }
}

static void send_frame(int fd, const void *data, uint32_t size) {
        uint8_t header[4] = { size & 0xff, (size >> 8) & 0xff, (size >> 16) & 0xff, size >> 24 };
        send_all(fd, header, 4);
        send_all(fd, data, size);
}

static void send_request(int fd, const char *const *tokens, size_t n, bool writable) {
        Request req = FAMILYD__V1__SHARD_FD_REQUEST__INIT;
        req.tokens = (char **) tokens;
        req.n_tokens = n;
        req.writable = writable;
        size_t size = familyd__v1__shard_fd_request__get_packed_size(&req);
        uint8_t *buf = malloc(size + 1);
        assert_non_null(buf);
        assert_int_equal(familyd__v1__shard_fd_request__pack(&req, buf), size);
        send_frame(fd, buf, (uint32_t) size);
        free(buf);
}

/* Reads exactly size bytes; the first recvmsg collects SCM_RIGHTS descriptors into fds. 0, or
 * -ECONNRESET at EOF before the first byte. */
static int recv_exact(int fd, void *buf, size_t size, int *fds, size_t *n_fds) {
        uint8_t *p = buf;
        size_t got = 0;

        while (got < size) {
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * 256)];
                } control;
                struct iovec iov = { .iov_base = p + got, .iov_len = size - got };
                struct msghdr mh = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = control.buf,
                        .msg_controllen = sizeof control.buf,
                };
                ssize_t k = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0 && errno == ECONNRESET && got == 0)
                        return -ECONNRESET;
                assert_true(k >= 0);
                if (k == 0) {
                        assert_int_equal(got, 0);
                        return -ECONNRESET;
                }
                assert_false(mh.msg_flags & MSG_CTRUNC);
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        assert_int_equal(c->cmsg_level, SOL_SOCKET);
                        assert_int_equal(c->cmsg_type, SCM_RIGHTS);
                        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        /* Only the first bytes of a reply carry descriptors. */
                        assert_int_equal(got, 0);
                        assert_non_null(fds);
                        memcpy(fds + *n_fds, CMSG_DATA(c), n * sizeof(int));
                        *n_fds += n;
                }
                got += (size_t) k;
        }
        return 0;
}

/* One reply and the descriptors that came with it; -ECONNRESET when the server closed. */
static int recv_reply(int fd, Reply **ret, int *fds, size_t *ret_n_fds) {
        uint8_t header[4];
        size_t n_fds = 0;
        int r;

        r = recv_exact(fd, header, 4, fds, &n_fds);
        if (r < 0)
                return r;
        uint32_t len = header[0] | header[1] << 8 | header[2] << 16 | (uint32_t) header[3] << 24;
        assert_true(len <= SHARD_SOCKET_MAX_FRAME_BYTES);
        uint8_t *body = malloc(len + 1);
        assert_non_null(body);
        if (len > 0)
                assert_int_equal(recv_exact(fd, body, len, NULL, &(size_t) { 0 }), 0);
        *ret = familyd__v1__shard_fd_reply__unpack(NULL, len, body);
        assert_non_null(*ret);
        free(body);
        *ret_n_fds = n_fds;
        return 0;
}

/* True when the server closes fd within timeout_ms (EOF, nothing else pending). */
static bool wait_closed(int fd, int timeout_ms) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        uint8_t buf[256];

        for (;;) {
                int n = poll(&p, 1, timeout_ms);
                if (n <= 0)
                        return false;
                ssize_t k = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
                if (k == 0 || (k < 0 && errno == ECONNRESET))
                        return true;
                if (k < 0)
                        return false;
        }
}

static void close_fds(int *fds, size_t n) {
        for (size_t i = 0; i < n; i++)
                close(fds[i]);
}

/* Asserts an OK reply for the fixture's tokens in the order of idx, with right descriptors. */
static void expect_ok(const Fixture *f, int fd, const unsigned *idx, size_t n, bool writable) {
        int fds[256];
        size_t n_fds = 0;
        Reply *reply = NULL;

        assert_int_equal(recv_reply(fd, &reply, fds, &n_fds), 0);
        assert_int_equal(reply->code, 0);
        assert_int_equal(n_fds, n);
        assert_int_equal(reply->n_sizes, n);
        assert_int_equal(reply->n_device_kinds, n);
        assert_int_equal(reply->n_devices, n);
        for (size_t i = 0; i < n; i++) {
                struct stat st;
                assert_int_equal(reply->sizes[i], fixture_sizes[idx[i]]);
                assert_string_equal(reply->device_kinds[i], "host");
                assert_int_equal(reply->devices[i], (int) idx[i] + 1);
                assert_int_equal(fstat(fds[i], &st), 0);
                assert_int_equal(st.st_size, fixture_sizes[idx[i]]);
                assert_int_equal(fcntl(fds[i], F_GETFL) & O_ACCMODE, writable ? O_RDWR : O_RDONLY);
                uint8_t *m = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fds[i], 0);
                assert_true(m != MAP_FAILED);
                assert_int_equal(m[0], 0x10 + idx[i]);
                assert_int_equal(m[st.st_size - 1], 0x10 + idx[i]);
                assert_int_equal(munmap(m, st.st_size), 0);
                if (!writable) {
                        assert_true(mmap(NULL, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                                         fds[i], 0) == MAP_FAILED);
                        assert_int_equal(errno, EACCES);
                }
                assert_int_equal(ftruncate(fds[i], 1), -1);
        }
        close_fds(fds, n_fds);
        familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
}

/* Asserts an error reply with no descriptors; returns the message (caller frees). */
static char *expect_error(int fd, int code) {
        int fds[256];
        size_t n_fds = 0;
        Reply *reply = NULL;

        assert_int_equal(recv_reply(fd, &reply, fds, &n_fds), 0);
        assert_int_equal(reply->code, code);
        assert_int_equal(n_fds, 0);
        assert_int_equal(reply->n_sizes, 0);
        assert_int_equal(reply->n_device_kinds, 0);
        assert_int_equal(reply->n_devices, 0);
        char *m = strdup(reply->message);
        familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        return m;
}

/* ---- the socket: tests ---- */

static void test_socket_three_in_order(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f);
        const char *tokens[] = { f->tokens[2].hex, f->tokens[0].hex, f->tokens[1].hex };
        const unsigned idx[] = { 2, 0, 1 };

        send_request(fd, tokens, 3, false);
        expect_ok(f, fd, idx, 3, false);

        /* Writable, and the same token twice (the fixture's segments allow writes). */
        const char *twice[] = { f->tokens[1].hex, f->tokens[1].hex };
        const unsigned idx2[] = { 1, 1 };
        send_request(fd, twice, 2, true);
        expect_ok(f, fd, idx2, 2, true);

        /* Writable of a segment that does not allow writes (a build not made writable):
         * PERMISSION_DENIED and no descriptor, even for the tokens that would allow it. */
        ShardToken ro;
        ShardSegment *s = segment_new(64, 0, 0x10);
        assert_int_equal(shard_table_add(f->table, "bld-read-only", s, &ro), 0);
        const char *mixed[] = { f->tokens[1].hex, ro.hex };
        send_request(fd, mixed, 2, true);
        _cleanup_free_ char *m = expect_error(fd, 7);
        assert_non_null(strstr(m, "shard 2 of 2 is read-only"));
        assert_non_null(strstr(m, "private"));
        const char *one[] = { ro.hex };
        send_request(fd, one, 1, false);
        int fds[4];
        size_t n_fds = 0;
        Reply *reply = NULL;
        assert_int_equal(recv_reply(fd, &reply, fds, &n_fds), 0);
        assert_int_equal(reply->code, 0);
        assert_int_equal(n_fds, 1);
        assert_int_equal(fcntl(fds[0], F_GETFL) & O_ACCMODE, O_RDONLY);
        close_fds(fds, n_fds);
        familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        assert_int_equal(shard_table_remove_group(f->table, "bld-read-only"), 1);
        shard_segment_unref(s);

        /* No tokens: OK and nothing. */
        send_request(fd, NULL, 0, false);
        expect_ok(f, fd, NULL, 0, false);
}

static void test_socket_not_found(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f);
        const char *bogus = "0123456789abcdef0123456789abcdef";
        const char *tokens[] = { f->tokens[0].hex, bogus, f->tokens[2].hex };
        _cleanup_free_ char *m = NULL, *m2 = NULL, *m3 = NULL;

        send_request(fd, tokens, 3, false);
        m = expect_error(fd, 5);
        assert_non_null(strstr(m, "2 of 3"));
        /* No secret in the message: neither the bad token nor the good ones. */
        assert_null(strstr(m, bogus));
        assert_null(strstr(m, f->tokens[0].hex));
        assert_null(strstr(m, f->tokens[2].hex));

        /* Released: one by one, then by group. */
        ShardToken extra;
        ShardSegment *s = segment_new(64, 0, 0x10);
        assert_int_equal(shard_table_add(f->table, "bld-other", s, &extra), 0);
        const char *one[] = { extra.hex };
        send_request(fd, one, 1, false);
        int fds[4];
        size_t n_fds = 0;
        Reply *reply = NULL;
        assert_int_equal(recv_reply(fd, &reply, fds, &n_fds), 0);
        assert_int_equal(reply->code, 0);
        assert_int_equal(n_fds, 1);
        close_fds(fds, n_fds);
        familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);

        assert_int_equal(shard_table_remove_group(f->table, "bld-other"), 1);
        shard_segment_unref(s);
        send_request(fd, one, 1, false);
        m2 = expect_error(fd, 5);
        assert_null(strstr(m2, extra.hex));

        assert_int_equal(shard_table_remove(f->table, f->tokens[1].hex), 0);
        const char *released[] = { f->tokens[0].hex, f->tokens[1].hex };
        send_request(fd, released, 2, true);
        m3 = expect_error(fd, 5);

        /* The connection lives on after NOT_FOUND. */
        const unsigned idx[] = { 0 };
        send_request(fd, tokens, 1, false);
        expect_ok(f, fd, idx, 1, false);
}

static void test_socket_too_many_tokens(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f);
        const char *tokens[254];
        unsigned idx[253];
        _cleanup_free_ char *m = NULL;

        for (size_t i = 0; i < 254; i++) {
                tokens[i] = f->tokens[i % 3].hex;
                if (i < 253)
                        idx[i] = (unsigned) (i % 3);
        }
        send_request(fd, tokens, 254, false);
        m = expect_error(fd, 3);
        assert_non_null(strstr(m, "254"));

        /* 253 is the most, and works: 253 descriptors in one reply. */
        send_request(fd, tokens, 253, false);
        expect_ok(f, fd, idx, 253, false);
}

static void test_socket_oversized_frame(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f), fd2 = client_connect(f);
        uint8_t header[4] = { 0, 0, 0x10, 0 }; /* 1 MiB */

        send_all(fd, header, 4);
        assert_true(wait_closed(fd, 3000));

        /* 65,537: one over. */
        uint8_t over[4] = { 0x01, 0x00, 0x01, 0x00 };
        send_all(fd2, over, 4);
        assert_true(wait_closed(fd2, 3000));

        /* Exactly 65,536 bytes is a frame: here, one valid token plus padding in an unknown
         * field, which protobuf-c skips. */
        _cleanup_close_ int fd3 = client_connect(f);
        uint8_t *body = calloc(1, 65536);
        size_t n = 0;
        body[n++] = 0x0a; /* tokens, length-delimited */
        body[n++] = SHARD_TOKEN_LENGTH;
        memcpy(body + n, f->tokens[0].hex, SHARD_TOKEN_LENGTH);
        n += SHARD_TOKEN_LENGTH;
        size_t pad = 65536 - n - 4; /* field 15 (0x7a), a 3-byte length */
        body[n++] = 0x7a;
        body[n++] = (uint8_t) (0x80 | (pad & 0x7f));
        body[n++] = (uint8_t) (0x80 | ((pad >> 7) & 0x7f));
        body[n++] = (uint8_t) (pad >> 14);
        assert_int_equal(n + pad, 65536);
        send_frame(fd3, body, 65536);
        free(body);
        const unsigned idx[] = { 0 };
        expect_ok(f, fd3, idx, 1, false);
}

static void test_socket_garbage(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f), fd2 = client_connect(f),
                            fd3 = client_connect(f);
        const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        _cleanup_free_ char *m = NULL;

        /* Not our framing at all: the "length" is far over the limit. */
        send_all(fd, http, strlen(http));
        assert_true(wait_closed(fd, 3000));

        /* Framed, but not a ShardFdRequest: INVALID_ARGUMENT, then closed. */
        uint8_t junk[16];
        memset(junk, 0xff, sizeof junk);
        send_frame(fd2, junk, sizeof junk);
        m = expect_error(fd2, 3);
        assert_non_null(strstr(m, "ShardFdRequest"));
        assert_true(wait_closed(fd2, 3000));

        /* Meanwhile others are served. */
        const char *tokens[] = { f->tokens[1].hex };
        const unsigned idx[] = { 1 };
        send_request(fd3, tokens, 1, false);
        expect_ok(f, fd3, idx, 1, false);
}

static void test_socket_idle_timeout(void **state) {
        Fixture *f = *state;

        shard_server_set_idle_timeout(f->server, 300);
        _cleanup_close_ int silent = client_connect(f), trickle = client_connect(f),
                            busy = client_connect(f);
        uint64_t start = now_ms(), silent_closed = 0, trickle_closed = 0;
        const char *tokens[] = { f->tokens[0].hex, f->tokens[1].hex };
        const unsigned idx[] = { 0, 1 };
        unsigned served = 0;
        uint8_t header[4] = { 10, 0, 0, 0 };
        unsigned trickled = 0;

        while ((!silent_closed || !trickle_closed) && now_ms() - start < 5000) {
                send_request(busy, tokens, 2, false);
                expect_ok(f, busy, idx, 2, false);
                served++;
                /* A byte now and then does not count as activity: only whole frames do. */
                if (!trickle_closed && trickled < 4) {
                        (void) send(trickle, header + trickled, 1, MSG_NOSIGNAL);
                        trickled++;
                }
                if (!silent_closed && wait_closed(silent, 0))
                        silent_closed = now_ms() - start;
                if (!trickle_closed && wait_closed(trickle, 0))
                        trickle_closed = now_ms() - start;
                usleep(20 * 1000);
        }
        print_message("silent closed after %llu ms, trickle after %llu ms, %u requests served "
                      "meanwhile\n",
                      (unsigned long long) silent_closed, (unsigned long long) trickle_closed,
                      served);
        assert_true(silent_closed >= 250 && silent_closed < 3000);
        assert_true(trickle_closed >= 250 && trickle_closed < 3000);
        assert_true(served >= 5);

        /* The busy one lives on while it keeps asking. */
        send_request(busy, tokens, 2, false);
        expect_ok(f, busy, idx, 2, false);
}

static void test_socket_sequential(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f);
        const char *tokens[] = { f->tokens[0].hex, f->tokens[1].hex, f->tokens[2].hex };
        const char *bad[] = { f->tokens[0].hex, "x" };

        for (unsigned i = 0; i < 500; i++) {
                const unsigned idx[] = { i % 3, (i + 1) % 3, (i + 2) % 3 };
                const char *order[] = { tokens[idx[0]], tokens[idx[1]], tokens[idx[2]] };
                if (i % 7 == 3) {
                        send_request(fd, bad, 2, false);
                        free(expect_error(fd, 5));
                        continue;
                }
                send_request(fd, order, 1 + i % 3, i % 2);
                expect_ok(f, fd, idx, 1 + i % 3, i % 2);
        }

        /* Pipelined: ten requests before reading any reply. */
        for (unsigned i = 0; i < 10; i++)
                send_request(fd, tokens, 3, false);
        const unsigned idx[] = { 0, 1, 2 };
        for (unsigned i = 0; i < 10; i++)
                expect_ok(f, fd, idx, 3, false);
}

typedef struct Flooder {
        int fd;
        const char *token;
        unsigned n;
} Flooder;

static void *flood(void *userdata) {
        Flooder *fl = userdata;
        const char *bad[] = { "not-a-token" };
        const char *good[] = { fl->token };

        for (unsigned i = 0; i < fl->n; i++) {
                if (i % 4 == 0)
                        send_request(fl->fd, good, 1, false);
                else
                        send_request(fl->fd, bad, 1, false);
        }
        return NULL;
}

static void test_socket_slow_reader(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int slow = client_connect(f), other = client_connect(f);
        Flooder fl = { .fd = slow, .token = f->tokens[2].hex, .n = 3000 };
        pthread_t thread;

        /* The slow client's replies fill its socket: the server must keep them queued and
         * watch for room, while it serves others. */
        assert_int_equal(pthread_create(&thread, NULL, flood, &fl), 0);
        usleep(300 * 1000);
        const char *tokens[] = { f->tokens[0].hex };
        const unsigned idx[] = { 0 }, idx2[] = { 2 };
        uint64_t t0 = now_ms();
        send_request(other, tokens, 1, false);
        expect_ok(f, other, idx, 1, false);
        assert_true(now_ms() - t0 < 5000);

        for (unsigned i = 0; i < fl.n; i++) {
                if (i % 4 == 0)
                        expect_ok(f, slow, idx2, 1, false);
                else
                        free(expect_error(slow, 5));
        }
        assert_int_equal(pthread_join(thread, NULL), 0);
}

static void test_socket_out_of_fds(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f);
        const char *tokens[253];
        const unsigned idx[] = { 0, 1, 2 };
        struct rlimit saved, low;
        _cleanup_free_ char *m = NULL;

        for (size_t i = 0; i < 253; i++)
                tokens[i] = f->tokens[i % 3].hex;

        /* The server has accepted the connection once it answers. */
        send_request(fd, tokens, 3, false);
        expect_ok(f, fd, idx, 3, false);

        /* Room for a few descriptors, not 253: all or nothing, and nothing leaks. */
        assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
        low = saved;
        size_t before = settled_open_fds();
        low.rlim_cur = before + 16;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
        send_request(fd, tokens, 253, false);
        m = expect_error(fd, 8);
        assert_int_equal(count_open_fds(), before);
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);

        send_request(fd, tokens, 3, false);
        expect_ok(f, fd, idx, 3, false);
}

static void test_socket_connection_cap(void **state) {
        Fixture *f = *state;

        shard_server_set_max_connections(f->server, 2);
        _cleanup_close_ int a = client_connect(f), b = client_connect(f);
        const char *tokens[] = { f->tokens[0].hex };
        const unsigned idx[] = { 0 };

        /* Both accepted before the third arrives. */
        send_request(a, tokens, 1, false);
        expect_ok(f, a, idx, 1, false);
        send_request(b, tokens, 1, false);
        expect_ok(f, b, idx, 1, false);
        _cleanup_close_ int c = client_connect(f);
        assert_true(wait_closed(c, 3000));
        send_request(a, tokens, 1, false);
        expect_ok(f, a, idx, 1, false);

        /* A slot freed is a slot for the next one, once the server has seen the close. */
        a = safe_close(a);
        for (unsigned tries = 0;; tries++) {
                _cleanup_close_ int d = client_connect(f);
                if (wait_closed(d, 100)) {
                        assert_true(tries < 30);
                        continue;
                }
                send_request(d, tokens, 1, false);
                expect_ok(f, d, idx, 1, false);
                break;
        }
}

static void test_socket_free_with_clients(void **state) {
        Fixture *f = *state;
        int fd = client_connect(f), fd2 = client_connect(f);
        uint8_t partial[2] = { 5, 0 };

        /* A half-sent frame and an unread reply when the server stops: teardown checks that
         * nothing leaks. */
        send_all(fd, partial, 2);
        const char *tokens[] = { f->tokens[0].hex };
        send_request(fd2, tokens, 1, false);
        usleep(100 * 1000);
        f->server = shard_server_free(f->server);
        assert_true(wait_closed(fd, 1000));
        close(fd);
        close(fd2);
}

static void test_socket_uid_cap(void **state) {
        Fixture *f = *state;
        const char *tokens[] = { f->tokens[0].hex };
        const unsigned idx[] = { 0 };

        /* Every connection here is uid 0's, which counts like any other uid. */
        shard_server_set_max_connections_per_uid(f->server, 3);
        _cleanup_close_ int a = client_connect(f), b = client_connect(f), c = client_connect(f);
        send_request(a, tokens, 1, false);
        expect_ok(f, a, idx, 1, false);
        send_request(b, tokens, 1, false);
        expect_ok(f, b, idx, 1, false);
        send_request(c, tokens, 1, false);
        expect_ok(f, c, idx, 1, false);

        /* The fourth is closed at once; the first three are still served. */
        _cleanup_close_ int d = client_connect(f);
        assert_true(wait_closed(d, 3000));
        send_request(a, tokens, 1, false);
        expect_ok(f, a, idx, 1, false);
        send_request(c, tokens, 1, false);
        expect_ok(f, c, idx, 1, false);

        /* A slot freed is reusable, once the server has seen the close. */
        b = safe_close(b);
        for (unsigned tries = 0;; tries++) {
                _cleanup_close_ int e = client_connect(f);
                if (wait_closed(e, 100)) {
                        assert_true(tries < 30);
                        continue;
                }
                send_request(e, tokens, 1, false);
                expect_ok(f, e, idx, 1, false);
                break;
        }
}

/* Bytes the server has sent to fd that fd has not read yet. */
static int unread_bytes(int fd) {
        int n = -1;
        assert_int_equal(ioctl(fd, FIONREAD, &n), 0);
        return n;
}

/* The size of a reply on the wire, frame header included. */
static int reply_wire_size(const Reply *reply) {
        return 4 + (int) familyd__v1__shard_fd_reply__get_packed_size(reply);
}

static void test_socket_backpressure(void **state) {
        Fixture *f = *state;
        _cleanup_close_ int fd = client_connect(f);
        const char *bogus[] = { "not-a-token" };

        /* Three requests for descriptors, none read: only the first reply is sent. */
        for (unsigned i = 0; i < 3; i++) {
                const char *tokens[] = { f->tokens[i].hex };
                send_request(fd, tokens, 1, false);
        }
        for (unsigned i = 0; i < 3; i++) {
                int fds[4];
                size_t n_fds = 0;
                Reply *reply = NULL;

                usleep(300 * 1000);
                int queued = unread_bytes(fd);
                assert_int_equal(recv_reply(fd, &reply, fds, &n_fds), 0);
                /* In order, and alone in the socket until read. */
                assert_int_equal(reply->code, 0);
                assert_int_equal(n_fds, 1);
                assert_int_equal(reply->n_devices, 1);
                assert_int_equal(reply->devices[0], (int) i + 1);
                assert_int_equal(queued, reply_wire_size(reply));
                close_fds(fds, n_fds);
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        }
        usleep(100 * 1000);
        assert_int_equal(unread_bytes(fd), 0);

        /* Replies without descriptors still pipeline: two errors, then one with descriptors,
         * all sent before any is read; the request after it waits. */
        const char *t0[] = { f->tokens[0].hex }, *t1[] = { f->tokens[1].hex };
        const unsigned idx0[] = { 0 }, idx1[] = { 1 };
        send_request(fd, bogus, 1, false);
        send_request(fd, bogus, 1, false);
        send_request(fd, t0, 1, false);
        send_request(fd, t1, 1, false);
        usleep(300 * 1000);
        int queued = unread_bytes(fd);
        Reply *reply = NULL;
        size_t n_fds = 0;
        int total = 0;
        for (unsigned i = 0; i < 2; i++) {
                assert_int_equal(recv_reply(fd, &reply, NULL, &n_fds), 0);
                assert_int_equal(reply->code, 5);
                total += reply_wire_size(reply);
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        }
        assert_true(queued > total);
        expect_ok(f, fd, idx0, 1, false);
        expect_ok(f, fd, idx1, 1, false);
}

static void test_socket_unread_timeout(void **state) {
        Fixture *f = *state;
        const char *t0[] = { f->tokens[0].hex }, *t1[] = { f->tokens[1].hex },
                   *t2[] = { f->tokens[2].hex };
        const unsigned idx0[] = { 0 }, idx2[] = { 2 };

        shard_server_set_idle_timeout(f->server, 100);
        shard_server_set_unread_timeout(f->server, 700);
        shard_server_set_max_connections_per_uid(f->server, 1);
        _cleanup_close_ int fd = client_connect(f);
        uint64_t start = now_ms();
        send_request(fd, t0, 1, false);
        send_request(fd, t1, 1, false);

        /* Well past the idle timeout: not closed, and its slot still counts. */
        usleep(350 * 1000);
        struct pollfd p = { .fd = fd, .events = POLLRDHUP };
        assert_int_equal(poll(&p, 1, 0), 0);
        _cleanup_close_ int other = client_connect(f);
        assert_true(wait_closed(other, 3000));

        /* At the unread timeout it is shut down ... */
        assert_int_equal(poll(&p, 1, 5000), 1);
        assert_true(p.revents & POLLRDHUP);
        uint64_t shut = now_ms() - start;
        print_message("shut down after %llu ms\n", (unsigned long long) shut);
        assert_true(shut >= 650 && shut < 5000);

        /* ... but holds its slot while the reply is unread. */
        _cleanup_close_ int other2 = client_connect(f);
        assert_true(wait_closed(other2, 3000));

        /* What was sent can still be read, then EOF: the second request got no answer. */
        expect_ok(f, fd, idx0, 1, false);
        Reply *reply = NULL;
        size_t n_fds = 0;
        assert_int_equal(recv_reply(fd, &reply, NULL, &n_fds), -ECONNRESET);

        /* Read, it frees the slot. */
        shard_server_set_idle_timeout(f->server, 0);
        for (unsigned tries = 0;; tries++) {
                _cleanup_close_ int e = client_connect(f);
                if (wait_closed(e, 100)) {
                        assert_true(tries < 30);
                        continue;
                }
                send_request(e, t2, 1, false);
                expect_ok(f, e, idx2, 1, false);
                break;
        }
}

typedef struct Starter {
        const char *path;
        ShardTable *table;
        ShardServer *server;
        int r;
} Starter;

/* Starts a server whose thread lacks CAP_SYS_ADMIN and CAP_SYS_RESOURCE (capabilities are per
 * thread, and a new thread inherits its creator's), so the in-flight limit applies to it. */
static void *start_unprivileged(void *userdata) {
        Starter *st = userdata;
        struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3];

        if (syscall(SYS_capget, &hdr, data) < 0) {
                st->r = -errno;
                return NULL;
        }
        data[CAP_TO_INDEX(CAP_SYS_ADMIN)].effective &= ~CAP_TO_MASK(CAP_SYS_ADMIN);
        data[CAP_TO_INDEX(CAP_SYS_RESOURCE)].effective &= ~CAP_TO_MASK(CAP_SYS_RESOURCE);
        if (syscall(SYS_capset, &hdr, data) < 0) {
                st->r = -errno;
                return NULL;
        }
        st->r = shard_server_new(st->path, st->table, &st->server);
        return NULL;
}

static void test_socket_inflight_limit(void **state) {
        Fixture *f = *state;
        enum { N_CONN = 12, N_TOKENS = 100 };
        const char *tokens[N_TOKENS];

        /* valgrind keeps descriptors of its own and emulates RLIMIT_NOFILE: the kernel's
         * in-flight accounting this test provokes cannot be reproduced under it. */
        const char *preload = getenv("LD_PRELOAD");
        if (preload && strstr(preload, "vgpreload")) {
                skip();
                return;
        }
        unsigned idx[N_TOKENS];
        int fds[N_CONN];
        Starter st = { .path = f->path, .table = f->table, .r = -1 };
        pthread_t thread;
        struct rlimit saved, low;
        size_t refused = N_CONN;
        _cleanup_free_ char *m = NULL;

        for (size_t i = 0; i < N_TOKENS; i++) {
                tokens[i] = f->tokens[i % 3].hex;
                idx[i] = (unsigned) (i % 3);
        }
        f->server = shard_server_free(f->server);
        assert_int_equal(pthread_create(&thread, NULL, start_unprivileged, &st), 0);
        assert_int_equal(pthread_join(thread, NULL), 0);
        assert_int_equal(st.r, 0);
        f->server = st.server;
        for (size_t i = 0; i < N_CONN; i++) {
                fds[i] = client_connect(f);
                send_request(fds[i], NULL, 0, false);
                expect_ok(f, fds[i], NULL, 0, false);
        }

        /* Descriptors in flight past RLIMIT_NOFILE (ours is the server's): the kernel refuses
         * the next SCM_RIGHTS send, and the client learns why instead of seeing a close. */
        assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
        low = saved;
        low.rlim_cur = settled_open_fds() + N_TOKENS + 20;
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
        for (size_t i = 0; i < N_CONN && refused == N_CONN; i++) {
                int queued = 0;
                send_request(fds[i], tokens, N_TOKENS, false);
                for (unsigned tries = 0; tries < 300 && queued == 0; tries++) {
                        usleep(10 * 1000);
                        queued = unread_bytes(fds[i]);
                }
                /* An OK reply names 100 sizes, kinds and devices; an error is short. */
                assert_true(queued > 0);
                if (queued < 200)
                        refused = i;
        }
        /* Others of our user may hold descriptors in flight too: the first may be refused. */
        assert_true(refused < N_CONN);
        m = expect_error(fds[refused], 8);
        assert_non_null(strstr(m, "in flight"));
        assert_int_equal(setrlimit(RLIMIT_NOFILE, &saved), 0);

        /* The others' replies are intact, and the refused connection lives on. */
        for (size_t i = 0; i < refused; i++)
                expect_ok(f, fds[i], idx, N_TOKENS, false);
        send_request(fds[refused], tokens, 3, false);
        expect_ok(f, fds[refused], idx, 3, false);
        for (size_t i = 0; i < N_CONN; i++)
                close(fds[i]);
}

#define SOCKET_TEST(t) cmocka_unit_test_setup_teardown(t, fixture_setup, fixture_teardown)

int main(void) {
        const struct CMUnitTest tests[] = {
                SOCKET_TEST(test_socket_three_in_order),
                SOCKET_TEST(test_socket_not_found),
                SOCKET_TEST(test_socket_too_many_tokens),
                SOCKET_TEST(test_socket_oversized_frame),
                SOCKET_TEST(test_socket_garbage),
                SOCKET_TEST(test_socket_idle_timeout),
                SOCKET_TEST(test_socket_sequential),
                SOCKET_TEST(test_socket_slow_reader),
                SOCKET_TEST(test_socket_out_of_fds),
                SOCKET_TEST(test_socket_connection_cap),
                SOCKET_TEST(test_socket_free_with_clients),
                SOCKET_TEST(test_socket_uid_cap),
                SOCKET_TEST(test_socket_backpressure),
                SOCKET_TEST(test_socket_unread_timeout),
                SOCKET_TEST(test_socket_inflight_limit),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}

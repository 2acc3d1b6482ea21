/* test-client-checkpoint.c: familyd_checkpoint_deposit() without a daemon: which files a
 * path means, the one frame that carries them (read here from a real Unix socket, descriptors
 * and all), the token it returns, and every refusal before anything is sent. The daemon's
 * side of deposits is covered by tests/integration/test_familyctl_checkpoint.py. */

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "familyd-v1-shard.pb-c.h"
#include "familyd.h"

#define CHECK(cond)                                                                     \
        do {                                                                            \
                if (!(cond)) {                                                          \
                        fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
                        exit(EXIT_FAILURE);                                             \
                }                                                                       \
        } while (0)

#define TOKEN "0123456789abcdef0123456789abcdef"

static char root[] = "/tmp/test-checkpoint-XXXXXX";
static char sock_path[sizeof(root) + 16];

/* The shard socket's other end: one connection, one frame in, one reply out. */
typedef struct Peer {
        int listen_fd;
        int code;                       /* the reply's */
        const char *message, *token;
        bool silent;                    /* no reply: wait for the client to hang up */
        Familyd__V1__ShardFdRequest *request;   /* what came */
        int fds[256];
        size_t n_fds;
        size_t n_sendmsgs_with_fds;     /* recvmsg calls that carried descriptors */
} Peer;

static void peer_recv(int fd, Peer *p, uint8_t *buf, size_t n) {
        while (n > 0) {
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * 256)];
                } control;
                struct iovec iov = { .iov_base = buf, .iov_len = n };
                struct msghdr mh = {
                        .msg_iov = &iov, .msg_iovlen = 1,
                        .msg_control = &control, .msg_controllen = sizeof(control),
                };
                ssize_t k = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);

                CHECK(k > 0);
                CHECK(!(mh.msg_flags & MSG_CTRUNC));
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        size_t m = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

                        CHECK(c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS);
                        CHECK(p->n_fds + m <= 256);
                        memcpy(p->fds + p->n_fds, CMSG_DATA(c), m * sizeof(int));
                        p->n_fds += m;
                        p->n_sendmsgs_with_fds++;
                }
                buf += k;
                n -= (size_t) k;
        }
}

static void *peer_run(void *userdata) {
        Familyd__V1__ShardFdReply reply = FAMILYD__V1__SHARD_FD_REPLY__INIT;
        Peer *p = userdata;
        uint8_t hdr[4], *body, out[4 + 1024];
        size_t len, packed;
        int fd;

        fd = accept4(p->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        CHECK(fd >= 0);
        peer_recv(fd, p, hdr, 4);
        /* The descriptors ride on the frame's first bytes. */
        CHECK(p->n_sendmsgs_with_fds == 1);
        len = (size_t) hdr[0] | (size_t) hdr[1] << 8 | (size_t) hdr[2] << 16 | (size_t) hdr[3] << 24;
        CHECK(len > 0 && len <= 65536);
        body = malloc(len);
        CHECK(body);
        peer_recv(fd, p, body, len);
        CHECK(p->n_sendmsgs_with_fds == 1);
        p->request = familyd__v1__shard_fd_request__unpack(NULL, len, body);
        CHECK(p->request);
        free(body);
        if (p->silent) {
                char c;

                CHECK(read(fd, &c, 1) == 0);
                close(fd);
                return NULL;
        }

        reply.code = p->code;
        reply.message = (char *) (p->message ? p->message : "");
        reply.checkpoint_token = (char *) (p->token ? p->token : "");
        packed = familyd__v1__shard_fd_reply__get_packed_size(&reply);
        CHECK(packed <= sizeof(out) - 4);
        out[0] = (uint8_t) packed;
        out[1] = (uint8_t) (packed >> 8);
        out[2] = (uint8_t) (packed >> 16);
        out[3] = (uint8_t) (packed >> 24);
        (void) familyd__v1__shard_fd_reply__pack(&reply, out + 4);
        CHECK(write(fd, out, 4 + packed) == (ssize_t) (4 + packed));
        close(fd);
        return NULL;
}

static int listen_at(const char *path) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

        CHECK(fd >= 0);
        CHECK(strlen(path) < sizeof(sa.sun_path));
        strcpy(sa.sun_path, path);
        (void) unlink(path);
        CHECK(bind(fd, (struct sockaddr *) &sa, sizeof(sa)) == 0);
        CHECK(listen(fd, 4) == 0);
        return fd;
}

/* Deposits path with a peer answering code/message/token; the peer keeps what it got. With a
 * client, the shard socket is the default one (beside the client's API socket). */
static int deposit_with_peer_client(FamilydClient *c, Peer *p, const char *path, char token[33],
                                    FamilydError *e) {
        pthread_t t;
        int r;

        p->listen_fd = listen_at(sock_path);
        CHECK(pthread_create(&t, NULL, peer_run, p) == 0);
        r = familyd_checkpoint_deposit(c, c ? NULL : sock_path, path, token, e);
        CHECK(pthread_join(t, NULL) == 0);
        close(p->listen_fd);
        return r;
}

static int deposit_with_peer(Peer *p, const char *path, char token[33], FamilydError *e) {
        return deposit_with_peer_client(NULL, p, path, token, e);
}

static void peer_done(Peer *p) {
        for (size_t i = 0; i < p->n_fds; i++)
                close(p->fds[i]);
        if (p->request)
                familyd__v1__shard_fd_request__free_unpacked(p->request, NULL);
}

static char *at(const char *dir, const char *name) {
        char *s;

        CHECK(asprintf(&s, "%s/%s", dir, name) >= 0);
        return s;
}

static void write_file(const char *dir, const char *name, const char *content, mode_t mode) {
        char *path = at(dir, name);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);

        CHECK(fd >= 0);
        CHECK(write(fd, content, strlen(content)) == (ssize_t) strlen(content));
        CHECK(fchmod(fd, mode) == 0);
        close(fd);
        free(path);
}

static char *make_dir(const char *name) {
        char *path = at(root, name);

        CHECK(mkdir(path, 0755) == 0);
        return path;
}

static size_t open_fds(void) {
        size_t n = 0;

        for (int fd = 0; fd < 4096; fd++)
                if (fcntl(fd, F_GETFD) >= 0)
                        n++;
        return n;
}

/* The descriptor is the file at path (links followed), read-only, blocking. */
static void check_fd_is(int fd, const char *path) {
        struct stat a, b;
        int flags = fcntl(fd, F_GETFL);

        CHECK(fstat(fd, &a) == 0 && stat(path, &b) == 0);
        CHECK(a.st_dev == b.st_dev && a.st_ino == b.st_ino);
        CHECK(flags >= 0 && (flags & O_ACCMODE) == O_RDONLY && !(flags & O_NONBLOCK));
}

/* A directory: its index, then its regular *.safetensors by name (a link to a file outside
 * followed); other names, subdirectories, FIFOs and dangling links left out. */
static void test_directory(void) {
        char *dir = make_dir("ckpt"), *path;
        char token[33] = "";
        FamilydError e = FAMILYD_ERROR_NULL;
        Peer p = { .token = TOKEN };
        size_t before = open_fds();
        static const char *const expected[] = {
                "model.safetensors.index.json", "a.safetensors", "b.safetensors", "c.safetensors",
        };

        write_file(dir, "b.safetensors", "bbbb", 0644);
        write_file(dir, "a.safetensors", "aaaa", 0644);
        write_file(dir, "model.safetensors.index.json", "{}", 0644);
        write_file(dir, "notes.txt", "x", 0644);
        write_file(root, "outside.bin", "cccc", 0644);
        free(make_dir("ckpt/sub.safetensors"));
        path = at(dir, "c.safetensors");
        CHECK(symlink("../outside.bin", path) == 0);
        free(path);
        path = at(dir, "dangling.safetensors");
        CHECK(symlink("nowhere", path) == 0);
        free(path);
        path = at(dir, "fifo.safetensors");
        CHECK(mkfifo(path, 0644) == 0);
        free(path);

        CHECK(deposit_with_peer(&p, dir, token, &e) == 0);
        CHECK(e.code == 0 && !e.message);
        CHECK(strcmp(token, TOKEN) == 0);
        CHECK(p.request->n_tokens == 0 && !p.request->writable);
        CHECK(p.request->n_checkpoint_files == 4 && p.n_fds == 4);
        for (size_t i = 0; i < 4; i++) {
                CHECK(strcmp(p.request->checkpoint_files[i], expected[i]) == 0);
                path = at(dir, expected[i]);
                check_fd_is(p.fds[i], path);
                free(path);
        }
        peer_done(&p);
        /* The client's own descriptors are closed. */
        CHECK(open_fds() == before);
        free(dir);
}

/* A file: itself, by its base name; a trailing slash on a directory changes nothing. */
static void test_file_and_slash(void) {
        char *path = at(root, "ckpt/a.safetensors"), *slashed = at(root, "ckpt/");
        char token[33] = "";
        FamilydError e = FAMILYD_ERROR_NULL;
        Peer p = { .token = TOKEN }, q = { .token = TOKEN };

        CHECK(deposit_with_peer(&p, path, token, &e) == 0);
        CHECK(p.request->n_checkpoint_files == 1 && p.n_fds == 1);
        CHECK(strcmp(p.request->checkpoint_files[0], "a.safetensors") == 0);
        check_fd_is(p.fds[0], path);
        peer_done(&p);

        CHECK(deposit_with_peer(&q, slashed, token, &e) == 0);
        CHECK(q.request->n_checkpoint_files == 4);
        peer_done(&q);
        free(path);
        free(slashed);
}

/* The daemon's refusal is -EPROTO with its code and words; a reply without a token of 32 hex
 * digits is not an answer. */
static void test_daemon_answers(void) {
        char *path = at(root, "ckpt");
        char token[33] = "untouched";
        FamilydError e = FAMILYD_ERROR_NULL;
        Peer p = { .code = 8, .message = "uid 0 holds 16 checkpoint deposits" };
        Peer q = { .token = "not-hex-not-32" };

        CHECK(deposit_with_peer(&p, path, token, &e) == -EPROTO);
        CHECK(e.code == 8 && strcmp(e.message, "uid 0 holds 16 checkpoint deposits") == 0);
        CHECK(strcmp(token, "untouched") == 0);
        peer_done(&p);
        familyd_error_clear(&e);

        CHECK(deposit_with_peer(&q, path, token, &e) == -EBADMSG);
        CHECK(e.code == 0 && strcmp(token, "untouched") == 0);
        peer_done(&q);
        free(path);
}

/* With a client: shard.sock beside its API socket, and its timeout bounds the exchange. */
static void test_client_default_and_timeout(void) {
        char *api = at(root, "familyd.sock"), *path = at(root, "ckpt");
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH |
                              FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS,
                .socket_path = api,
                .timeout_ms = 300,
        };
        FamilydClient *c = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        Peer p = { .token = TOKEN }, q = { .silent = true };
        char token[33] = "";

        CHECK(familyd_client_new(&params, &c) == 0);
        CHECK(deposit_with_peer_client(c, &p, path, token, &e) == 0);
        CHECK(strcmp(token, TOKEN) == 0 && p.request->n_checkpoint_files == 4);
        peer_done(&p);

        CHECK(deposit_with_peer_client(c, &q, path, token, &e) == -ETIMEDOUT);
        CHECK(e.code == 0 && !e.message);
        CHECK(q.request->n_checkpoint_files == 4);
        peer_done(&q);
        familyd_client_free(c);
        free(api);
        free(path);
}

/* 253 files go in one frame; 254 are refused before anything is sent. */
static void test_limit(void) {
        char *dir = make_dir("many"), token[33];
        FamilydError e = FAMILYD_ERROR_NULL;
        Peer p = { .token = TOKEN };

        for (int i = 0; i < 253; i++) {
                char name[64];

                (void) snprintf(name, sizeof name, "model-%05d.safetensors", i);
                write_file(dir, name, "x", 0644);
        }
        CHECK(deposit_with_peer(&p, dir, token, &e) == 0);
        CHECK(p.request->n_checkpoint_files == 253 && p.n_fds == 253);
        CHECK(strcmp(p.request->checkpoint_files[252], "model-00252.safetensors") == 0);
        peer_done(&p);

        write_file(dir, "model.safetensors.index.json", "{}", 0644);
        CHECK(familyd_checkpoint_deposit(NULL, sock_path, dir, token, &e) == -E2BIG);
        CHECK(e.code == 3 && strstr(e.message, dir) && strstr(e.message, "254 files") &&
              strstr(e.message, "253"));
        familyd_error_clear(&e);
        free(dir);
}

/* Refusals before sending: each with its errno and a message naming the path. The socket
 * path names nothing, so a deposit that got as far as sending would fail differently. */
static void test_refusals(void) {
        char *missing = at(root, "missing"), *empty = make_dir("empty"), *two = make_dir("two");
        char *fifo = at(root, "fifo"), *nosock = at(root, "nosock"), *good = at(root, "ckpt");
        char token[33] = "untouched";
        FamilydError e = FAMILYD_ERROR_NULL;

        CHECK(familyd_checkpoint_deposit(NULL, nosock, missing, token, &e) == -ENOENT);
        CHECK(e.code == 5 && strstr(e.message, missing) && strstr(e.message, "No such file"));
        familyd_error_clear(&e);

        write_file(empty, "model.safetensors.index.json", "{}", 0644);
        write_file(empty, "weights.bin", "x", 0644);
        CHECK(familyd_checkpoint_deposit(NULL, nosock, empty, token, &e) == -ENODATA);
        CHECK(e.code == 3 && strstr(e.message, empty) && strstr(e.message, "without *.safetensors"));
        familyd_error_clear(&e);

        write_file(two, "a.safetensors", "x", 0644);
        write_file(two, "model.safetensors.index.json", "{}", 0644);
        write_file(two, "other.index.json", "{}", 0644);
        CHECK(familyd_checkpoint_deposit(NULL, nosock, two, token, &e) == -ENOTUNIQ);
        CHECK(e.code == 3 && strstr(e.message, "model.safetensors.index.json") &&
              strstr(e.message, "other.index.json"));
        familyd_error_clear(&e);

        CHECK(mkfifo(fifo, 0644) == 0);
        CHECK(familyd_checkpoint_deposit(NULL, nosock, fifo, token, &e) == -EINVAL);
        CHECK(e.code == 3 && strstr(e.message, "neither a regular file nor a directory"));
        familyd_error_clear(&e);

        /* A good checkpoint and no shard socket: the socket's errno, no message. */
        CHECK(familyd_checkpoint_deposit(NULL, nosock, good, token, &e) == -ENOENT);
        CHECK(e.code == 0 && !e.message);

        CHECK(familyd_checkpoint_deposit(NULL, nosock, NULL, token, &e) == -EINVAL);
        CHECK(familyd_checkpoint_deposit(NULL, nosock, "", token, &e) == -EINVAL);
        CHECK(familyd_checkpoint_deposit(NULL, NULL, empty, token, &e) == -EINVAL);
        CHECK(familyd_checkpoint_deposit(NULL, nosock, empty, NULL, &e) == -EINVAL);
        CHECK(e.code == 0 && !e.message);
        CHECK(strcmp(token, "untouched") == 0);
        free(missing);
        free(empty);
        free(two);
        free(fifo);
        free(nosock);
        free(good);
}

/* A file this process may not read: -EACCES naming it. As root, the check runs in a child
 * that has become nobody (root reads every file). */
static void check_unreadable(const char *dir, const char *file) {
        char token[33];
        FamilydError e = FAMILYD_ERROR_NULL;
        int r = familyd_checkpoint_deposit(NULL, sock_path, dir, token, &e);

        CHECK(r == -EACCES);
        CHECK(e.code == 7 && strstr(e.message, file) && strstr(e.message, "Permission denied"));
        familyd_error_clear(&e);
        r = familyd_checkpoint_deposit(NULL, sock_path, file, token, &e);
        CHECK(r == -EACCES && e.code == 7 && strstr(e.message, file));
        familyd_error_clear(&e);
}

static void test_unreadable(void) {
        char *dir = make_dir("secret"), *file;
        int status;
        pid_t pid;

        write_file(dir, "a.safetensors", "x", 0644);
        write_file(dir, "b.safetensors", "secret", geteuid() == 0 ? 0600 : 0000);
        file = at(dir, "b.safetensors");
        if (geteuid() != 0) {
                check_unreadable(dir, file);
                goto finish;
        }
        pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
                if (setgroups(0, NULL) < 0 || setgid(65534) < 0 || setuid(65534) < 0)
                        _exit(2);
                check_unreadable(dir, file);
                _exit(0);
        }
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
finish:
        free(file);
        free(dir);
}

int main(void) {
        CHECK(mkdtemp(root));
        /* Others may look in, for the test that runs as nobody. */
        CHECK(chmod(root, 0755) == 0);
        (void) snprintf(sock_path, sizeof sock_path, "%s/shard.sock", root);

        test_directory();
        test_file_and_slash();
        test_daemon_answers();
        test_limit();
        test_refusals();
        test_unreadable();
        /* Last: no fork() after a client exists (gRPC runs threads of its own). */
        test_client_default_and_timeout();

        {
                char *cmd;

                CHECK(asprintf(&cmd, "rm -rf '%s'", root) >= 0);
                (void) system(cmd);
                free(cmd);
        }
        return 0;
}

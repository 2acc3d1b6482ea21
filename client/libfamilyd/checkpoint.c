/* checkpoint.c: checkpoint deposits on the shard socket: the files of a safetensors checkpoint
 * opened here, with this process's rights, and their descriptors handed to the daemon. */

/*
 * DESIGN: the daemon never opens a checkpoint (docs/security.md): it reads only descriptors a
 * client opened, so what a Build reads is what its caller could read. The client therefore
 * decides which files a path means, by names only (no JSON here; the daemon checks an index
 * against the files it got), and refuses in words, before sending anything, what would only
 * fail later: a missing or unreadable file, a directory with nothing to load, two indexes,
 * more files than one frame carries.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "client-private.h"
#include "common/macro.h"

#define SAFETENSORS_SUFFIX ".safetensors"
#define INDEX_SUFFIX ".index.json"

/* gRPC status numbers of local refusals. */
#define STATUS_INVALID_ARGUMENT 3
#define STATUS_NOT_FOUND 5
#define STATUS_PERMISSION_DENIED 7

typedef struct Deposit {
        const char *path;               /* as the caller gave it */
        char *index;                    /* the directory's *.index.json, or NULL */
        char **names;                   /* what is sent: base names, index first */
        int *fds;
        size_t n;                       /* names and fds */
} Deposit;

static void deposit_done(Deposit *d) {
        for (size_t i = 0; i < d->n; i++) {
                free(d->names[i]);
                (void) safe_close(d->fds[i]);
        }
        free(d->names);
        free(d->fds);
        free(d->index);
        *d = (Deposit) {};
}

static inline void closedirp(DIR **d) {
        if (*d)
                (void) closedir(*d);
}

/* The separator between the path and a name in it, for messages. */
static const char *deposit_sep(const Deposit *d, const char *name) {
        size_t n = strlen(d->path);

        return name && n > 0 && d->path[n - 1] != '/' ? "/" : "";
}

static int deposit_refuse(FamilydError *error, int r, int code, const char *format, ...)
        __attribute__((format(printf, 4, 5)));
static int deposit_refuse(FamilydError *error, int r, int code, const char *format, ...) {
        va_list ap;
        int k;

        if (!error)
                return r;
        va_start(ap, format);
        k = vasprintf(&error->message, format, ap);
        va_end(ap);
        if (k < 0) {
                error->message = NULL;
                return -ENOMEM;
        }
        error->code = code;
        return r;
}

/* A failed open() or stat() of path[/name], in the errno's words. */
static int deposit_refuse_errno(FamilydError *error, const Deposit *d, const char *name, int r) {
        int code = r == -ENOENT ? STATUS_NOT_FOUND
                 : r == -EACCES || r == -EPERM ? STATUS_PERMISSION_DENIED
                 : STATUS_INVALID_ARGUMENT;

        if (r == -ENOMEM)
                return r;
        return deposit_refuse(error, r, code, "%s%s%s: %s", d->path, deposit_sep(d, name),
                              strempty(name), strerror(-r));
}

static bool has_suffix(const char *s, const char *suffix) {
        size_t n = strlen(s), k = strlen(suffix);

        return n > k && streq(s + n - k, suffix);
}

static int name_compare(const void *a, const void *b) {
        return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* Opens name (in dir_fd, or a path with AT_FDCWD) for the daemon: read-only, never blocking
 * on a FIFO, and only a regular file. *ret_fd without O_NONBLOCK, as the spec has it. */
static int deposit_open(Deposit *d, int dir_fd, const char *name, const char *shown,
                        int *ret_fd, FamilydError *error) {
        _cleanup_close_ int fd = -1;
        struct stat st;
        int flags;

        fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0 || fstat(fd, &st) < 0)
                return deposit_refuse_errno(error, d, shown, -errno);
        if (!S_ISREG(st.st_mode))
                return deposit_refuse(error, -EINVAL, STATUS_INVALID_ARGUMENT,
                                      "%s%s%s: not a regular file", d->path,
                                      deposit_sep(d, shown), strempty(shown));
        flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0)
                return -errno;
        *ret_fd = TAKE_FD(fd);
        return 0;
}

static int deposit_add(Deposit *d, const char *name, int fd) {
        char *copy = strdup(name);

        if (!copy) {
                (void) safe_close(fd);
                return -ENOMEM;
        }
        d->names[d->n] = copy;
        d->fds[d->n] = fd;
        d->n++;
        return 0;
}

/* The regular *.safetensors files of the directory (links followed), sorted, and its one
 * *.index.json, by name. */
static int deposit_list(Deposit *d, int dir_fd, char ***ret_files, size_t *ret_n,
                        FamilydError *error) {
        _cleanup_(closedirp) DIR *dir = NULL;
        char **files = NULL;
        size_t n = 0, allocated = 0;
        struct dirent *de;
        int fd, r = 0;

        fd = dup(dir_fd);
        if (fd < 0)
                return -errno;
        dir = fdopendir(fd);
        if (!dir) {
                r = -errno;
                (void) safe_close(fd);
                return r;
        }
        for (errno = 0; (de = readdir(dir)); errno = 0) {
                bool index = has_suffix(de->d_name, INDEX_SUFFIX);
                struct stat st;

                if (!index && !has_suffix(de->d_name, SAFETENSORS_SUFFIX))
                        continue;
                /* A name that vanished or is not a regular file is not part of it; one this
                 * process may not look at is refused when it is opened. */
                if (fstatat(dir_fd, de->d_name, &st, 0) < 0) {
                        if (errno == ENOENT)
                                continue;
                } else if (!S_ISREG(st.st_mode))
                        continue;
                if (index) {
                        if (d->index) {
                                r = deposit_refuse(error, -ENOTUNIQ, STATUS_INVALID_ARGUMENT,
                                                   "%s: more than one *" INDEX_SUFFIX
                                                   " (%s and %s): a checkpoint directory "
                                                   "has one index",
                                                   d->path, d->index, de->d_name);
                                goto fail;
                        }
                        d->index = strdup(de->d_name);
                        if (!d->index) {
                                r = -ENOMEM;
                                goto fail;
                        }
                        continue;
                }
                if (n == allocated) {
                        char **grown;

                        allocated = allocated ? 2 * allocated : 16;
                        grown = realloc(files, allocated * sizeof(*files));
                        if (!grown) {
                                r = -ENOMEM;
                                goto fail;
                        }
                        files = grown;
                }
                files[n] = strdup(de->d_name);
                if (!files[n]) {
                        r = -ENOMEM;
                        goto fail;
                }
                n++;
        }
        if (errno != 0) {
                r = deposit_refuse_errno(error, d, NULL, -errno);
                goto fail;
        }
        if (n == 0) {
                r = deposit_refuse(error, -ENODATA, STATUS_INVALID_ARGUMENT,
                                   "%s: a directory without *" SAFETENSORS_SUFFIX " files",
                                   d->path);
                goto fail;
        }
        qsort(files, n, sizeof(*files), name_compare);
        *ret_files = files;
        *ret_n = n;
        return 0;
fail:
        for (size_t i = 0; i < n; i++)
                free(files[i]);
        free(files);
        return r;
}

static int deposit_directory(Deposit *d, int dir_fd, FamilydError *error) {
        char **files = NULL;
        size_t n_files = 0, total;
        int r;

        r = deposit_list(d, dir_fd, &files, &n_files, error);
        if (r < 0)
                return r;
        total = n_files + (d->index ? 1 : 0);
        if (total > FAMILYD_CHECKPOINT_MAX_FILES) {
                r = deposit_refuse(error, -E2BIG, STATUS_INVALID_ARGUMENT,
                                   "%s: %zu files, more than the %d one deposit carries",
                                   d->path, total, FAMILYD_CHECKPOINT_MAX_FILES);
                goto finish;
        }
        d->names = calloc(total, sizeof(*d->names));
        d->fds = calloc(total, sizeof(*d->fds));
        if (!d->names || !d->fds) {
                r = -ENOMEM;
                goto finish;
        }
        for (size_t i = 0; i < total; i++) {
                const char *name = i == 0 && d->index ? d->index : files[i - (d->index ? 1 : 0)];
                int fd = -1;

                r = deposit_open(d, dir_fd, name, name, &fd, error);
                if (r < 0)
                        goto finish;
                r = deposit_add(d, name, fd);
                if (r < 0)
                        goto finish;
        }
finish:
        for (size_t i = 0; i < n_files; i++)
                free(files[i]);
        free(files);
        return r;
}

static int deposit_file(Deposit *d, int fd) {
        const char *slash = strrchr(d->path, '/');
        int flags;

        d->names = calloc(1, sizeof(*d->names));
        d->fds = calloc(1, sizeof(*d->fds));
        if (!d->names || !d->fds) {
                (void) safe_close(fd);
                return -ENOMEM;
        }
        flags = fcntl(fd, F_GETFL);
        if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
                int r = -errno;

                (void) safe_close(fd);
                return r;
        }
        return deposit_add(d, slash ? slash + 1 : d->path, fd);
}

/* Which files path means, each opened. */
static int deposit_collect(Deposit *d, FamilydError *error) {
        _cleanup_close_ int fd = -1;
        struct stat st;

        fd = open(d->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0 || fstat(fd, &st) < 0)
                return deposit_refuse_errno(error, d, NULL, -errno);
        if (S_ISDIR(st.st_mode))
                return deposit_directory(d, fd, error);
        if (!S_ISREG(st.st_mode))
                return deposit_refuse(error, -EINVAL, STATUS_INVALID_ARGUMENT,
                                      "%s: neither a regular file nor a directory", d->path);
        return deposit_file(d, TAKE_FD(fd));
}

static bool token_valid(const char *t) {
        if (!t || strlen(t) != FAMILYD_CHECKPOINT_TOKEN_LEN)
                return false;
        for (const char *p = t; *p; p++)
                if (!strchr("0123456789abcdefABCDEF", *p))
                        return false;
        return true;
}

int familyd_checkpoint_deposit(
                FamilydClient *client,
                const char *shard_socket_path,
                const char *path,
                char ret_token[FAMILYD_CHECKPOINT_TOKEN_LEN + 1],
                FamilydError *ret_error) {

        Familyd__V1__ShardFdRequest req = FAMILYD__V1__SHARD_FD_REQUEST__INIT;
        Familyd__V1__ShardFdReply *reply = NULL;
        int fds[FAMILYD_SHARD_MAX_TOKENS];
        size_t n_fds = 0;
        Deposit d = { .path = path };
        int r;

        familyd_error_clear(ret_error);
        if (isempty(path) || !ret_token || (!client && isempty(shard_socket_path)))
                return -EINVAL;

        r = deposit_collect(&d, ret_error);
        if (r < 0)
                goto finish;

        req.n_checkpoint_files = d.n;
        req.checkpoint_files = d.names;
        r = shard_socket_exchange(client, shard_socket_path, &req, d.fds, d.n, &reply, fds,
                                  &n_fds, ret_error);
        if (r == -E2BIG) {
                r = deposit_refuse(ret_error, r, STATUS_INVALID_ARGUMENT,
                                   "%s: the names of its %zu files are too long for one deposit",
                                   path, d.n);
                goto finish;
        }
        if (r < 0)
                goto finish;
        /* A deposit's answer carries no descriptors. */
        for (size_t i = 0; i < n_fds; i++)
                (void) safe_close(fds[i]);
        if (n_fds > 0 || !token_valid(reply->checkpoint_token)) {
                r = -EBADMSG;
                goto finish;
        }
        memcpy(ret_token, reply->checkpoint_token, FAMILYD_CHECKPOINT_TOKEN_LEN + 1);
        r = 0;
finish:
        if (reply)
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        deposit_done(&d);
        return r;
}

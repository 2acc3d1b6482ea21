/* build-checkpoint.c: a checkpoint a client opened for a Build: its files' descriptors and headers, tensors by name. */

#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build-checkpoint.h"
#include "hw/read-ahead.h"

BuildCheckpoint *build_checkpoint_free(BuildCheckpoint *c) {
        if (!c)
                return NULL;
        for (size_t i = 0; i < c->n_files; i++) {
                safe_close(c->files[i].fd);
                free(c->files[i].name);
                safetensors_header_free(c->files[i].header);
        }
        free(c->files);
        free(c->tensors);
        free(c->node_reads);
        return mfree(c);
}

static int tensor_compare(const void *a, const void *b) {
        return strcmp(((const BuildCheckpointTensor *) a)->tensor->name,
                      ((const BuildCheckpointTensor *) b)->tensor->name);
}

/* Every file's tensors by name; a name in two files is refused. */
static int index_tensors(BuildCheckpoint *c, FamilyError *ret_error) {
        size_t n = 0;

        for (size_t f = 0; f < c->n_files; f++)
                n += c->files[f].header->n_tensors;
        c->tensors = calloc(n ? n : 1, sizeof *c->tensors);
        if (!c->tensors)
                return -ENOMEM;
        for (size_t f = 0; f < c->n_files; f++)
                for (size_t i = 0; i < c->files[f].header->n_tensors; i++)
                        c->tensors[c->n_tensors++] = (BuildCheckpointTensor) {
                                &c->files[f].header->tensors[i], f };
        qsort(c->tensors, c->n_tensors, sizeof *c->tensors, tensor_compare);
        for (size_t i = 1; i < c->n_tensors; i++)
                if (streq(c->tensors[i - 1].tensor->name, c->tensors[i].tensor->name))
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "CHECKPOINT_INVALID", NULL,
                                                "checkpoint tensor '%s' is in both %s and %s",
                                                c->tensors[i].tensor->name,
                                                c->files[c->tensors[i - 1].file].name,
                                                c->files[c->tensors[i].file].name);
        return 0;
}

/* The sum of the files' declared header lengths (their first 8 bytes), before any header is
 * read: over BUILD_CHECKPOINT_HEADERS_MAX is refused, so 253 files of 100 MB headers cannot
 * make the daemon parse gigabytes of JSON. A file too short or unreadable counts 0 here; its
 * own read says why. */
static int check_headers_total(BuildCheckpointFile *files, size_t n, FamilyError *ret_error) {
        uint64_t total = 0;

        for (size_t i = 0; i < n; i++) {
                uint8_t first[8];
                uint64_t len = 0;
                if (pread(files[i].fd, first, sizeof first, 0) != (ssize_t) sizeof first)
                        continue;
                for (int k = 7; k >= 0; k--)
                        len = len << 8 | first[k];
                total += len > SAFETENSORS_HEADER_MAX ? SAFETENSORS_HEADER_MAX : len;
        }
        if (total <= BUILD_CHECKPOINT_HEADERS_MAX)
                return 0;
        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                "CHECKPOINT_INVALID", NULL,
                                "the checkpoint's %zu headers declare %" PRIu64 " bytes in all, "
                                "over the limit of %" PRIu64 " bytes for one Build",
                                n, total, BUILD_CHECKPOINT_HEADERS_MAX);
}

int build_checkpoint_open(int *fds, const char *const *names, size_t n, BuildCheckpoint **ret,
                          FamilyError *ret_error) {
        _cleanup_(build_checkpoint_freep) BuildCheckpoint *c = NULL;
        char why[512];
        int r = 0;

        c = calloc(1, sizeof *c);
        if (c)
                c->files = calloc(n ? n : 1, sizeof *c->files);
        for (size_t i = 0; i < n; i++) {
                if (!c || !c->files) {
                        safe_close(fds[i]);
                        continue;
                }
                c->files[c->n_files++] = (BuildCheckpointFile) { .fd = fds[i] };
                c->files[i].name = strdup(names[i]);
                if (!c->files[i].name)
                        r = -ENOMEM;
        }
        if (!c || !c->files)
                return -ENOMEM;
        if (r >= 0)
                r = check_headers_total(c->files, n, ret_error);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                struct stat st;
                *why = 0;
                r = safetensors_header_read(c->files[i].fd, &c->files[i].header, why, sizeof why);
                if (r >= 0 && fstat(c->files[i].fd, &st) < 0)
                        r = -errno;
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "CHECKPOINT_INVALID", NULL, "checkpoint file %s: %s",
                                                c->files[i].name, *why ? why : strerror(-r));
                c->files[i].size = (uint64_t) st.st_size;
                c->files[i].read_ahead = read_ahead_window(c->files[i].fd);
        }
        if (r < 0)
                return r;
        r = index_tensors(c, ret_error);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(c);
        return 0;
}

const BuildCheckpointTensor *build_checkpoint_find(const BuildCheckpoint *c, const char *name) {
        SafetensorsTensor t = { .name = (char *) name };
        BuildCheckpointTensor key = { .tensor = &t };

        if (!c || !name || c->n_tensors == 0)
                return NULL;
        return bsearch(&key, c->tensors, c->n_tensors, sizeof key, tensor_compare);
}

int build_checkpoint_shape_of(const char *name, size_t *ret_n_dims,
                              int64_t ret_shape[static FAMILYD_MAX_SHAPE_RANK], void *userdata) {
        const BuildCheckpointTensor *t = build_checkpoint_find(userdata, name);

        if (!t)
                return -ENOENT;
        if (t->tensor->n_dims > FAMILYD_MAX_SHAPE_RANK)
                return -E2BIG;
        for (size_t d = 0; d < t->tensor->n_dims; d++) {
                if (t->tensor->shape[d] > INT64_MAX)
                        return -E2BIG;
                ret_shape[d] = (int64_t) t->tensor->shape[d];
        }
        *ret_n_dims = t->tensor->n_dims;
        return 0;
}

static bool is_index_name(const char *name) {
        size_t n = strlen(name), k = strlen(".index.json");
        return n > k && streq(name + n - k, ".index.json");
}

/* The index file's JSON, read whole (at most SAFETENSORS_INDEX_MAX bytes). */
static int index_read(int fd, const char *name, SafetensorsIndex **ret, FamilyError *ret_error) {
        _cleanup_free_ char *text = NULL;
        char why[512] = "";
        struct stat st;
        size_t at = 0;
        int r;

        if (fstat(fd, &st) < 0)
                return -errno;
        if ((uint64_t) st.st_size > SAFETENSORS_INDEX_MAX)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "CHECKPOINT_INVALID", NULL,
                                        "checkpoint index %s: %" PRIu64 " bytes, over the limit "
                                        "of %" PRIu64, name, (uint64_t) st.st_size,
                                        SAFETENSORS_INDEX_MAX);
        text = malloc((size_t) st.st_size + 1);
        if (!text)
                return -ENOMEM;
        while (at < (size_t) st.st_size) {
                ssize_t n = pread(fd, text + at, (size_t) st.st_size - at, (off_t) at);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n <= 0)
                        return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE,
                                                "CHECKPOINT_READ", NULL,
                                                "checkpoint index %s: %s", name,
                                                n < 0 ? strerror(errno) : "it ended early");
                at += (size_t) n;
        }
        text[at] = 0;
        r = safetensors_index_parse(text, at, ret, why, sizeof why);
        if (r == -ENOMEM)
                return r;
        if (r < 0)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "CHECKPOINT_INVALID", NULL, "checkpoint index %s: %s",
                                        name, *why ? why : strerror(-r));
        return 0;
}

int build_checkpoint_open_files(CheckpointFiles *files, BuildCheckpoint **ret,
                                FamilyError *ret_error) {
        _cleanup_(checkpoint_files_done) CheckpointFiles f = *files;
        _cleanup_(safetensors_index_freep) SafetensorsIndex *index = NULL;
        _cleanup_(build_checkpoint_freep) BuildCheckpoint *c = NULL;
        _cleanup_free_ int *fds = NULL;
        _cleanup_free_ const char **names = NULL;
        size_t at_index = SIZE_MAX, n = 0;
        int r;

        *files = (CheckpointFiles) {};
        for (size_t i = 0; i < f.n; i++)
                if (is_index_name(f.names[i])) {
                        if (at_index != SIZE_MAX)
                                return family_error_set(ret_error,
                                                        FAMILY_STATUS_FAILED_PRECONDITION,
                                                        "CHECKPOINT_INVALID", NULL,
                                                        "checkpoint has two indexes, %s and %s",
                                                        f.names[at_index], f.names[i]);
                        at_index = i;
                }
        if (at_index != SIZE_MAX) {
                r = index_read(f.fds[at_index], f.names[at_index], &index, ret_error);
                if (r < 0)
                        return r;
        }

        /* The files the index names, in its order; without one, every file sent. */
        fds = calloc(f.n, sizeof(int));
        names = calloc(f.n, sizeof(char *));
        if (!fds || !names)
                return -ENOMEM;
        for (size_t k = 0; index && k < index->n_files; k++) {
                size_t i = 0;
                while (i < f.n && (i == at_index || !streq(f.names[i], index->files[k])))
                        i++;
                if (i == f.n)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "CHECKPOINT_INVALID", NULL,
                                                "checkpoint index %s names %s, which was not "
                                                "sent with it (is it missing?)",
                                                f.names[at_index], index->files[k]);
                fds[n] = f.fds[i];
                names[n++] = f.names[i];
                f.fds[i] = -EBADF;
        }
        for (size_t i = 0; !index && i < f.n; i++) {
                fds[n] = f.fds[i];
                names[n++] = f.names[i];
                f.fds[i] = -EBADF;
        }
        r = build_checkpoint_open(fds, names, n, &c, ret_error);
        if (r < 0)
                return r;
        if (index) {
                _cleanup_free_ SafetensorsHeader **headers = calloc(n ? n : 1, sizeof(*headers));
                char why[512] = "";
                if (!headers)
                        return -ENOMEM;
                for (size_t i = 0; i < n; i++)
                        headers[i] = c->files[i].header;
                r = safetensors_index_check(index, headers, why, sizeof why);
                if (r == -ENOMEM)
                        return r;
                if (r < 0)
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                                "CHECKPOINT_INVALID", NULL,
                                                "checkpoint index %s: %s", f.names[at_index],
                                                *why ? why : strerror(-r));
        }
        *ret = TAKE_PTR(c);
        return 0;
}

int build_checkpoint_identity(const BuildCheckpoint *c,
                              char ret[static BUILD_CHECKPOINT_ID_HEX + 1]) {
        static const char hex[] = "0123456789abcdef";
        crypto_generichash_state h;
        uint8_t digest[BUILD_CHECKPOINT_ID_HEX / 2];

        if (crypto_generichash_init(&h, NULL, 0, sizeof digest) != 0)
                return -EIO;
        for (size_t i = 0; i < c->n_files; i++) {
                const BuildCheckpointFile *f = &c->files[i];
                struct stat st;
                char line[256];

                if (fstat(f->fd, &st) < 0)
                        return -errno;
                /* ctime too: utimes() can put an mtime back, nothing puts a ctime back. */
                int k = snprintf(line, sizeof line, "file %zu dev %" PRIu64 " ino %" PRIu64
                                 " size %" PRIu64 " mtime %" PRId64 ".%09ld ctime %" PRId64
                                 ".%09ld\n", i, (uint64_t) st.st_dev, (uint64_t) st.st_ino,
                                 (uint64_t) st.st_size, (int64_t) st.st_mtim.tv_sec,
                                 st.st_mtim.tv_nsec, (int64_t) st.st_ctim.tv_sec,
                                 st.st_ctim.tv_nsec);
                (void) crypto_generichash_update(&h, (const uint8_t *) line, (size_t) k);
                /* The header as parsed: each tensor's name, dtype, shape and offsets. */
                for (size_t t = 0; t < f->header->n_tensors; t++) {
                        const SafetensorsTensor *x = &f->header->tensors[t];
                        (void) crypto_generichash_update(&h, (const uint8_t *) x->name,
                                                         strlen(x->name) + 1);
                        k = snprintf(line, sizeof line, "%d %" PRIu64 " %" PRIu64 " %zu",
                                     (int) x->dtype, x->begin, x->end, x->n_dims);
                        (void) crypto_generichash_update(&h, (const uint8_t *) line, (size_t) k);
                        (void) crypto_generichash_update(&h, (const uint8_t *) x->shape,
                                                         x->n_dims * sizeof(x->shape[0]));
                }
        }
        if (crypto_generichash_final(&h, digest, sizeof digest) != 0)
                return -EIO;
        for (size_t i = 0; i < sizeof digest; i++) {
                ret[2 * i] = hex[digest[i] >> 4];
                ret[2 * i + 1] = hex[digest[i] & 0xf];
        }
        ret[BUILD_CHECKPOINT_ID_HEX] = 0;
        return 0;
}

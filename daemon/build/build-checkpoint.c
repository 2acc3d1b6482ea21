/* build-checkpoint.c: a checkpoint a client opened for a Build: its files' descriptors and headers, tensors by name. */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "build-checkpoint.h"

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

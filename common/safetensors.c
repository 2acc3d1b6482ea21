/* safetensors.c: the safetensors checkpoint format, read strictly: a file's header, a directory's index. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>

#include "safetensors.h"

static const struct {
        const char *name;
        unsigned bits;
} dtypes[_SAFETENSORS_DTYPE_MAX] = {
        [SAFETENSORS_BOOL] = { "BOOL", 8 },       [SAFETENSORS_F4] = { "F4", 4 },
        [SAFETENSORS_F6_E2M3] = { "F6_E2M3", 6 }, [SAFETENSORS_F6_E3M2] = { "F6_E3M2", 6 },
        [SAFETENSORS_U8] = { "U8", 8 },           [SAFETENSORS_I8] = { "I8", 8 },
        [SAFETENSORS_F8_E5M2] = { "F8_E5M2", 8 }, [SAFETENSORS_F8_E4M3] = { "F8_E4M3", 8 },
        [SAFETENSORS_F8_E8M0] = { "F8_E8M0", 8 }, [SAFETENSORS_I16] = { "I16", 16 },
        [SAFETENSORS_U16] = { "U16", 16 },        [SAFETENSORS_F16] = { "F16", 16 },
        [SAFETENSORS_BF16] = { "BF16", 16 },      [SAFETENSORS_I32] = { "I32", 32 },
        [SAFETENSORS_U32] = { "U32", 32 },        [SAFETENSORS_F32] = { "F32", 32 },
        [SAFETENSORS_C64] = { "C64", 64 },        [SAFETENSORS_F64] = { "F64", 64 },
        [SAFETENSORS_I64] = { "I64", 64 },        [SAFETENSORS_U64] = { "U64", 64 },
};

const char *safetensors_dtype_to_string(SafetensorsDtype d) {
        return d >= 0 && d < _SAFETENSORS_DTYPE_MAX ? dtypes[d].name : NULL;
}

SafetensorsDtype safetensors_dtype_from_string(const char *s) {
        for (size_t i = 0; s && i < _SAFETENSORS_DTYPE_MAX; i++)
                if (streq(dtypes[i].name, s))
                        return (SafetensorsDtype) i;
        return _SAFETENSORS_DTYPE_INVALID;
}

unsigned safetensors_dtype_bits(SafetensorsDtype d) {
        return d >= 0 && d < _SAFETENSORS_DTYPE_MAX ? dtypes[d].bits : 0;
}

_printf_(3, 4) static int refuse(char *why, size_t why_size, const char *fmt, ...) {
        va_list ap;

        if (why && why_size > 0) {
                va_start(ap, fmt);
                (void) vsnprintf(why, why_size, fmt, ap);
                va_end(ap);
        }
        return -EBADMSG;
}

/* ---- the header ---------------------------------------------------------------------------- */

SafetensorsHeader *safetensors_header_free(SafetensorsHeader *h) {
        if (!h)
                return NULL;
        for (size_t i = 0; i < h->n_tensors; i++)
                free(h->tensors[i].name);
        free(h->tensors);
        for (size_t i = 0; i < 2 * h->n_metadata; i++)
                free(h->metadata[i]);
        free(h->metadata);
        return mfree(h);
}

int safetensors_header_size(const uint8_t first[8], uint64_t file_size, uint64_t *ret,
                            char *why, size_t why_size) {
        uint64_t n = 0;

        if (file_size < 8)
                return refuse(why, why_size,
                              "the file has %" PRIu64 " bytes, fewer than the 8 of its header "
                              "length", file_size);
        for (int i = 7; i >= 0; i--)
                n = n << 8 | first[i];
        if (n > SAFETENSORS_HEADER_MAX) {
                (void) refuse(why, why_size,
                              "its header length %" PRIu64 " is over the limit of %" PRIu64
                              " bytes", n, SAFETENSORS_HEADER_MAX);
                return -E2BIG;
        }
        if (n > file_size - 8)
                return refuse(why, why_size,
                              "its header length %" PRIu64 " runs past the end of the file "
                              "(%" PRIu64 " bytes)", n, file_size);
        if (n < 2)
                return refuse(why, why_size,
                              "its header length %" PRIu64 " is too short for a JSON object", n);
        *ret = n;
        return 0;
}

/* A JSON integer in [0, INT64_MAX] (jansson refuses larger ones as it parses). */
static bool json_to_u64(const json_t *v, uint64_t *ret) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
                return false;
        *ret = (uint64_t) json_integer_value(v);
        return true;
}

static void format_shape(const SafetensorsTensor *t, char *buf, size_t size) {
        size_t at = 0;

        at += (size_t) snprintf(buf, size, "[");
        for (size_t i = 0; i < t->n_dims && at < size; i++)
                at += (size_t) snprintf(buf + at, size - at, "%s%" PRIu64, i ? ", " : "",
                                        t->shape[i]);
        if (at < size)
                (void) snprintf(buf + at, size - at, "]");
}

/* Bytes of count elements of dtype d; false on overflow or a count that ends mid-byte. */
static bool elements_bytes(uint64_t count, SafetensorsDtype d, uint64_t *ret) {
        unsigned bits = safetensors_dtype_bits(d);

        if (count > UINT64_MAX / bits || count * bits % 8 != 0)
                return false;
        *ret = count * bits / 8;
        return true;
}

static int tensor_parse(const char *name, const json_t *v, uint64_t data_size,
                        SafetensorsTensor *t, char *why, size_t why_size) {
        const json_t *dtype, *shape, *offsets, *x;
        const char *key;
        uint64_t count = 1, bytes;
        size_t i;

        if (strlen(name) > SAFETENSORS_NAME_MAX)
                return refuse(why, why_size, "a tensor's name is longer than %d bytes",
                              SAFETENSORS_NAME_MAX);
        if (!*name)
                return refuse(why, why_size, "a tensor has an empty name");
        if (!json_is_object(v))
                return refuse(why, why_size, "tensor \"%s\" is not a JSON object", name);
        json_object_foreach((json_t *) v, key, x)
                if (!streq(key, "dtype") && !streq(key, "shape") && !streq(key, "data_offsets"))
                        return refuse(why, why_size, "tensor \"%s\" has an unknown key \"%s\"",
                                      name, key);
        dtype = json_object_get(v, "dtype");
        shape = json_object_get(v, "shape");
        offsets = json_object_get(v, "data_offsets");
        if (!json_is_string(dtype) || !json_is_array(shape) || !json_is_array(offsets))
                return refuse(why, why_size,
                              "tensor \"%s\" needs a string \"dtype\", an array \"shape\" and an "
                              "array \"data_offsets\"", name);
        t->dtype = safetensors_dtype_from_string(json_string_value(dtype));
        if (t->dtype < 0)
                return refuse(why, why_size, "tensor \"%s\" has the unknown dtype \"%.32s\"",
                              name, json_string_value(dtype));
        if (json_array_size(shape) > SAFETENSORS_DIMS_MAX)
                return refuse(why, why_size, "tensor \"%s\" has %zu dimensions, more than %d",
                              name, json_array_size(shape), SAFETENSORS_DIMS_MAX);
        t->n_dims = json_array_size(shape);
        json_array_foreach(shape, i, x) {
                if (!json_to_u64(x, &t->shape[i]))
                        return refuse(why, why_size,
                                      "tensor \"%s\": dimension %zu of its shape is not a "
                                      "non-negative integer", name, i);
                if (t->shape[i] != 0 && count > UINT64_MAX / t->shape[i])
                        return refuse(why, why_size,
                                      "tensor \"%s\": its shape has more elements than 2^64",
                                      name);
                count *= t->shape[i];
        }
        if (json_array_size(offsets) != 2 || !json_to_u64(json_array_get(offsets, 0), &t->begin) ||
            !json_to_u64(json_array_get(offsets, 1), &t->end))
                return refuse(why, why_size,
                              "tensor \"%s\": data_offsets must be two non-negative integers",
                              name);
        if (t->begin > t->end || t->end > data_size)
                return refuse(why, why_size,
                              "tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] are out of "
                              "the data's %" PRIu64 " bytes", name, t->begin, t->end, data_size);
        if (!elements_bytes(count, t->dtype, &bytes) || bytes != t->end - t->begin) {
                char s[96];
                format_shape(t, s, sizeof s);
                return refuse(why, why_size,
                              "tensor \"%s\": shape %s of %s is not the %" PRIu64 " bytes of "
                              "its data_offsets", name, s, dtypes[t->dtype].name,
                              t->end - t->begin);
        }
        t->name = strdup(name);
        return t->name ? 0 : -ENOMEM;
}

static int metadata_parse(SafetensorsHeader *h, const json_t *v, char *why, size_t why_size) {
        const char *key;
        json_t *x;

        if (!json_is_object(v))
                return refuse(why, why_size, "its \"__metadata__\" is not a JSON object");
        h->metadata = calloc(2 * json_object_size(v) + 1, sizeof(char *));
        if (!h->metadata)
                return -ENOMEM;
        json_object_foreach((json_t *) v, key, x) {
                if (!json_is_string(x))
                        return refuse(why, why_size,
                                      "its \"__metadata__\" value of \"%.64s\" is not a string",
                                      key);
                h->metadata[2 * h->n_metadata] = strdup(key);
                h->metadata[2 * h->n_metadata + 1] = strdup(json_string_value(x));
                h->n_metadata++;
                if (!h->metadata[2 * h->n_metadata - 2] || !h->metadata[2 * h->n_metadata - 1])
                        return -ENOMEM;
        }
        return 0;
}

static int by_offset(const void *a, const void *b) {
        const SafetensorsTensor *x = *(const SafetensorsTensor *const *) a,
                                *y = *(const SafetensorsTensor *const *) b;
        if (x->begin != y->begin)
                return x->begin < y->begin ? -1 : 1;
        return x->end < y->end ? -1 : x->end > y->end;
}

static int by_name(const void *a, const void *b) {
        return strcmp(((const SafetensorsTensor *) a)->name, ((const SafetensorsTensor *) b)->name);
}

/* The format's rule: sorted by offset, the tensors cover the data exactly. */
static int coverage_check(const SafetensorsHeader *h, char *why, size_t why_size) {
        _cleanup_free_ const SafetensorsTensor **order = NULL;
        const SafetensorsTensor *last = NULL;
        uint64_t at = 0;

        order = calloc(h->n_tensors + 1, sizeof *order);
        if (!order)
                return -ENOMEM;
        for (size_t i = 0; i < h->n_tensors; i++)
                order[i] = &h->tensors[i];
        qsort(order, h->n_tensors, sizeof *order, by_offset);
        for (size_t i = 0; i < h->n_tensors; i++) {
                const SafetensorsTensor *t = order[i];
                if (t->begin < at)
                        return refuse(why, why_size,
                                      "tensors \"%s\" and \"%s\" overlap in the data", last->name,
                                      t->name);
                if (t->begin > at)
                        return refuse(why, why_size,
                                      "bytes %" PRIu64 " to %" PRIu64 " of the data, before "
                                      "tensor \"%s\", belong to no tensor", at, t->begin,
                                      t->name);
                at = t->end;
                last = t;
        }
        if (at != h->data_size)
                return refuse(why, why_size,
                              "the data's last %" PRIu64 " bytes belong to no tensor",
                              h->data_size - at);
        return 0;
}

int safetensors_header_parse(const char *json, size_t json_size, uint64_t file_size,
                             SafetensorsHeader **ret, char *why, size_t why_size) {
        _cleanup_(safetensors_header_freep) SafetensorsHeader *h = NULL;
        json_t *root, *v;
        json_error_t e;
        const char *key;
        int r;

        if (json_size > SAFETENSORS_HEADER_MAX) {
                (void) refuse(why, why_size, "its header of %zu bytes is over the limit of "
                              "%" PRIu64, json_size, SAFETENSORS_HEADER_MAX);
                return -E2BIG;
        }
        if (file_size < 8 || json_size > file_size - 8)
                return refuse(why, why_size, "its header runs past the end of the file");
        if (json_size < 2 || json[0] != '{')
                return refuse(why, why_size, "its header does not begin with '{'");

        h = calloc(1, sizeof *h);
        if (!h)
                return -ENOMEM;
        h->header_size = json_size;
        h->data_offset = 8 + json_size;
        h->data_size = file_size - h->data_offset;

        /* Trailing spaces (the writers' padding) are whitespace to jansson. */
        root = json_loadb(json, json_size, JSON_REJECT_DUPLICATES, &e);
        if (!root)
                return refuse(why, why_size, "its header is not JSON: %s (at byte %d)", e.text,
                              e.position);
        if (!json_is_object(root)) {
                json_decref(root);
                return refuse(why, why_size, "its header is not a JSON object");
        }
        h->tensors = calloc(json_object_size(root) + 1, sizeof *h->tensors);
        if (!h->tensors) {
                json_decref(root);
                return -ENOMEM;
        }
        r = 0;
        json_object_foreach(root, key, v) {
                if (streq(key, "__metadata__"))
                        r = metadata_parse(h, v, why, why_size);
                else {
                        r = tensor_parse(key, v, h->data_size, &h->tensors[h->n_tensors], why,
                                         why_size);
                        if (r >= 0)
                                h->n_tensors++;
                }
                if (r < 0)
                        break;
        }
        json_decref(root);
        if (r < 0)
                return r;
        r = coverage_check(h, why, why_size);
        if (r < 0)
                return r;
        qsort(h->tensors, h->n_tensors, sizeof *h->tensors, by_name);
        *ret = TAKE_PTR(h);
        return 0;
}

static int pread_full(int fd, void *buf, size_t size, uint64_t offset) {
        uint8_t *p = buf;

        while (size > 0) {
                ssize_t n = pread(fd, p, size, (off_t) offset);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EIO; /* shorter than fstat said: it changed under us */
                p += n;
                size -= (size_t) n;
                offset += (uint64_t) n;
        }
        return 0;
}

int safetensors_header_read(int fd, SafetensorsHeader **ret, char *why, size_t why_size) {
        _cleanup_free_ char *json = NULL;
        uint8_t first[8];
        struct stat st;
        uint64_t n;
        int r;

        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return refuse(why, why_size, "it is not a regular file");
        r = pread_full(fd, first, sizeof first < (uint64_t) st.st_size ? sizeof first
                                                                       : (size_t) st.st_size, 0);
        if (r < 0)
                return r;
        r = safetensors_header_size(first, (uint64_t) st.st_size, &n, why, why_size);
        if (r < 0)
                return r;
        json = malloc(n);
        if (!json)
                return -ENOMEM;
        r = pread_full(fd, json, n, 8);
        if (r < 0)
                return r;
        return safetensors_header_parse(json, n, (uint64_t) st.st_size, ret, why, why_size);
}

const SafetensorsTensor *safetensors_header_find(const SafetensorsHeader *h, const char *name) {
        SafetensorsTensor key = { .name = (char *) name };

        if (!h || !name || h->n_tensors == 0)
                return NULL;
        return bsearch(&key, h->tensors, h->n_tensors, sizeof key, by_name);
}

uint64_t safetensors_tensor_elements(const SafetensorsTensor *t) {
        uint64_t count = 1;

        for (size_t i = 0; i < t->n_dims; i++)
                count *= t->shape[i]; /* cannot overflow: checked when parsed */
        return count;
}

uint64_t safetensors_tensor_bytes(const SafetensorsTensor *t) {
        return t->end - t->begin; /* equal to the shape's bytes: checked when parsed */
}

/* ---- the index ----------------------------------------------------------------------------- */

SafetensorsIndex *safetensors_index_free(SafetensorsIndex *x) {
        if (!x)
                return NULL;
        for (size_t i = 0; i < x->n_files; i++)
                free(x->files[i]);
        free(x->files);
        for (size_t i = 0; i < x->n_entries; i++)
                free(x->entries[i].name);
        free(x->entries);
        return mfree(x);
}

static bool file_name_ok(const char *f) {
        return !isempty(f) && !strchr(f, '/') && !streq(f, ".") && !streq(f, "..") &&
               strlen(f) <= 255;
}

static int index_by_name(const void *a, const void *b) {
        return strcmp(((const SafetensorsIndexEntry *) a)->name,
                      ((const SafetensorsIndexEntry *) b)->name);
}

static int index_add(SafetensorsIndex *x, const char *name, const char *file) {
        size_t f;

        for (f = 0; f < x->n_files; f++)
                if (streq(x->files[f], file))
                        break;
        if (f == x->n_files) {
                x->files[f] = strdup(file);
                if (!x->files[f])
                        return -ENOMEM;
                x->n_files++;
        }
        x->entries[x->n_entries].name = strdup(name);
        if (!x->entries[x->n_entries].name)
                return -ENOMEM;
        x->entries[x->n_entries++].file = f;
        return 0;
}

int safetensors_index_parse(const char *json, size_t json_size, SafetensorsIndex **ret,
                            char *why, size_t why_size) {
        _cleanup_(safetensors_index_freep) SafetensorsIndex *x = NULL;
        json_t *root, *map, *v;
        json_error_t e;
        const char *key;
        int r = 0;

        if (json_size > SAFETENSORS_INDEX_MAX) {
                (void) refuse(why, why_size, "the index has %zu bytes, over the limit of %" PRIu64,
                              json_size, SAFETENSORS_INDEX_MAX);
                return -E2BIG;
        }
        root = json_loadb(json, json_size, JSON_REJECT_DUPLICATES, &e);
        if (!root)
                return refuse(why, why_size, "the index is not JSON: %s (line %d)", e.text,
                              e.line);
        map = json_object_get(root, "weight_map");
        if (!json_is_object(root) || !json_is_object(map) || json_object_size(map) == 0) {
                json_decref(root);
                return refuse(why, why_size,
                              "the index has no \"weight_map\" object naming tensors");
        }
        x = calloc(1, sizeof *x);
        if (x) {
                x->files = calloc(json_object_size(map), sizeof(char *));
                x->entries = calloc(json_object_size(map), sizeof *x->entries);
        }
        if (!x || !x->files || !x->entries) {
                json_decref(root);
                return -ENOMEM;
        }
        json_object_foreach(map, key, v) {
                if (strlen(key) > SAFETENSORS_NAME_MAX || !*key)
                        r = refuse(why, why_size, "the index names a tensor with an empty name "
                                   "or one longer than %d bytes", SAFETENSORS_NAME_MAX);
                else if (!json_is_string(v))
                        r = refuse(why, why_size, "the index's file of tensor \"%s\" is not a "
                                   "string", key);
                else if (!file_name_ok(json_string_value(v)))
                        r = refuse(why, why_size,
                                   "the index puts tensor \"%s\" in \"%.255s\", which is not a "
                                   "file name in the index's own directory", key,
                                   json_string_value(v));
                else
                        r = index_add(x, key, json_string_value(v));
                if (r < 0)
                        break;
        }
        json_decref(root);
        if (r < 0)
                return r;
        qsort(x->entries, x->n_entries, sizeof *x->entries, index_by_name);
        *ret = TAKE_PTR(x);
        return 0;
}

const SafetensorsIndexEntry *safetensors_index_find(const SafetensorsIndex *x, const char *name) {
        SafetensorsIndexEntry key = { .name = (char *) name };

        if (!x || !name || x->n_entries == 0)
                return NULL;
        return bsearch(&key, x->entries, x->n_entries, sizeof key, index_by_name);
}

int safetensors_index_check(const SafetensorsIndex *x, SafetensorsHeader *const *headers,
                            char *why, size_t why_size) {
        for (size_t i = 0; i < x->n_entries; i++)
                if (!safetensors_header_find(headers[x->entries[i].file], x->entries[i].name))
                        return refuse(why, why_size,
                                      "the index puts tensor \"%s\" in %s, which has no such "
                                      "tensor", x->entries[i].name, x->files[x->entries[i].file]);
        for (size_t f = 0; f < x->n_files; f++)
                for (size_t i = 0; i < headers[f]->n_tensors; i++) {
                        const char *name = headers[f]->tensors[i].name;
                        const SafetensorsIndexEntry *e = safetensors_index_find(x, name);
                        if (!e)
                                return refuse(why, why_size,
                                              "tensor \"%s\" of %s is not in the index", name,
                                              x->files[f]);
                        if (e->file != f)
                                return refuse(why, why_size,
                                              "tensor \"%s\" is in %s, but the index puts it "
                                              "in %s", name, x->files[f], x->files[e->file]);
                }
        return 0;
}

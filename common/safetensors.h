/* safetensors.h: the safetensors checkpoint format, read strictly: a file's header, a directory's index. */
#pragma once

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

/*
 * DESIGN
 *
 * A safetensors file (huggingface/safetensors, its README and tensor.rs) is 8 bytes N (little
 * endian), N bytes of UTF-8 JSON that begin with '{' and may end in spaces, then the data: the
 * header maps each tensor's name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets
 * relative to the data's start, plus an optional "__metadata__" object of strings. The format
 * asks that the tensors, sorted by offset, cover the data exactly (no overlap, no hole, nothing
 * after the last): a reader that accepted holes would read files no writer makes. Nothing is
 * aligned (other writers align nothing), so nothing here assumes it.
 *
 * Everything is refused with a sentence (why, naming the tensor where there is one) and
 * -EBADMSG, or -E2BIG for a header over SAFETENSORS_HEADER_MAX: a header length past the file,
 * JSON that is not an object of objects, duplicate names (jansson's JSON_REJECT_DUPLICATES),
 * an unknown key or dtype, a shape whose byte count disagrees with its offsets or overflows,
 * offsets out of range, overlapping or leaving holes. The JSON is parsed by jansson.
 *
 * A directory's model.safetensors.index.json is {"metadata": {...}, "weight_map": {name: file}}.
 * Its file names are bare names of files in the same directory: a name with '/', "." or "..",
 * empty or holding a NUL is refused, so no index can lead outside its directory.
 */

/* The format's own cap (the reference reader's MAX_HEADER_SIZE). */
#define SAFETENSORS_HEADER_MAX UINT64_C(100000000)
/* Ours: more dimensions or a longer name than any model has is a malformed file. */
#define SAFETENSORS_DIMS_MAX 32
#define SAFETENSORS_NAME_MAX 1024
#define SAFETENSORS_INDEX_NAME "model.safetensors.index.json"
/* An index is JSON of names only; a model's is well under a megabyte. */
#define SAFETENSORS_INDEX_MAX (UINT64_C(64) << 20)

/* The format's dtypes; the names are the header's. */
typedef enum SafetensorsDtype {
        SAFETENSORS_BOOL,
        SAFETENSORS_F4,
        SAFETENSORS_F6_E2M3,
        SAFETENSORS_F6_E3M2,
        SAFETENSORS_U8,
        SAFETENSORS_I8,
        SAFETENSORS_F8_E5M2,
        SAFETENSORS_F8_E4M3,
        SAFETENSORS_F8_E8M0,
        SAFETENSORS_I16,
        SAFETENSORS_U16,
        SAFETENSORS_F16,
        SAFETENSORS_BF16,
        SAFETENSORS_I32,
        SAFETENSORS_U32,
        SAFETENSORS_F32,
        SAFETENSORS_C64,
        SAFETENSORS_F64,
        SAFETENSORS_I64,
        SAFETENSORS_U64,
        _SAFETENSORS_DTYPE_MAX,
        _SAFETENSORS_DTYPE_INVALID = -EINVAL,
} SafetensorsDtype;

const char *safetensors_dtype_to_string(SafetensorsDtype d);
SafetensorsDtype safetensors_dtype_from_string(const char *s);
/* Bits per element: 4, 6, 8, 16, 32, 64 (C64: 64); 0 for an invalid dtype. */
unsigned safetensors_dtype_bits(SafetensorsDtype d);

typedef struct SafetensorsTensor {
        char *name;
        SafetensorsDtype dtype;
        size_t n_dims;
        uint64_t shape[SAFETENSORS_DIMS_MAX];
        uint64_t begin, end; /* in the data, which starts at SafetensorsHeader.data_offset */
} SafetensorsTensor;

typedef struct SafetensorsHeader {
        uint64_t header_size;  /* N */
        uint64_t data_offset;  /* 8 + N: where the data starts in the file */
        uint64_t data_size;    /* the file's size less data_offset */
        SafetensorsTensor *tensors; /* by name */
        size_t n_tensors;
        char **metadata; /* key, value, key, value, ... (the "__metadata__" strings) */
        size_t n_metadata; /* pairs */
} SafetensorsHeader;

SafetensorsHeader *safetensors_header_free(SafetensorsHeader *h);
DEFINE_TRIVIAL_CLEANUP_FUNC(SafetensorsHeader *, safetensors_header_free);

/*
 * N from the file's first 8 bytes: 0, or -EBADMSG when the file is shorter than 8 + N or N is
 * under 2 ("{}"), -E2BIG over SAFETENSORS_HEADER_MAX; why says which.
 */
int safetensors_header_size(const uint8_t first[8], uint64_t file_size, uint64_t *ret,
                            char *why, size_t why_size);

/* The header's JSON (json_size == N bytes) of a file of file_size bytes; see DESIGN. */
int safetensors_header_parse(const char *json, size_t json_size, uint64_t file_size,
                             SafetensorsHeader **ret, char *why, size_t why_size);

/* The header of the file open as fd (pread: its offset does not move); -errno when it cannot
 * be read, else as above. */
int safetensors_header_read(int fd, SafetensorsHeader **ret, char *why, size_t why_size);

/* The tensor called name, or NULL. */
const SafetensorsTensor *safetensors_header_find(const SafetensorsHeader *h, const char *name);

/* Elements (the product of the shape; 1 for a scalar) and bytes of a parsed tensor. */
uint64_t safetensors_tensor_elements(const SafetensorsTensor *t);
uint64_t safetensors_tensor_bytes(const SafetensorsTensor *t);

typedef struct SafetensorsIndexEntry {
        char *name;
        size_t file; /* into SafetensorsIndex.files */
} SafetensorsIndexEntry;

typedef struct SafetensorsIndex {
        char **files; /* the distinct file names, in order of first appearance */
        size_t n_files;
        SafetensorsIndexEntry *entries; /* by name */
        size_t n_entries;
} SafetensorsIndex;

SafetensorsIndex *safetensors_index_free(SafetensorsIndex *x);
DEFINE_TRIVIAL_CLEANUP_FUNC(SafetensorsIndex *, safetensors_index_free);

/* An index's JSON; -EBADMSG with why (see DESIGN), -E2BIG over SAFETENSORS_INDEX_MAX. */
int safetensors_index_parse(const char *json, size_t json_size, SafetensorsIndex **ret,
                            char *why, size_t why_size);

/* The entry called name, or NULL. */
const SafetensorsIndexEntry *safetensors_index_find(const SafetensorsIndex *x, const char *name);

/*
 * That x and the headers of its files (headers[i] is x->files[i]'s) agree: every name of the
 * index is a tensor of the file the index names, and every tensor of those files is in the
 * index, under its own file. -EBADMSG with why (naming the tensor and the file) otherwise.
 */
int safetensors_index_check(const SafetensorsIndex *x, SafetensorsHeader *const *headers,
                            char *why, size_t why_size);

/* test-safetensors.c: common/safetensors.c: headers and indexes read, and every refusal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/safetensors.h"

/* Parses json as the header of a file with data_size bytes of data after it. */
static int parse(const char *json, uint64_t data_size, SafetensorsHeader **ret, char *why,
                 size_t why_size) {
        size_t n = strlen(json);
        return safetensors_header_parse(json, n, 8 + n + data_size, ret, why, why_size);
}

/* Refused with -EBADMSG and a why that contains expect. */
static void refused(const char *json, uint64_t data_size, const char *expect) {
        SafetensorsHeader *h = NULL;
        char why[512] = "";

        assert_int_equal(parse(json, data_size, &h, why, sizeof why), -EBADMSG);
        assert_null(h);
        if (!strstr(why, expect))
                fail_msg("for %s: expected \"%s\" in \"%s\"", json, expect, why);
}

static void test_header_read(void **state) {
        _cleanup_(safetensors_header_freep) SafetensorsHeader *h = NULL;
        const SafetensorsTensor *t;
        char why[256] = "";
        /* Out of name order, a scalar, an empty tensor, metadata, the writers' space padding. */
        const char *json =
                "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                "\"__metadata__\":{\"format\":\"pt\",\"k\":\"v\"},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                "\"e\":{\"dtype\":\"I64\",\"shape\":[0,7],\"data_offsets\":[4,4]},"
                "\"b\":{\"dtype\":\"BOOL\",\"shape\":[4],\"data_offsets\":[4,8]}}      ";

        assert_int_equal(parse(json, 20, &h, why, sizeof why), 0);
        assert_int_equal(h->header_size, strlen(json));
        assert_int_equal(h->data_offset, 8 + strlen(json));
        assert_int_equal(h->data_size, 20);
        assert_int_equal(h->n_tensors, 4);
        assert_string_equal(h->tensors[0].name, "a"); /* by name */
        assert_string_equal(h->tensors[3].name, "w");
        t = safetensors_header_find(h, "w");
        assert_non_null(t);
        assert_int_equal(t->dtype, SAFETENSORS_BF16);
        assert_int_equal(t->n_dims, 2);
        assert_int_equal(t->shape[0], 2);
        assert_int_equal(t->shape[1], 3);
        assert_int_equal(t->begin, 8);
        assert_int_equal(safetensors_tensor_elements(t), 6);
        assert_int_equal(safetensors_tensor_bytes(t), 12);
        t = safetensors_header_find(h, "a");
        assert_int_equal(t->n_dims, 0);
        assert_int_equal(safetensors_tensor_elements(t), 1);
        assert_int_equal(safetensors_tensor_elements(safetensors_header_find(h, "e")), 0);
        assert_null(safetensors_header_find(h, "x"));
        assert_null(safetensors_header_find(h, "__metadata__"));
        assert_int_equal(h->n_metadata, 2);
        assert_string_equal(h->metadata[0], "format");
        assert_string_equal(h->metadata[1], "pt");
}

static void test_dtypes(void **state) {
        assert_int_equal(safetensors_dtype_from_string("F8_E4M3"), SAFETENSORS_F8_E4M3);
        assert_string_equal(safetensors_dtype_to_string(SAFETENSORS_U64), "U64");
        assert_int_equal(safetensors_dtype_bits(SAFETENSORS_F4), 4);
        assert_int_equal(safetensors_dtype_bits(SAFETENSORS_F6_E2M3), 6);
        assert_int_equal(safetensors_dtype_from_string("f32"), _SAFETENSORS_DTYPE_INVALID);
        assert_int_equal(safetensors_dtype_from_string(NULL), _SAFETENSORS_DTYPE_INVALID);
        assert_null(safetensors_dtype_to_string(_SAFETENSORS_DTYPE_MAX));
        for (int d = 0; d < _SAFETENSORS_DTYPE_MAX; d++)
                assert_int_equal(safetensors_dtype_from_string(safetensors_dtype_to_string(d)), d);
}

static void test_sub_byte(void **state) {
        _cleanup_(safetensors_header_freep) SafetensorsHeader *h = NULL;
        char why[256];

        /* 6 four-bit elements are 3 bytes; 3 of them would end mid-byte. */
        assert_int_equal(parse("{\"x\":{\"dtype\":\"F4\",\"shape\":[6],\"data_offsets\":[0,3]}}",
                               3, &h, why, sizeof why), 0);
        refused("{\"x\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                "shape [3] of F4 is not the 2 bytes");
        refused("{\"x\":{\"dtype\":\"F6_E3M2\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
                "shape [3] of F6_E3M2");
}

static void test_header_refusals(void **state) {
        refused("", 0, "does not begin with '{'");
        refused(" {}", 0, "does not begin with '{'");
        refused("{\"a\":", 0, "not JSON");
        refused("{} x", 0, "not JSON");
        refused("[1,2]", 0, "does not begin with '{'");
        refused("{\"a\":1}", 0, "tensor \"a\" is not a JSON object");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                "duplicate");
        refused("{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                "tensor \"a\" has the unknown dtype \"F33\"");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4,
                "tensor \"a\" has an unknown key \"x\"");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor \"a\" needs");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                "dimension 0 of its shape is not a non-negative integer");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4,
                "dimension 0");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
                "tensor \"a\": shape [2] of F32 is not the 4 bytes of its data_offsets");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,2],"
                "\"data_offsets\":[0,4]}}", 4, "more elements than 2^64");
        refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967295],"
                "\"data_offsets\":[0,4]}}", 4, "shape [4294967296, 4294967295] of F64");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4,
                "data_offsets [0, 8] are out of the data's 4 bytes");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4,
                "are out of");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4,
                "data_offsets must be two non-negative integers");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,99999999999999999999]}}",
                4, "not JSON");
        /* Overlap, a hole, bytes after the last tensor. */
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
                "tensors \"a\" and \"b\" overlap");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 12,
                "bytes 4 to 8 of the data, before tensor \"b\", belong to no tensor");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 6,
                "the data's last 2 bytes belong to no tensor");
        refused("{\"__metadata__\":{\"a\":1}}", 0, "\"__metadata__\" value of \"a\" is not a string");
        refused("{\"__metadata__\":[]}", 0, "\"__metadata__\" is not a JSON object");
        refused("{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                "a tensor has an empty name");
        refused("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
                "not JSON");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
                "1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "33 dimensions, more than 32");
        refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}\xff", 4,
                "not JSON");
}

static void test_long_name(void **state) {
        char json[2048], name[SAFETENSORS_NAME_MAX + 2];

        memset(name, 'n', sizeof name - 1);
        name[sizeof name - 1] = 0;
        (void) snprintf(json, sizeof json,
                        "{\"%s\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", name);
        refused(json, 1, "longer than 1024 bytes");
}

static void test_header_size(void **state) {
        uint8_t first[8] = { 0x10, 0, 0, 0, 0, 0, 0, 0 };
        char why[256] = "";
        uint64_t n = 0;

        assert_int_equal(safetensors_header_size(first, 8 + 16, &n, why, sizeof why), 0);
        assert_int_equal(n, 16);
        assert_int_equal(safetensors_header_size(first, 8 + 15, &n, why, sizeof why), -EBADMSG);
        assert_non_null(strstr(why, "its header length 16 runs past the end of the file (23 bytes)"));
        assert_int_equal(safetensors_header_size(first, 7, &n, why, sizeof why), -EBADMSG);
        assert_non_null(strstr(why, "fewer than the 8"));
        first[0] = 1;
        assert_int_equal(safetensors_header_size(first, 100, &n, why, sizeof why), -EBADMSG);
        assert_non_null(strstr(why, "too short"));
        /* 100 MiB: over the format's 100,000,000 bytes, whatever the file's size. */
        memset(first, 0, sizeof first);
        first[3] = 0x06, first[2] = 0x40; /* 0x06400000 = 104857600 */
        assert_int_equal(safetensors_header_size(first, UINT64_C(1) << 40, &n, why, sizeof why),
                         -E2BIG);
        assert_non_null(strstr(why, "its header length 104857600 is over the limit of 100000000"));
        memset(first, 0xff, sizeof first);
        assert_int_equal(safetensors_header_size(first, UINT64_MAX, &n, why, sizeof why), -E2BIG);
}

/* The whole file through a descriptor: a memfd holding a header and its data. */
static void test_header_read_fd(void **state) {
        _cleanup_(safetensors_header_freep) SafetensorsHeader *h = NULL;
        const char json[] = "{\"x\":{\"dtype\":\"I16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
        uint8_t len[8] = { sizeof json - 1 };
        char why[256] = "";
        int fd = memfd_create("st", MFD_CLOEXEC);

        assert_true(fd >= 0);
        assert_int_equal(write(fd, len, 8), 8);
        assert_int_equal(write(fd, json, sizeof json - 1), sizeof json - 1);
        assert_int_equal(write(fd, "abcd", 4), 4);
        assert_int_equal(safetensors_header_read(fd, &h, why, sizeof why), 0);
        assert_int_equal(h->n_tensors, 1);
        assert_int_equal(h->data_offset, 8 + sizeof json - 1);
        h = safetensors_header_free(h);
        /* Truncated: the data no longer covers the tensor. */
        assert_int_equal(ftruncate(fd, 8 + (off_t) sizeof json - 1 + 2), 0);
        assert_int_equal(safetensors_header_read(fd, &h, why, sizeof why), -EBADMSG);
        assert_non_null(strstr(why, "data_offsets [0, 4] are out of the data's 2 bytes"));
        /* Cut inside the header. */
        assert_int_equal(ftruncate(fd, 20), 0);
        assert_int_equal(safetensors_header_read(fd, &h, why, sizeof why), -EBADMSG);
        assert_non_null(strstr(why, "runs past the end of the file (20 bytes)"));
        assert_int_equal(ftruncate(fd, 3), 0);
        assert_int_equal(safetensors_header_read(fd, &h, why, sizeof why), -EBADMSG);
        assert_null(h);
        close(fd);
        /* Not a regular file. */
        int p[2];
        assert_int_equal(pipe(p), 0);
        assert_int_equal(safetensors_header_read(p[0], &h, why, sizeof why), -EBADMSG);
        assert_non_null(strstr(why, "not a regular file"));
        close(p[0]);
        close(p[1]);
}

static void index_refused(const char *json, const char *expect) {
        SafetensorsIndex *x = NULL;
        char why[512] = "";

        assert_int_equal(safetensors_index_parse(json, strlen(json), &x, why, sizeof why),
                         -EBADMSG);
        assert_null(x);
        if (!strstr(why, expect))
                fail_msg("for %s: expected \"%s\" in \"%s\"", json, expect, why);
}

static void test_index(void **state) {
        _cleanup_(safetensors_index_freep) SafetensorsIndex *x = NULL;
        const char *json = "{\"metadata\":{\"total_size\":28},\"weight_map\":{"
                           "\"w\":\"model-00002-of-00002.safetensors\","
                           "\"a\":\"model-00001-of-00002.safetensors\","
                           "\"b\":\"model-00002-of-00002.safetensors\"}}";
        char why[256] = "";

        assert_int_equal(safetensors_index_parse(json, strlen(json), &x, why, sizeof why), 0);
        assert_int_equal(x->n_files, 2);
        assert_string_equal(x->files[0], "model-00002-of-00002.safetensors");
        assert_int_equal(x->n_entries, 3);
        assert_string_equal(x->entries[0].name, "a");
        assert_int_equal(safetensors_index_find(x, "a")->file, 1);
        assert_int_equal(safetensors_index_find(x, "w")->file, 0);
        assert_null(safetensors_index_find(x, "z"));

        index_refused("{\"weight_map\":{\"a\":\"../x.safetensors\"}}",
                      "puts tensor \"a\" in \"../x.safetensors\", which is not a file name in "
                      "the index's own directory");
        index_refused("{\"weight_map\":{\"a\":\"..\"}}", "not a file name");
        index_refused("{\"weight_map\":{\"a\":\"/etc/passwd\"}}", "not a file name");
        index_refused("{\"weight_map\":{\"a\":\"\"}}", "not a file name");
        index_refused("{\"weight_map\":{\"a\":\"sub/x\"}}", "not a file name");
        index_refused("{\"weight_map\":{\"a\":3}}", "is not a string");
        index_refused("{\"weight_map\":{}}", "no \"weight_map\"");
        index_refused("{\"metadata\":{}}", "no \"weight_map\"");
        index_refused("[]", "no \"weight_map\"");
        index_refused("{\"weight_map\":{\"a\":\"x\",\"a\":\"y\"}}", "duplicate");
        index_refused("{\"weight_map\"", "not JSON");
}

/* The index against its files' headers. */
static void test_index_check(void **state) {
        _cleanup_(safetensors_index_freep) SafetensorsIndex *x = NULL;
        _cleanup_(safetensors_header_freep) SafetensorsHeader *h0 = NULL, *h1 = NULL;
        const char *json = "{\"weight_map\":{\"a\":\"f0\",\"b\":\"f1\"}}";
        char why[256] = "";

        assert_int_equal(safetensors_index_parse(json, strlen(json), &x, why, sizeof why), 0);
        assert_int_equal(parse("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                               &h0, why, sizeof why), 0);
        assert_int_equal(parse("{\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                               "\"c\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
                               &h1, why, sizeof why), 0);
        SafetensorsHeader *headers[2] = { h0, h1 };
        assert_int_equal(safetensors_index_check(x, headers, why, sizeof why), -EBADMSG);
        assert_string_equal(why, "tensor \"c\" of f1 is not in the index");
        headers[0] = h1, headers[1] = h0;
        assert_int_equal(safetensors_index_check(x, headers, why, sizeof why), -EBADMSG);
        assert_string_equal(why, "the index puts tensor \"a\" in f0, which has no such tensor");
        x = safetensors_index_free(x);
        json = "{\"weight_map\":{\"a\":\"f0\",\"b\":\"f1\",\"c\":\"f0\"}}";
        assert_int_equal(safetensors_index_parse(json, strlen(json), &x, why, sizeof why), 0);
        headers[0] = h0, headers[1] = h1;
        assert_int_equal(safetensors_index_check(x, headers, why, sizeof why), -EBADMSG);
        assert_string_equal(why, "the index puts tensor \"c\" in f0, which has no such tensor");
        x = safetensors_index_free(x);
        json = "{\"weight_map\":{\"a\":\"f0\",\"b\":\"f1\",\"c\":\"f1\"}}";
        assert_int_equal(safetensors_index_parse(json, strlen(json), &x, why, sizeof why), 0);
        assert_int_equal(safetensors_index_check(x, headers, why, sizeof why), 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_header_read),
                cmocka_unit_test(test_dtypes),
                cmocka_unit_test(test_sub_byte),
                cmocka_unit_test(test_header_refusals),
                cmocka_unit_test(test_long_name),
                cmocka_unit_test(test_header_size),
                cmocka_unit_test(test_header_read_fd),
                cmocka_unit_test(test_index),
                cmocka_unit_test(test_index_check),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

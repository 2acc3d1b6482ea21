/* test-codec.c: the pure codecs: the status trailer's rich error detail; per-parameter dtypes. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "google-protobuf-any.pb-c.h"
#include "google-rpc-status.pb-c.h"
#include "common/macro.h"
#include "codec/codec-status.h"
#include "codec/codec.h"
#include "core/build-plan.h"
#include "core/resource-limits.h"
#include "core/validate.h"

static void status_freep(Google__Rpc__Status **p) {
        if (*p)
                google__rpc__status__free_unpacked(*p, NULL);
}

static void error_info_freep(Google__Rpc__ErrorInfo **p) {
        if (*p)
                google__rpc__error_info__free_unpacked(*p, NULL);
}

/* Decodes the trailer the way a client does: Status, then the Any by its type URL. */
static Google__Rpc__ErrorInfo *decode(const uint8_t *buf, size_t size, int code, const char *message) {
        _cleanup_(status_freep) Google__Rpc__Status *status = NULL;
        Google__Rpc__ErrorInfo *info;

        status = google__rpc__status__unpack(NULL, size, buf);
        assert_non_null(status);
        assert_int_equal(status->code, code);
        assert_string_equal(status->message, message);
        assert_int_equal(status->n_details, 1);
        assert_string_equal(status->details[0]->type_url, "type.googleapis.com/google.rpc.ErrorInfo");

        info = google__rpc__error_info__unpack(NULL, status->details[0]->value.len, status->details[0]->value.data);
        assert_non_null(info);
        return info;
}

static void test_status_round_trip(void **state) {
        _cleanup_(error_info_freep) Google__Rpc__ErrorInfo *info = NULL;
        _cleanup_free_ uint8_t *buf = NULL;
        size_t size = 0;

        assert_int_equal(codec_status_encode(5, "Unknown family 'llama'", "UNKNOWN_FAMILY", "familyd",
                                             "field", "family", &buf, &size), 0);
        info = decode(buf, size, 5, "Unknown family 'llama'");
        assert_string_equal(info->reason, "UNKNOWN_FAMILY");
        assert_string_equal(info->domain, "familyd");
        assert_int_equal(info->n_metadata, 1);
        assert_string_equal(info->metadata[0]->key, "field");
        assert_string_equal(info->metadata[0]->value, "family");
}

static void test_status_without_metadata(void **state) {
        _cleanup_(error_info_freep) Google__Rpc__ErrorInfo *info = NULL, *no_key = NULL;
        _cleanup_free_ uint8_t *buf = NULL, *buf2 = NULL;
        size_t size = 0, size2 = 0;

        assert_int_equal(codec_status_encode(8, "Shared memory budget exhausted", "SHM_BUDGET", "familyd",
                                             "field", NULL, &buf, &size), 0);
        info = decode(buf, size, 8, "Shared memory budget exhausted");
        assert_string_equal(info->reason, "SHM_BUDGET");
        assert_int_equal(info->n_metadata, 0);

        /* A NULL message is an empty one. */
        assert_int_equal(codec_status_encode(3, NULL, "CONFIG", "familyd", NULL, NULL, &buf2, &size2), 0);
        no_key = decode(buf2, size2, 3, "");
        assert_string_equal(no_key->reason, "CONFIG");
        assert_int_equal(no_key->n_metadata, 0);
}

static void test_status_invalid(void **state) {
        uint8_t *buf = NULL;
        size_t size = 0;

        assert_int_equal(codec_status_encode(5, "m", NULL, "familyd", NULL, NULL, &buf, &size), -EINVAL);
        assert_int_equal(codec_status_encode(5, "m", "X", NULL, NULL, NULL, &buf, &size), -EINVAL);
        assert_null(buf);
}

/* ---- BuildRequest.parameter_dtypes ---- */

typedef Familyd__V1__BuildRequest__ParameterDtypesEntry DtypeEntry;

/* A BuildRequest with n parameter_dtypes entries "p<i>" -> "bf16" (the arrays are the caller's). */
static void request_with(Familyd__V1__BuildRequest *pb, DtypeEntry *e, DtypeEntry **ptrs, char (*keys)[16],
                         size_t n) {
        familyd__v1__build_request__init(pb);
        pb->family = (char *) "f";
        for (size_t i = 0; i < n; i++) {
                familyd__v1__build_request__parameter_dtypes_entry__init(&e[i]);
                snprintf(keys[i], sizeof keys[i], "p%u", (unsigned) i);
                e[i].key = keys[i];
                e[i].value = (char *) "bf16";
                ptrs[i] = &e[i];
        }
        pb->parameter_dtypes = ptrs;
        pb->n_parameter_dtypes = n;
}

static void expect_decode_error(const Familyd__V1__BuildRequest *pb, const char *message) {
        _cleanup_(build_request_done) BuildRequest req = {};
        FamilyError e = FAMILY_ERROR_NULL;

        assert_int_equal(codec_build_request_decode(pb, &req, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_INVALID_ARGUMENT);
        assert_string_equal(e.reason, "LIMIT");
        assert_string_equal(e.field, "parameter_dtypes");
        assert_string_equal(e.message, message);
        assert_null(req.parameter_dtypes);
        family_error_done(&e);
}

static void test_parameter_dtypes_decode(void **state) {
        const size_t max = BUILD_PLAN_MAX_PARAMETER_DTYPES;
        _cleanup_free_ DtypeEntry *e = calloc(max + 1, sizeof(DtypeEntry));
        _cleanup_free_ DtypeEntry **ptrs = calloc(max + 1, sizeof(DtypeEntry *));
        _cleanup_free_ char(*keys)[16] = calloc(max + 1, sizeof *keys);
        Familyd__V1__BuildRequest pb;
        FamilyError err = FAMILY_ERROR_NULL;

        assert_non_null(e);
        assert_non_null(ptrs);
        assert_non_null(keys);

        /* at the limit: every entry, as sent; names and values are checked at Build step 7 */
        request_with(&pb, e, ptrs, keys, max);
        e[1].key = (char *) "not_a_parameter";
        e[2].value = (char *) "int8";
        {
                _cleanup_(build_request_done) BuildRequest req = {};
                assert_int_equal(codec_build_request_decode(&pb, &req, &err), 0);
                assert_int_equal(req.n_parameter_dtypes, max);
                assert_string_equal(req.parameter_dtypes[0].name, "p0");
                assert_string_equal(req.parameter_dtypes[0].dtype, "bf16");
                assert_string_equal(req.parameter_dtypes[1].name, "not_a_parameter");
                assert_string_equal(req.parameter_dtypes[2].dtype, "int8");
                assert_string_equal(req.parameter_dtypes[max - 1].name, "p4095");
        }

        /* one past it */
        request_with(&pb, e, ptrs, keys, max + 1);
        expect_decode_error(&pb, "parameter_dtypes has more than 4096 entries");

        /* a key of 256 bytes passes, 257 do not; a value of 32 passes, 33 do not */
        char key[FAMILYD_MAX_NAME_LENGTH + 2], value[34];
        memset(key, 'k', sizeof key - 1);
        key[sizeof key - 1] = 0;
        memset(value, 'v', sizeof value - 1);
        value[sizeof value - 1] = 0;
        request_with(&pb, e, ptrs, keys, 2);
        e[1].key = key;
        expect_decode_error(&pb, "parameter_dtypes: a key is longer than 256 bytes");
        key[FAMILYD_MAX_NAME_LENGTH] = 0;
        e[1].value = value;
        expect_decode_error(&pb, "parameter_dtypes is longer than 32 bytes");
        value[32] = 0;
        {
                _cleanup_(build_request_done) BuildRequest req = {};
                assert_int_equal(codec_build_request_decode(&pb, &req, &err), 0);
                assert_int_equal(strlen(req.parameter_dtypes[1].name), FAMILYD_MAX_NAME_LENGTH);
                assert_int_equal(strlen(req.parameter_dtypes[1].dtype), 32);
        }

        /* none: nothing */
        request_with(&pb, e, ptrs, keys, 0);
        {
                _cleanup_(build_request_done) BuildRequest req = {};
                assert_int_equal(codec_build_request_decode(&pb, &req, &err), 0);
                assert_null(req.parameter_dtypes);
                assert_int_equal(req.n_parameter_dtypes, 0);
        }
        assert_false(family_error_is_set(&err));
}

/* ParameterSpec.dtype: the registry's canonical name, "" where it names none. */
static void test_family_parameter_dtype(void **state) {
        _cleanup_(arena_done) Arena a;
        ParameterSpec params[] = {
                { .name = (char *) "norm", .init_text = (char *) "ones", .dtype = (char *) "float32" },
                { .name = (char *) "w", .init_text = (char *) "zeros" },
        };
        Family f = {
                .name = (char *) "x", .baseline = (char *) "a.B", .parameters = params,
                .n_parameters = ELEMENTSOF(params), .parallel_axis = _AXIS_INVALID,
                .source = (char *) "f.yaml:1",
        };
        Familyd__V1__Family *pb = NULL;

        arena_init(&a);
        assert_int_equal(codec_family_encode(&a, &f, &pb), 0);
        assert_int_equal(pb->n_parameters, 2);
        assert_string_equal(pb->parameters[0]->dtype, "float32");
        assert_string_equal(pb->parameters[1]->dtype, "");
}

/* Build replies name each parameter's own dtype; Validate reads the applied one. */
static void test_layout_dtypes(void **state) {
        _cleanup_(arena_done) Arena a;
        const int64_t shape[] = { 4 };
        const LayoutParameter params[] = {
                { "norm", shape, 1, NULL, 0, true, DTYPE_FLOAT32 },
                { "w", shape, 1, NULL, 0 },
                { "b", shape, 1, NULL, 0, true, DTYPE_FLOAT16 },
        };
        _cleanup_(layout_done) Layout l = {};
        FamilyError err = FAMILY_ERROR_NULL;
        BuildPlan plan = { .request = { .family = (char *) "x" },
                           .resolved = { .family = (char *) "x", .variant = (char *) "v",
                                         .constructor = (char *) "a.V" } };
        CodecBuildRank rank = { "n0", 0, NULL, 0, NULL };
        Familyd__V1__Build *pb = NULL;

        arena_init(&a);
        assert_int_equal(layout_compute(NULL, params, ELEMENTSOF(params), DTYPE_BFLOAT16, 64, &l, &err), 0);
        CodecBuild b = { &plan, &l, DTYPE_BFLOAT16, 0, NULL, &rank, 1 };
        assert_int_equal(codec_build_encode(&a, "bld-1-1", &b, "s.sock", &pb), 0);
        assert_int_equal(pb->info->layout->n_parameters, 3);
        assert_string_equal(pb->info->layout->parameters[0]->dtype, "float32");
        assert_string_equal(pb->info->layout->parameters[1]->dtype, "bfloat16");
        assert_string_equal(pb->info->layout->parameters[2]->dtype, "float16");
        assert_int_equal(pb->shards[0]->slices[0]->byte_length, 16);
        assert_int_equal(pb->shards[0]->slices[1]->byte_length, 8);
        assert_int_equal(pb->shards[0]->slices[2]->byte_length, 8);

        /* an applied layout's dtype reaches Validate as sent */
        Familyd__V1__ModelBoundary mb = FAMILYD__V1__MODEL_BOUNDARY__INIT, *mbs[] = { &mb };
        mb.build_id = (char *) "bld-1-1";
        mb.applied_layout = pb->info->layout;
        ModelBoundary *out = NULL;
        size_t n = 0;
        assert_int_equal(codec_model_decode(&a, mbs, 1, &out, &n, &err), 0);
        assert_int_equal(n, 1);
        assert_string_equal(out[0].layout.parameters[0].dtype, "float32");
        assert_string_equal(out[0].layout.parameters[2].dtype, "float16");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_status_round_trip),
                cmocka_unit_test(test_status_without_metadata),
                cmocka_unit_test(test_status_invalid),
                cmocka_unit_test(test_parameter_dtypes_decode),
                cmocka_unit_test(test_family_parameter_dtype),
                cmocka_unit_test(test_layout_dtypes),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

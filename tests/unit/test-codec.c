/* test-codec.c: the pure codecs; here the rich error detail of the status trailer. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "google-protobuf-any.pb-c.h"
#include "google-rpc-status.pb-c.h"
#include "common/macro.h"
#include "codec/codec-status.h"

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

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_status_round_trip),
                cmocka_unit_test(test_status_without_metadata),
                cmocka_unit_test(test_status_invalid),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

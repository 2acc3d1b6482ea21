/* test-reflection.c: server reflection answered from the real embedded descriptor set. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "google-protobuf-descriptor.pb-c.h"
#include "grpc-reflection-v1-reflection.pb-c.h"
#include "grpc-reflection-v1alpha-reflection.pb-c.h"
#include "common/macro.h"
#include "codec/reflection.h"

/* protoc-c's names for the oneof cases do not fit on a line. */
#define REQUEST_CASE(c) GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_##c
#define RESPONSE_CASE(c) GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_##c

extern unsigned char familyd_descriptors[];
extern unsigned int familyd_descriptors_len;

typedef Grpc__Reflection__V1__ServerReflectionRequest Request;
typedef Grpc__Reflection__V1__ServerReflectionResponse Response;

static void response_freep(Response **p) {
        if (*p)
                grpc__reflection__v1__server_reflection_response__free_unpacked(*p, NULL);
}

static int setup(void **state) {
        Reflection *rf = NULL;

        assert_int_equal(reflection_new(familyd_descriptors, familyd_descriptors_len, &rf), 0);
        *state = rf;
        return 0;
}

static int teardown(void **state) {
        reflection_free(*state);
        return 0;
}

static Response *answer(Reflection *rf, const Request *req) {
        _cleanup_free_ uint8_t *in = NULL, *out = NULL;
        size_t in_size, out_size = 0;
        Response *resp;

        in_size = grpc__reflection__v1__server_reflection_request__get_packed_size(req);
        in = malloc(in_size + 1);
        assert_non_null(in);
        assert_int_equal(grpc__reflection__v1__server_reflection_request__pack(req, in), in_size);

        assert_int_equal(reflection_answer(rf, in, in_size, &out, &out_size), 0);
        resp = grpc__reflection__v1__server_reflection_response__unpack(NULL, out_size, out);
        assert_non_null(resp);

        /* Every answer echoes the request and the host. */
        assert_non_null(resp->original_request);
        assert_int_equal(resp->original_request->message_request_case, req->message_request_case);
        assert_string_equal(resp->valid_host, req->host);
        return resp;
}

static Response *ask(Reflection *rf, Grpc__Reflection__V1__ServerReflectionRequest__MessageRequestCase c,
                     const char *arg) {
        Request req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;

        req.host = (char *) "localhost";
        req.message_request_case = c;
        req.file_by_filename = (char *) arg;    /* every string member of the oneof aliases it */
        return answer(rf, &req);
}

/* The names of the files in a file_descriptor_response, in order. */
static size_t file_names(const Response *resp, char names[][128], size_t max) {
        const Grpc__Reflection__V1__FileDescriptorResponse *f;

        assert_int_equal(resp->message_response_case,
                         RESPONSE_CASE(FILE_DESCRIPTOR_RESPONSE));
        f = resp->file_descriptor_response;
        assert_true(f->n_file_descriptor_proto <= max);
        for (size_t i = 0; i < f->n_file_descriptor_proto; i++) {
                Google__Protobuf__FileDescriptorProto *fd = google__protobuf__file_descriptor_proto__unpack(
                                NULL, f->file_descriptor_proto[i].len, f->file_descriptor_proto[i].data);
                assert_non_null(fd);
                assert_int_not_equal(fd->_name_case, 0);
                snprintf(names[i], 128, "%s", fd->name);
                google__protobuf__file_descriptor_proto__free_unpacked(fd, NULL);
                for (size_t j = 0; j < i; j++)
                        assert_string_not_equal(names[i], names[j]);    /* each file once */
        }
        return f->n_file_descriptor_proto;
}

static bool has_name(char names[][128], size_t n, const char *name) {
        for (size_t i = 0; i < n; i++)
                if (streq(names[i], name))
                        return true;
        return false;
}

static void check_symbol(Reflection *rf, const char *symbol, const char *file, const char *dep) {
        _cleanup_(response_freep) Response *resp = NULL;
        char names[64][128];
        size_t n;

        resp = ask(rf, REQUEST_CASE(FILE_CONTAINING_SYMBOL),
                   symbol);
        n = file_names(resp, names, ELEMENTSOF(names));
        assert_true(n >= 1);
        assert_string_equal(names[0], file);
        if (dep)
                assert_true(has_name(names, n, dep));
}

static void check_not_found(Response *resp, const char *needle) {
        assert_int_equal(resp->message_response_case,
                         RESPONSE_CASE(ERROR_RESPONSE));
        assert_int_equal(resp->error_response->error_code, 5);
        assert_non_null(strstr(resp->error_response->error_message, needle));
}

static void test_list_services(void **state) {
        static const char *const want[] = {
                "familyd.v1.FamilyService",
                "familyd.v1.MeshService",
                "familyd.v1.AdminService",
                "grpc.health.v1.Health",
                "grpc.reflection.v1.ServerReflection",
                "grpc.reflection.v1alpha.ServerReflection",
        };
        _cleanup_(response_freep) Response *resp = NULL;
        const Grpc__Reflection__V1__ListServiceResponse *list;

        resp = ask(*state, REQUEST_CASE(LIST_SERVICES), "*");
        assert_int_equal(resp->message_response_case,
                         RESPONSE_CASE(LIST_SERVICES_RESPONSE));
        list = resp->list_services_response;
        assert_int_equal(list->n_service, ELEMENTSOF(want));
        for (size_t i = 0; i < ELEMENTSOF(want); i++) {
                bool found = false;
                for (size_t j = 0; j < list->n_service; j++)
                        found = found || streq(list->service[j]->name, want[i]);
                assert_true(found);
        }
}

static void test_file_containing_symbol(void **state) {
        check_symbol(*state, "familyd.v1.FamilyService", "familyd/v1/family.proto", "familyd/v1/values.proto");
        check_symbol(*state, "familyd.v1.FamilyService.Resolve", "familyd/v1/family.proto",
                     "familyd/v1/values.proto");
        check_symbol(*state, "familyd.v1.ResolveRequest", "familyd/v1/family.proto", "familyd/v1/values.proto");
        check_symbol(*state, "familyd.v1.Value", "familyd/v1/values.proto", NULL);
        check_symbol(*state, "google.rpc.ErrorInfo", "google/rpc/status.proto", "google/protobuf/any.proto");
        check_symbol(*state, "google.rpc.Status", "google/rpc/status.proto", "google/protobuf/any.proto");
        /* A nested message (map entry) and an enum nested in a message. */
        check_symbol(*state, "google.rpc.ErrorInfo.MetadataEntry", "google/rpc/status.proto", NULL);
        check_symbol(*state, "grpc.health.v1.HealthCheckResponse.ServingStatus",
                     "grpc/health/v1/health.proto", NULL);
        check_symbol(*state, "grpc.health.v1.Health.Watch", "grpc/health/v1/health.proto", NULL);
        check_symbol(*state, "grpc.reflection.v1alpha.ServerReflection.ServerReflectionInfo",
                     "grpc/reflection/v1alpha/reflection.proto", NULL);
        check_symbol(*state, "google.protobuf.Any", "google/protobuf/any.proto", NULL);
}

static void test_file_by_filename(void **state) {
        _cleanup_(response_freep) Response *resp = NULL, *missing = NULL;
        char names[64][128];

        resp = ask(*state, REQUEST_CASE(FILE_BY_FILENAME),
                   "familyd/v1/family.proto");
        assert_true(file_names(resp, names, ELEMENTSOF(names)) >= 2);
        assert_string_equal(names[0], "familyd/v1/family.proto");

        missing = ask(*state, REQUEST_CASE(FILE_BY_FILENAME),
                      "nope/nothing.proto");
        check_not_found(missing, "nope/nothing.proto");
}

static void test_not_found(void **state) {
        _cleanup_(response_freep) Response *symbol = NULL, *empty = NULL, *partial = NULL, *huge = NULL;
        _cleanup_free_ char *long_name = NULL;

        symbol = ask(*state, REQUEST_CASE(FILE_CONTAINING_SYMBOL),
                     "familyd.v1.NoSuchThing");
        check_not_found(symbol, "familyd.v1.NoSuchThing");
        empty = ask(*state, REQUEST_CASE(FILE_CONTAINING_SYMBOL), "");
        check_not_found(empty, "Symbol");
        /* A package is not a symbol. */
        partial = ask(*state, REQUEST_CASE(FILE_CONTAINING_SYMBOL),
                      "familyd.v1");
        check_not_found(partial, "familyd.v1");

        /* A long name is quoted cut in the message, and echoed whole in original_request. */
        long_name = malloc(60001);
        assert_non_null(long_name);
        memset(long_name, 'x', 60000);
        long_name[60000] = 0;
        huge = ask(*state, REQUEST_CASE(FILE_CONTAINING_SYMBOL),
                   long_name);
        check_not_found(huge, "xxx...");
        assert_true(strlen(huge->error_response->error_message) < 1024);
        assert_string_equal(huge->original_request->file_containing_symbol, long_name);
}

static void test_extensions(void **state) {
        Request req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
        Grpc__Reflection__V1__ExtensionRequest x = GRPC__REFLECTION__V1__EXTENSION_REQUEST__INIT;
        _cleanup_(response_freep) Response *ext = NULL, *known = NULL, *unknown = NULL, *service = NULL;

        x.containing_type = (char *) "familyd.v1.ResolveRequest";
        x.extension_number = 100;
        req.message_request_case = REQUEST_CASE(FILE_CONTAINING_EXTENSION);
        req.file_containing_extension = &x;
        ext = answer(*state, &req);
        check_not_found(ext, "100 of familyd.v1.ResolveRequest");
        assert_string_equal(ext->original_request->file_containing_extension->containing_type,
                            "familyd.v1.ResolveRequest");

        known = ask(*state,
                    REQUEST_CASE(ALL_EXTENSION_NUMBERS_OF_TYPE),
                    "familyd.v1.ResolveRequest");
        assert_int_equal(known->message_response_case,
                         RESPONSE_CASE(ALL_EXTENSION_NUMBERS_RESPONSE));
        assert_string_equal(known->all_extension_numbers_response->base_type_name, "familyd.v1.ResolveRequest");
        assert_int_equal(known->all_extension_numbers_response->n_extension_number, 0);

        unknown = ask(*state,
                      REQUEST_CASE(ALL_EXTENSION_NUMBERS_OF_TYPE),
                      "familyd.v1.Nope");
        check_not_found(unknown, "familyd.v1.Nope");

        /* Only messages have extensions. */
        service = ask(*state,
                      REQUEST_CASE(ALL_EXTENSION_NUMBERS_OF_TYPE),
                      "familyd.v1.FamilyService");
        check_not_found(service, "familyd.v1.FamilyService");
}

static void test_empty_request(void **state) {
        _cleanup_free_ uint8_t *out = NULL;
        _cleanup_(response_freep) Response *resp = NULL;
        size_t out_size;

        assert_int_equal(reflection_answer(*state, NULL, 0, &out, &out_size), 0);
        resp = grpc__reflection__v1__server_reflection_response__unpack(NULL, out_size, out);
        assert_non_null(resp);
        assert_int_equal(resp->message_response_case,
                         RESPONSE_CASE(ERROR_RESPONSE));
        assert_int_equal(resp->error_response->error_code, 12);
}

/* v1alpha clients encode and decode with their own types; the bytes are the same. */
static void test_v1alpha(void **state) {
        Grpc__Reflection__V1alpha__ServerReflectionRequest req =
                GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__INIT;
        Grpc__Reflection__V1alpha__ServerReflectionResponse *resp;
        _cleanup_free_ uint8_t *in = NULL, *out = NULL;
        size_t in_size, out_size;

        req.host = (char *) "h";
        req.message_request_case = GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
        req.file_containing_symbol = (char *) "grpc.reflection.v1alpha.ServerReflection";
        in_size = grpc__reflection__v1alpha__server_reflection_request__get_packed_size(&req);
        in = malloc(in_size);
        assert_non_null(in);
        grpc__reflection__v1alpha__server_reflection_request__pack(&req, in);

        assert_int_equal(reflection_answer(*state, in, in_size, &out, &out_size), 0);
        resp = grpc__reflection__v1alpha__server_reflection_response__unpack(NULL, out_size, out);
        assert_non_null(resp);
        assert_string_equal(resp->valid_host, "h");
        assert_int_equal(resp->message_response_case,
                         GRPC__REFLECTION__V1ALPHA__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE);
        assert_int_equal(resp->file_descriptor_response->n_file_descriptor_proto, 1);
        grpc__reflection__v1alpha__server_reflection_response__free_unpacked(resp, NULL);
}

static void test_garbage(void **state) {
        /* A truncated length-delimited field, then an invalid wire type. */
        static const uint8_t truncated[] = { 0x22, 0x10, 'f', 'a' };
        static const uint8_t bad_wire[] = { 0x0f, 0x01 };
        Request req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
        _cleanup_free_ char *name = NULL;
        _cleanup_free_ uint8_t *big = NULL;
        size_t big_size;
        uint8_t *out = NULL;
        size_t out_size = 0;

        assert_int_equal(reflection_answer(*state, truncated, sizeof(truncated), &out, &out_size), -EBADMSG);
        assert_int_equal(reflection_answer(*state, bad_wire, sizeof(bad_wire), &out, &out_size), -EBADMSG);

        /* Well-formed, but past the cap. */
        name = malloc(REFLECTION_MAX_REQUEST_BYTES + 1);
        assert_non_null(name);
        memset(name, 'x', REFLECTION_MAX_REQUEST_BYTES);
        name[REFLECTION_MAX_REQUEST_BYTES] = 0;
        req.message_request_case = REQUEST_CASE(FILE_CONTAINING_SYMBOL);
        req.file_containing_symbol = name;
        big_size = grpc__reflection__v1__server_reflection_request__get_packed_size(&req);
        big = malloc(big_size);
        assert_non_null(big);
        grpc__reflection__v1__server_reflection_request__pack(&req, big);
        assert_int_equal(reflection_answer(*state, big, big_size, &out, &out_size), -EBADMSG);
        assert_null(out);
}

static void fuzz_one(Reflection *rf, const uint8_t *data, size_t size) {
        _cleanup_free_ uint8_t *out = NULL;
        size_t out_size = 0;
        int r;

        r = reflection_answer(rf, data, size, &out, &out_size);
        assert_true(r == 0 || r == -EBADMSG);
        if (r == 0) {
                Response *resp = grpc__reflection__v1__server_reflection_response__unpack(NULL, out_size, out);
                assert_non_null(resp);
                assert_int_not_equal(resp->message_response_case,
                                     RESPONSE_CASE(_NOT_SET));
                grpc__reflection__v1__server_reflection_response__free_unpacked(resp, NULL);
        }
}

/* Random bytes, and every truncation and many bit flips of valid requests: never a crash (ASan
 * and UBSan watch), always 0 or -EBADMSG, and every answer decodes. */
static void test_fuzz(void **state) {
        static const char *const symbols[] = {
                "familyd.v1.FamilyService", "google.rpc.ErrorInfo", "nope", "",
        };
        uint8_t buf[512];
        unsigned seed = 12345;

        for (size_t i = 0; i < 20000; i++) {
                size_t n = rand_r(&seed) % sizeof(buf);
                for (size_t j = 0; j < n; j++)
                        buf[j] = (uint8_t) rand_r(&seed);
                fuzz_one(*state, buf, n);
        }

        for (int c = 3; c <= 7; c++)
                for (size_t s = 0; s < ELEMENTSOF(symbols); s++) {
                        Request req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
                        Grpc__Reflection__V1__ExtensionRequest x = GRPC__REFLECTION__V1__EXTENSION_REQUEST__INIT;
                        size_t n;

                        req.host = (char *) "host";
                        req.message_request_case = c;
                        if (c == 5) {
                                x.containing_type = (char *) symbols[s];
                                x.extension_number = 7;
                                req.file_containing_extension = &x;
                        } else
                                req.file_containing_symbol = (char *) symbols[s];
                        n = grpc__reflection__v1__server_reflection_request__get_packed_size(&req);
                        assert_true(n <= sizeof(buf));
                        grpc__reflection__v1__server_reflection_request__pack(&req, buf);

                        for (size_t len = 0; len <= n; len++)
                                fuzz_one(*state, buf, len);
                        for (size_t k = 0; k < 2000; k++) {
                                uint8_t flipped[512];
                                memcpy(flipped, buf, n);
                                flipped[rand_r(&seed) % n] ^= (uint8_t) (1u << (rand_r(&seed) % 8));
                                fuzz_one(*state, flipped, n);
                        }
                }
}

static uint8_t *pack_set(Google__Protobuf__FileDescriptorProto **files, size_t n, size_t *ret_size) {
        Google__Protobuf__FileDescriptorSet set = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_SET__INIT;
        uint8_t *buf;

        set.n_file = n;
        set.file = files;
        *ret_size = google__protobuf__file_descriptor_set__get_packed_size(&set);
        buf = malloc(*ret_size + 1);
        assert_non_null(buf);
        google__protobuf__file_descriptor_set__pack(&set, buf);
        return buf;
}

/* A broken set fails at start, with no leak (LSan watches). */
static void test_bad_sets(void **state) {
        Google__Protobuf__FileDescriptorProto a = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO__INIT;
        Google__Protobuf__FileDescriptorProto b = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO__INIT;
        Google__Protobuf__FileDescriptorProto *files[2] = { &a, &b };
        char *deps[1] = { (char *) "missing.proto" };
        static const uint8_t garbage[] = { 0x0a, 0x7f, 0x01 };
        _cleanup_free_ uint8_t *missing = NULL, *duplicate = NULL;
        Reflection *rf = NULL;
        size_t size;

        assert_int_equal(reflection_new(garbage, sizeof(garbage), &rf), -EBADMSG);

        a._name_case = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO___NAME_NAME;
        a.name = (char *) "a.proto";
        a.n_dependency = 1;
        a.dependency = deps;
        missing = pack_set(files, 1, &size);
        assert_int_equal(reflection_new(missing, size, &rf), -EINVAL);

        a.n_dependency = 0;
        b._name_case = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO___NAME_NAME;
        b.name = (char *) "a.proto";
        duplicate = pack_set(files, 2, &size);
        assert_int_equal(reflection_new(duplicate, size, &rf), -EINVAL);
        assert_null(rf);

        /* An empty set is valid: nothing to list. */
        assert_int_equal(reflection_new(NULL, 0, &rf), 0);
        {
                _cleanup_(response_freep) Response *resp = NULL;

                resp = ask(rf, REQUEST_CASE(LIST_SERVICES), "");
                assert_int_equal(resp->list_services_response->n_service, 0);
        }
        rf = reflection_free(rf);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_list_services, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_containing_symbol, setup, teardown),
                cmocka_unit_test_setup_teardown(test_file_by_filename, setup, teardown),
                cmocka_unit_test_setup_teardown(test_not_found, setup, teardown),
                cmocka_unit_test_setup_teardown(test_extensions, setup, teardown),
                cmocka_unit_test_setup_teardown(test_empty_request, setup, teardown),
                cmocka_unit_test_setup_teardown(test_v1alpha, setup, teardown),
                cmocka_unit_test_setup_teardown(test_garbage, setup, teardown),
                cmocka_unit_test_setup_teardown(test_fuzz, setup, teardown),
                cmocka_unit_test(test_bad_sets),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

/* test-json.c: familyd_json_encode against proto3 JSON written out by hand. */

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyd.h"
#include "google-protobuf-any.pb-c.h"

static void expect_flags(const ProtobufCMessage *m, unsigned flags, const char *want) {
        char *got = NULL;
        int r = familyd_json_encode(m, flags, &got);

        if (r < 0 || strcmp(got, want) != 0) {
                fprintf(stderr, "r=%d\n got: %s\nwant: %s\n", r, got ? got : "(null)", want);
                exit(EXIT_FAILURE);
        }
        free(got);
}

static void expect(const ProtobufCMessage *m, const char *want) {
        expect_flags(m, 0, want);
}

static void test_defaults_and_presence(void) {
        Familyd__V1__JobContext jc = FAMILYD__V1__JOB_CONTEXT__INIT;

        /* Nothing set: an empty object. */
        expect(&jc.base, "{}");

        /* proto3 optional at 0 is present and written; plain bools at false are not. */
        jc._tp_size_case = FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
        jc.tp_size = 0;
        jc._pp_size_case = FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
        jc.pp_size = -9007199254740993LL;
        jc.sequence_parallel = true;
        jc.mesh_id = (char *) "m\"1\\\n\x01";
        expect(&jc.base, "{\"tpSize\":\"0\",\"ppSize\":\"-9007199254740993\",\"meshId\":\"m\\\"1\\\\\\n\\u0001\","
                         "\"sequenceParallel\":true}");
}

static void test_maps_oneofs_lists(void) {
        Familyd__V1__ResolvedFamily rf = FAMILYD__V1__RESOLVED_FAMILY__INIT;
        Familyd__V1__ResolvedFamily__ArgumentsEntry a0 = FAMILYD__V1__RESOLVED_FAMILY__ARGUMENTS_ENTRY__INIT, *args[3];
        Familyd__V1__ResolvedFamily__ArgumentsEntry a1 = FAMILYD__V1__RESOLVED_FAMILY__ARGUMENTS_ENTRY__INIT;
        Familyd__V1__ResolvedFamily__ArgumentsEntry a2 = FAMILYD__V1__RESOLVED_FAMILY__ARGUMENTS_ENTRY__INIT;
        Familyd__V1__ResolvedFamily__AxisSizesEntry s0 = FAMILYD__V1__RESOLVED_FAMILY__AXIS_SIZES_ENTRY__INIT, *sizes[1];
        Familyd__V1__Value v0 = FAMILYD__V1__VALUE__INIT, v1 = FAMILYD__V1__VALUE__INIT, v2 = FAMILYD__V1__VALUE__INIT;
        Familyd__V1__Value l0 = FAMILYD__V1__VALUE__INIT, l1 = FAMILYD__V1__VALUE__INIT, *items[2];
        Familyd__V1__ValueList list = FAMILYD__V1__VALUE_LIST__INIT;

        /* A oneof member at its default is still written: presence is the case, not the value. */
        v0.kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
        v0.bool_value = false;
        a0.key = (char *) "flag";
        a0.value = &v0;

        v1.kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
        v1.double_value = NAN;
        a1.key = (char *) "x";
        a1.value = &v1;

        l0.kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
        l0.double_value = 0.1;
        l1.kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
        l1.int_value = 0;
        items[0] = &l0;
        items[1] = &l1;
        list.values = items;
        list.n_values = 2;
        v2.kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
        v2.list_value = &list;
        a2.key = (char *) "l";
        a2.value = &v2;

        args[0] = &a0;
        args[1] = &a1;
        args[2] = &a2;
        rf.arguments = args;
        rf.n_arguments = 3;

        /* Map values at their default are written too. */
        s0.key = (char *) "tp";
        s0.value = 0;
        sizes[0] = &s0;
        rf.axis_sizes = sizes;
        rf.n_axis_sizes = 1;

        rf.family = (char *) "f";
        expect(&rf.base, "{\"family\":\"f\",\"arguments\":{\"flag\":{\"boolValue\":false},\"x\":{\"doubleValue\":\"NaN\"},"
                         "\"l\":{\"listValue\":{\"values\":[{\"doubleValue\":0.1},{\"intValue\":\"0\"}]}}},"
                         "\"axisSizes\":{\"tp\":\"0\"}}");
}

static void test_bytes_and_pretty(void) {
        Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
        Familyd__V1__GetStatusResponse st = FAMILYD__V1__GET_STATUS_RESPONSE__INIT;

        any.type_url = (char *) "t";
        any.value.data = (uint8_t *) "hello";
        any.value.len = 5;
        expect(&any.base, "{\"typeUrl\":\"t\",\"value\":\"aGVsbG8=\"}");
        any.value.len = 4;
        expect(&any.base, "{\"typeUrl\":\"t\",\"value\":\"aGVsbA==\"}");

        st.uptime_ms = UINT64_MAX;
        st.families = 4000000000u;
        expect_flags(&st.base, FAMILYD_JSON_PRETTY,
                     "{\n  \"uptimeMs\": \"18446744073709551615\",\n  \"families\": 4000000000\n}");
}

int main(void) {
        test_defaults_and_presence();
        test_maps_oneofs_lists();
        test_bytes_and_pretty();
        return EXIT_SUCCESS;
}

/* test-wire.c: the pre-scan that bounds the message tree of a request before protobuf-c sees it. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "familyd-v1-family.pb-c.h"
#include "familyd-v1-values.pb-c.h"
#include "common/macro.h"
#include "codec/codec-wire.h"

typedef Familyd__V1__Value Value;
typedef Familyd__V1__ValueList ValueList;
typedef Familyd__V1__ResolveRequest Request;
typedef Familyd__V1__ResolveRequest__ArgumentsEntry Entry;

#define REQUEST (&familyd__v1__resolve_request__descriptor)

static int check(const uint8_t *data, size_t size) {
        return codec_wire_check(REQUEST, data, size, CODEC_WIRE_MAX_DEPTH, CODEC_WIRE_MAX_MESSAGES);
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *ret_size) {
        size_t size = protobuf_c_message_get_packed_size(m);
        uint8_t *out = malloc(size + 1);

        assert_non_null(out);
        assert_int_equal(protobuf_c_message_pack(m, out), size);
        *ret_size = size;
        return out;
}

/* True when protobuf-c itself refuses the bytes as a ResolveRequest. */
static bool unpack_fails(const uint8_t *data, size_t size) {
        ProtobufCMessage *m = protobuf_c_message_unpack(REQUEST, NULL, size, data);

        if (!m)
                return true;
        protobuf_c_message_free_unpacked(m, NULL);
        return false;
}

/* The depth and number of submessages of an unpacked tree, from the descriptors alone. */
static void tree_measure(const ProtobufCMessage *m, size_t depth, size_t *max_depth, size_t *count) {
        const ProtobufCMessageDescriptor *desc = m->descriptor;

        if (depth > *max_depth)
                *max_depth = depth;

        for (unsigned i = 0; i < desc->n_fields; i++) {
                const ProtobufCFieldDescriptor *f = desc->fields + i;
                const char *base = (const char *) m;

                if (f->type != PROTOBUF_C_TYPE_MESSAGE)
                        continue;
                if (f->label == PROTOBUF_C_LABEL_REPEATED) {
                        size_t n = *(const size_t *) (base + f->quantifier_offset);
                        ProtobufCMessage *const *a = *(ProtobufCMessage *const *const *) (base + f->offset);

                        for (size_t j = 0; j < n; j++) {
                                (*count)++;
                                tree_measure(a[j], depth + 1, max_depth, count);
                        }
                        continue;
                }
                if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                    *(const uint32_t *) (base + f->quantifier_offset) != f->id)
                        continue;
                const ProtobufCMessage *sub = *(const ProtobufCMessage *const *) (base + f->offset);
                if (sub && sub != f->default_value) {
                        (*count)++;
                        tree_measure(sub, depth + 1, max_depth, count);
                }
        }
}

/*
 * A ResolveRequest whose deepest submessage lies at depth (>= 2): the arguments entry at 1, its
 * Value at 2, then ValueList and Value alternating; the innermost is a Value{bool_value} at an
 * even depth and an empty ValueList at an odd one. It holds exactly depth submessages.
 */
static uint8_t *request_nested(size_t depth, size_t *ret_size) {
        _cleanup_free_ Value *values = calloc(depth + 1, sizeof(Value));
        _cleanup_free_ ValueList *lists = calloc(depth + 1, sizeof(ValueList));
        _cleanup_free_ Value **slots = calloc(depth + 1, sizeof(Value *));
        Entry entry = FAMILYD__V1__RESOLVE_REQUEST__ARGUMENTS_ENTRY__INIT;
        Entry *entries[1] = { &entry };
        Request req = FAMILYD__V1__RESOLVE_REQUEST__INIT;

        assert_true(depth >= 2);
        assert_non_null(values);
        assert_non_null(lists);
        assert_non_null(slots);

        for (size_t k = depth; k >= 2; k--) {
                if (k % 2 == 0) {
                        values[k] = (Value) FAMILYD__V1__VALUE__INIT;
                        if (k == depth) {
                                values[k].kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
                                values[k].bool_value = true;
                        } else {
                                values[k].kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
                                values[k].list_value = &lists[k + 1];
                        }
                } else {
                        lists[k] = (ValueList) FAMILYD__V1__VALUE_LIST__INIT;
                        if (k < depth) {
                                slots[k] = &values[k + 1];
                                lists[k].n_values = 1;
                                lists[k].values = &slots[k];
                        }
                }
        }

        entry.key = (char *) "activation";
        entry.value = &values[2];
        req.family = (char *) "grouped_experts";
        req.n_arguments = 1;
        req.arguments = entries;
        return pack(&req.base, ret_size);
}

/* A ResolveRequest with one argument: a list of n empty Values (n + 3 submessages). */
static uint8_t *request_wide(size_t n, size_t *ret_size) {
        _cleanup_free_ Value *values = calloc(n, sizeof(Value));
        _cleanup_free_ Value **slots = calloc(n, sizeof(Value *));
        ValueList list = FAMILYD__V1__VALUE_LIST__INIT;
        Value top = FAMILYD__V1__VALUE__INIT;
        Entry entry = FAMILYD__V1__RESOLVE_REQUEST__ARGUMENTS_ENTRY__INIT;
        Entry *entries[1] = { &entry };
        Request req = FAMILYD__V1__RESOLVE_REQUEST__INIT;

        assert_non_null(values);
        assert_non_null(slots);
        for (size_t i = 0; i < n; i++) {
                values[i] = (Value) FAMILYD__V1__VALUE__INIT;
                slots[i] = &values[i];
        }
        list.n_values = n;
        list.values = slots;
        top.kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
        top.list_value = &list;
        entry.key = (char *) "xs";
        entry.value = &top;
        req.family = (char *) "f";
        req.n_arguments = 1;
        req.arguments = entries;
        return pack(&req.base, ret_size);
}

/* Writes varint v just before *p, moving *p back. */
static void prepend_varint(uint8_t **p, uint64_t v) {
        uint8_t tmp[10];
        size_t n = 0;

        do {
                tmp[n] = (uint8_t) (v & 0x7f);
                v >>= 7;
                if (v)
                        tmp[n] |= 0x80;
                n++;
        } while (v);
        *p -= n;
        memcpy(*p, tmp, n);
}

/* Prepends a length-delimited field (tag byte, length) around the bytes [*p, end). */
static void prepend_field(uint8_t **p, const uint8_t *end, uint8_t tag) {
        prepend_varint(p, (uint64_t) (end - *p));
        *--*p = tag;
}

/*
 * A hostile, deeply nested request, built from the inside out without recursion:
 * Value{bool_value} wrapped levels times in Value{list_value: ValueList{values: [...]}}, as
 * argument "activation". Its innermost Value lies at depth 2 + 2 * levels. Returns a pointer
 * into *ret_buf (to free).
 */
static const uint8_t *request_deep(size_t levels, uint8_t **ret_buf, size_t *ret_size) {
        size_t cap = levels * 2 * 11 + 64;
        uint8_t *buf = malloc(cap), *end = buf + cap, *p = end;

        assert_non_null(buf);
        *--p = 0x01;
        *--p = 0x08;                                            /* Value.bool_value = true */
        for (size_t i = 0; i < levels; i++) {
                prepend_field(&p, end, 0x0a);                   /* ValueList.values */
                prepend_field(&p, end, 0x2a);                   /* Value.list_value */
        }
        prepend_field(&p, end, 0x12);                           /* Entry.value */
        p -= 12;
        memcpy(p, "\x0a\x0a" "activation", 12);                 /* Entry.key */
        prepend_field(&p, end, 0x12);                           /* ResolveRequest.arguments */
        *ret_buf = buf;
        *ret_size = (size_t) (end - p);
        return p;
}

static void test_depth_boundary(void **state) {
        static const size_t depths[] = { 2, 3, 5, 31, 32 };

        for (size_t i = 0; i < ELEMENTSOF(depths); i++) {
                _cleanup_free_ uint8_t *b = NULL;
                size_t n;

                b = request_nested(depths[i], &n);
                assert_int_equal(check(b, n), 0);
                /* Exactly that deep: one level less is too much. */
                assert_int_equal(codec_wire_check(REQUEST, b, n, depths[i], SIZE_MAX), 0);
                assert_int_equal(codec_wire_check(REQUEST, b, n, depths[i] - 1, SIZE_MAX), -ELOOP);
                /* And it holds exactly depth submessages. */
                assert_int_equal(codec_wire_check(REQUEST, b, n, UINT32_MAX, depths[i]), 0);
                assert_int_equal(codec_wire_check(REQUEST, b, n, UINT32_MAX, depths[i] - 1), -E2BIG);
                assert_false(unpack_fails(b, n));
        }

        _cleanup_free_ uint8_t *b33 = NULL;
        size_t n33;
        b33 = request_nested(33, &n33);
        assert_int_equal(check(b33, n33), -ELOOP);
        assert_false(unpack_fails(b33, n33));   /* protobuf-c takes it: the limit is ours */
}

static void test_value_levels(void **state) {
        /* A Value wrapped in n list levels: 15 fit in 32 (depth 32), 16 do not (depth 34). */
        for (size_t levels = 0; levels <= 17; levels++) {
                _cleanup_free_ uint8_t *buf = NULL;
                const uint8_t *p;
                size_t n;

                p = request_deep(levels, &buf, &n);
                assert_false(unpack_fails(p, n));
                assert_int_equal(check(p, n), 2 + 2 * levels <= CODEC_WIRE_MAX_DEPTH ? 0 : -ELOOP);
        }
}

static void test_deep_100000(void **state) {
        _cleanup_free_ uint8_t *buf = NULL;
        struct timespec t0, t1;
        const uint8_t *p;
        size_t n;

        p = request_deep(140000, &buf, &n);
        assert_true(n > 140000 * 4);

        assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &t0), 0);
        assert_int_equal(check(p, n), -ELOOP);
        assert_int_equal(clock_gettime(CLOCK_MONOTONIC, &t1), 0);
        /* It stops at depth 33, long before the end. */
        assert_true((t1.tv_sec - t0.tv_sec) * 1000000000L + (t1.tv_nsec - t0.tv_nsec) < 100000000L);

        /* Without a depth limit, the field cap stops this one (280,000 fields and more). */
        assert_int_equal(codec_wire_check(REQUEST, p, n, UINT32_MAX, SIZE_MAX), -E2BIG);

        /* Half as deep stays under the field cap: the whole tree is walked, iteratively, with
         * no stack overflow, and the count of messages is exact (2 per level, plus 2). */
        free(buf);
        buf = NULL;
        p = request_deep(50000, &buf, &n);
        assert_int_equal(codec_wire_check(REQUEST, p, n, UINT32_MAX, SIZE_MAX), 0);
        assert_int_equal(codec_wire_check(REQUEST, p, n, UINT32_MAX, 100001), -E2BIG);
        assert_int_equal(codec_wire_check(REQUEST, p, n, UINT32_MAX, 100002), 0);
}

static void test_messages_boundary(void **state) {
        _cleanup_free_ uint8_t *ok = NULL, *over = NULL, *big = NULL;
        size_t n;

        /* entry + Value + ValueList + n Values */
        ok = request_wide(CODEC_WIRE_MAX_MESSAGES - 3, &n);
        assert_int_equal(check(ok, n), 0);

        over = request_wide(CODEC_WIRE_MAX_MESSAGES - 2, &n);
        assert_int_equal(check(over, n), -E2BIG);

        big = request_wide(CODEC_WIRE_MAX_MESSAGES + 5000, &n);
        assert_int_equal(check(big, n), -E2BIG);
        assert_false(unpack_fails(big, n));
}

static void test_map_entries_and_context(void **state) {
        Value shallow = FAMILYD__V1__VALUE__INIT, deep[40];
        ValueList lists[40];
        Value *slots[40];
        Entry e1 = FAMILYD__V1__RESOLVE_REQUEST__ARGUMENTS_ENTRY__INIT;
        Entry e2 = FAMILYD__V1__RESOLVE_REQUEST__ARGUMENTS_ENTRY__INIT;
        Entry *entries[2] = { &e1, &e2 };
        Familyd__V1__JobContext ctx = FAMILYD__V1__JOB_CONTEXT__INIT;
        Request req = FAMILYD__V1__RESOLVE_REQUEST__INIT;
        _cleanup_free_ uint8_t *b = NULL;
        size_t n, levels;

        shallow.kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
        shallow.int_value = 7;
        ctx.mesh_id = (char *) "m0";
        ctx.tp = true;
        e1.key = (char *) "a";
        e1.value = &shallow;
        e2.key = (char *) "b";
        req.family = (char *) "f";
        req.n_arguments = 2;
        req.arguments = entries;
        req.context = &ctx;

        /* The second entry's innermost Value at depth 2 + 2 * levels; context is depth 1. */
        for (levels = 0; levels < 20; levels++) {
                for (size_t i = 0; i <= levels; i++) {
                        deep[i] = (Value) FAMILYD__V1__VALUE__INIT;
                        if (i == levels) {
                                deep[i].kind_case = FAMILYD__V1__VALUE__KIND_STRING_VALUE;
                                deep[i].string_value = (char *) "x";
                                break;
                        }
                        lists[i] = (ValueList) FAMILYD__V1__VALUE_LIST__INIT;
                        slots[i] = &deep[i + 1];
                        lists[i].n_values = 1;
                        lists[i].values = &slots[i];
                        deep[i].kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
                        deep[i].list_value = &lists[i];
                }
                e2.value = &deep[0];

                b = mfree(b);
                b = pack(&req.base, &n);
                assert_false(unpack_fails(b, n));
                assert_int_equal(check(b, n), 2 + 2 * levels <= CODEC_WIRE_MAX_DEPTH ? 0 : -ELOOP);
                /* e1, its Value, context, e2 and 2 * levels + 1 below it. */
                assert_int_equal(codec_wire_check(REQUEST, b, n, UINT32_MAX, 2 * levels + 5), 0);
                assert_int_equal(codec_wire_check(REQUEST, b, n, UINT32_MAX, 2 * levels + 4), -E2BIG);
        }
}

static void test_unknown_and_scalar_fields(void **state) {
        _cleanup_free_ uint8_t *deep_buf = NULL, *b = NULL;
        const uint8_t *deep;
        size_t deep_n, n;

        deep = request_deep(100, &deep_buf, &deep_n);
        assert_int_equal(check(deep, deep_n), -ELOOP);

        /* The same bytes as a string (family = 1), as unknown field 99, as unknown 536870911
         * (the largest number, a 5-byte tag): never descended into. */
        static const uint8_t tags[][5] = {
                { 0x0a },                                       /* 1, length-delimited */
                { 0x9a, 0x06 },                                 /* 99 */
                { 0xfa, 0xff, 0xff, 0xff, 0x0f },               /* 2^29 - 1 */
        };
        static const size_t tag_sizes[] = { 1, 2, 5 };
        for (size_t t = 0; t < ELEMENTSOF(tags); t++) {
                uint8_t *p;

                b = mfree(b);
                b = malloc(deep_n + 16);
                assert_non_null(b);
                memcpy(b, tags[t], tag_sizes[t]);
                p = b + tag_sizes[t];
                n = deep_n;
                do {
                        *p = (uint8_t) (n & 0x7f);
                        n >>= 7;
                        if (n)
                                *p |= 0x80;
                        p++;
                } while (n);
                memcpy(p, deep, deep_n);
                n = (size_t) (p - b) + deep_n;
                assert_false(unpack_fails(b, n));
                assert_int_equal(check(b, n), 0);
        }

        /* Unknown varint, 64-bit and 32-bit fields before the deep argument are skipped over. */
        static const uint8_t prefix[] = {
                0xa0, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, /* 100: varint */
                0xa9, 0x06, 1, 2, 3, 4, 5, 6, 7, 8,                             /* 101: 64-bit */
                0xb5, 0x06, 1, 2, 3, 4,                                         /* 102: 32-bit */
                0x80, 0x00, 0x05,                                               /* 0, non-minimal */
        };
        b = mfree(b);
        b = malloc(sizeof(prefix) + deep_n);
        assert_non_null(b);
        memcpy(b, prefix, sizeof(prefix));
        memcpy(b + sizeof(prefix), deep, deep_n);
        n = sizeof(prefix) + deep_n;
        /* protobuf-c keeps field 0 as an unknown field when it is not minimally encoded: a scan
         * that gave up on it would let the deep argument through. */
        assert_false(unpack_fails(b, sizeof(prefix)));
        assert_int_equal(check(b, n), -ELOOP);

        /* A message field sent with a scalar wire type: skipped here, refused by protobuf-c. */
        static const uint8_t wrong_wire[] = { 0x10, 0x05, 0x1d, 1, 2, 3, 4 };
        assert_int_equal(check(wrong_wire, sizeof(wrong_wire)), 0);
        assert_true(unpack_fails(wrong_wire, sizeof(wrong_wire)));
}

/* protobuf-c spends ~70 bytes per field it reads: fields of any kind are bounded too. */
static void test_fields_bound(void **state) {
        size_t n = FAMILYD_MAX_REQUEST_FIELDS;
        _cleanup_free_ uint8_t *buf = malloc(2 * (n + 1));
        assert_non_null(buf);
        for (size_t i = 0; i < n + 1; i++) {
                buf[2 * i] = 0x78; /* field 15, varint: unknown to ResolveRequest */
                buf[2 * i + 1] = 0x00;
        }
        const ProtobufCMessageDescriptor *d = &familyd__v1__resolve_request__descriptor;
        assert_int_equal(codec_wire_check(d, buf, 2 * n, CODEC_WIRE_MAX_DEPTH,
                                          CODEC_WIRE_MAX_MESSAGES), 0);
        assert_int_equal(codec_wire_check(d, buf, 2 * (n + 1), CODEC_WIRE_MAX_DEPTH,
                                          CODEC_WIRE_MAX_MESSAGES), -E2BIG);
}

static void test_malformed(void **state) {
        const struct {
                const char *name;
                const uint8_t *bytes;
                size_t size;
        } cases[] = {
#define C(n, ...) { n, (const uint8_t[]) { __VA_ARGS__ }, sizeof((const uint8_t[]) { __VA_ARGS__ }) }
                C("truncated tag", 0x80),
                C("6-byte tag", 0x82, 0x80, 0x80, 0x80, 0x80, 0x00),
                C("truncated varint", 0x08, 0xff, 0xff),
                C("11-byte varint", 0x20, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01),
                C("short 64-bit", 0x09, 1, 2, 3),
                C("short 32-bit", 0x0d, 1, 2),
                C("length past the end", 0x12, 0x05, 0x0a, 0x01),
                C("length 2^64 - 1", 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00),
                C("length 2^63", 0x12, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 0x00),
                C("truncated length", 0x12, 0x80),
                C("group start", 0x13, 0x14),
                C("group end", 0x14),
                C("wire type 6", 0x16, 0x00),
                C("wire type 7", 0x17, 0x00),
                C("field 0", 0x00, 0x00),
                /* Inner length runs past its entry but not past the buffer. */
                C("inner past outer", 0x12, 0x02, 0x12, 0x05, 0x08, 0x01, 0x08, 0x01, 0x08),
                /* Malformed inside a submessage, then a well-formed nested argument. */
                C("bad inner then ok", 0x12, 0x02, 0x0b, 0x00, 0x12, 0x04, 0x12, 0x02, 0x08, 0x01),
#undef C
        };

        for (size_t i = 0; i < ELEMENTSOF(cases); i++) {
                int r = check(cases[i].bytes, cases[i].size);

                if (r != 0)
                        print_message("%s: %d\n", cases[i].name, r);
                assert_int_equal(r, 0);
                /* The claim that 0 is safe: protobuf-c refuses each of them. */
                assert_true(unpack_fails(cases[i].bytes, cases[i].size));
        }

        /* Empty input: an empty request. */
        assert_int_equal(check(NULL, 0), 0);
        assert_int_equal(check((const uint8_t *) "", 0), 0);
}

static void test_every_prefix(void **state) {
        _cleanup_free_ uint8_t *ok = NULL, *deep_buf = NULL;
        const uint8_t *deep;
        size_t n, deep_n;

        /* Cut short anywhere: 0 (protobuf-c refuses it) or the limit met before the cut. */
        ok = request_nested(32, &n);
        for (size_t k = 0; k <= n; k++) {
                _cleanup_free_ uint8_t *copy = malloc(k + 1);   /* exact size: ASan sees overreads */

                assert_non_null(copy);
                memcpy(copy, ok, k);
                assert_int_equal(check(k ? copy : NULL, k), 0);
        }

        deep = request_deep(40, &deep_buf, &deep_n);
        for (size_t k = 0; k <= deep_n; k++) {
                _cleanup_free_ uint8_t *copy = malloc(k ? k : 1);
                int r;

                assert_non_null(copy);
                memcpy(copy, deep, k);
                r = check(copy, k);
                assert_true(r == 0 || r == -ELOOP);
                /* The outermost length already runs past any cut: 0, and protobuf-c refuses it. */
                assert_int_equal(r, k < deep_n ? 0 : -ELOOP);
                if (r == 0 && k > 0)
                        assert_true(unpack_fails(copy, k));
        }
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;

static uint64_t rng(void) {
        /* xorshift64*: fixed seed, same run every time. */
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dULL;
}

/*
 * Random bytes and mutated real requests, under small limits so that they matter: the scan
 * never reads out of bounds, answers 0 or a limit, and whenever it answers 0 and protobuf-c
 * decodes the bytes, the tree protobuf-c built is within the limits.
 */
static void test_fuzz(void **state) {
        enum { ITERATIONS = 100000, MAX_DEPTH = 6, MAX_MESSAGES = 20 };
        _cleanup_free_ uint8_t *seed1 = NULL, *seed2_buf = NULL, *seed3 = NULL, *seed4 = NULL,
                *seed5 = NULL;
        const uint8_t *seeds[5];
        size_t seed_sizes[5];
        size_t accepted = 0, decoded = 0, limited = 0;

        seed1 = request_nested(9, &seed_sizes[0]);
        seeds[0] = seed1;
        seeds[1] = request_deep(5, &seed2_buf, &seed_sizes[1]);
        seed3 = request_wide(25, &seed_sizes[2]);
        seeds[2] = seed3;
        seed4 = request_nested(MAX_DEPTH, &seed_sizes[3]);      /* just within the limits */
        seeds[3] = seed4;
        seed5 = request_wide(MAX_MESSAGES - 3, &seed_sizes[4]);
        seeds[4] = seed5;

        for (unsigned it = 0; it < ITERATIONS; it++) {
                _cleanup_free_ uint8_t *buf = NULL;
                size_t n;
                int r;

                if (it % 2 == 0) {
                        n = rng() % 64;
                        buf = malloc(n ? n : 1);
                        assert_non_null(buf);
                        for (size_t i = 0; i < n; i++)
                                buf[i] = (uint8_t) rng();
                        /* Bias towards tags of fields that exist. */
                        for (size_t i = 0; i < n; i += 1 + rng() % 4)
                                if (rng() % 2)
                                        buf[i] = (uint8_t[]) { 0x0a, 0x12, 0x1a, 0x2a, 0x08 }[rng() % 5];
                } else {
                        size_t s = rng() % ELEMENTSOF(seeds);

                        n = seed_sizes[s];
                        if (rng() % 4 == 0)
                                n -= rng() % (n / 4 + 1);
                        buf = malloc(n ? n : 1);
                        assert_non_null(buf);
                        memcpy(buf, seeds[s], n);
                        for (unsigned k = 1 + rng() % 3; k > 0 && n > 0; k--)
                                buf[rng() % n] = (uint8_t) rng();
                }

                r = codec_wire_check(REQUEST, buf, n, MAX_DEPTH, MAX_MESSAGES);
                assert_true(r == 0 || r == -ELOOP || r == -E2BIG);
                if (r < 0) {
                        limited++;
                        continue;
                }
                accepted++;

                ProtobufCMessage *m = protobuf_c_message_unpack(REQUEST, NULL, n, buf);
                if (m) {
                        size_t depth = 0, count = 0;

                        decoded++;
                        tree_measure(m, 0, &depth, &count);
                        assert_true(depth <= MAX_DEPTH);
                        assert_true(count <= MAX_MESSAGES);
                        protobuf_c_message_free_unpacked(m, NULL);
                }
        }

        print_message("fuzz: %zu accepted (%zu decoded), %zu over a limit\n", accepted, decoded,
                      limited);
        assert_true(decoded > 1000);
        assert_true(limited > 1000);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_depth_boundary),
                cmocka_unit_test(test_value_levels),
                cmocka_unit_test(test_deep_100000),
                cmocka_unit_test(test_messages_boundary),
                cmocka_unit_test(test_map_entries_and_context),
                cmocka_unit_test(test_unknown_and_scalar_fields),
                cmocka_unit_test(test_fields_bound),
                cmocka_unit_test(test_malformed),
                cmocka_unit_test(test_every_prefix),
                cmocka_unit_test(test_fuzz),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}

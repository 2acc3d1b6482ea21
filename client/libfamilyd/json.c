/* json.c: proto3 JSON of protobuf-c messages, by walking their descriptors. */

/*
 * DESIGN
 *
 * protobuf-c has no JSON of its own, and familyctl --json must print exactly what buf curl and
 * Python's json_format print, because scripts compare the two. The rules kept here are
 * proto3's: fields in field-number order under their lowerCamelCase name; a field without
 * presence is omitted at its default (0, false, "", empty list or map), a field with presence
 * (a message, a oneof member, a proto3 `optional`, which protoc-c generates as a one-field
 * oneof) is written when set; int64/uint64 as strings; maps as objects with string keys; enums
 * by name; bytes as standard base64; non-finite floats as "NaN", "Infinity", "-Infinity".
 *
 * protobuf-c 1.4.1 descriptors do not mark map entries: a repeated message field whose type is
 * named <Something>Entry with exactly the fields key = 1 and value = 2 is taken as a map, which
 * is what protoc generates for map<K, V> and never for a hand-written message in this API.
 * Well-known types with a JSON form of their own (Any, Timestamp, wrappers) get the generic
 * form; the familyd.v1 API uses none of them.
 */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyd.h"
#include "common/macro.h"

/* Messages nest only as deep as the protos do; a cycle of pointers would be a caller's bug. */
#define JSON_MAX_DEPTH 64

typedef struct JsonWriter {
        FILE *f;
        bool pretty;
        unsigned depth;
} JsonWriter;

static int write_message(JsonWriter *w, const ProtobufCMessage *m);

static void write_indent(JsonWriter *w) {
        if (!w->pretty)
                return;
        fputc('\n', w->f);
        for (unsigned i = 0; i < w->depth; i++)
                fputs("  ", w->f);
}

static void write_string(JsonWriter *w, const char *s, size_t n) {
        fputc('"', w->f);
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char) s[i];

                switch (c) {
                case '"':  fputs("\\\"", w->f); break;
                case '\\': fputs("\\\\", w->f); break;
                case '\b': fputs("\\b", w->f); break;
                case '\f': fputs("\\f", w->f); break;
                case '\n': fputs("\\n", w->f); break;
                case '\r': fputs("\\r", w->f); break;
                case '\t': fputs("\\t", w->f); break;
                default:
                        if (c < 0x20 || c == 0x7f)
                                fprintf(w->f, "\\u%04x", c);
                        else
                                fputc(c, w->f);
                }
        }
        fputc('"', w->f);
}

static void write_cstring(JsonWriter *w, const char *s) {
        s = strempty(s);
        write_string(w, s, strlen(s));
}

static void write_base64(JsonWriter *w, const uint8_t *p, size_t n) {
        static const char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

        fputc('"', w->f);
        for (size_t i = 0; i < n; i += 3) {
                uint32_t v = (uint32_t) p[i] << 16;
                size_t left = n - i;

                if (left > 1)
                        v |= (uint32_t) p[i + 1] << 8;
                if (left > 2)
                        v |= p[i + 2];
                fputc(table[(v >> 18) & 63], w->f);
                fputc(table[(v >> 12) & 63], w->f);
                fputc(left > 1 ? table[(v >> 6) & 63] : '=', w->f);
                fputc(left > 2 ? table[v & 63] : '=', w->f);
        }
        fputc('"', w->f);
}

/* The shortest text that reads back as the same value, as other proto3 JSON printers do. */
static void write_double(JsonWriter *w, double d, bool is_float) {
        char buf[64];

        if (isnan(d)) {
                fputs("\"NaN\"", w->f);
                return;
        }
        if (isinf(d)) {
                fputs(d > 0 ? "\"Infinity\"" : "\"-Infinity\"", w->f);
                return;
        }
        for (int prec = 1; prec <= 17; prec++) {
                (void) snprintf(buf, sizeof(buf), "%.*g", prec, d);
                if (is_float ? (float) strtod(buf, NULL) == (float) d : strtod(buf, NULL) == d)
                        break;
        }
        fputs(buf, w->f);
}

static void write_json_name(JsonWriter *w, const char *name) {
        bool upper = false;

        fputc('"', w->f);
        for (const char *p = name; *p; p++) {
                if (*p == '_') {
                        upper = true;
                        continue;
                }
                fputc(upper && *p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p, w->f);
                upper = false;
        }
        fputc('"', w->f);
}

static size_t element_size(ProtobufCType type) {
        switch (type) {
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_SFIXED32:
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_FIXED32:
                return sizeof(int32_t);
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
                return sizeof(int64_t);
        case PROTOBUF_C_TYPE_FLOAT:
                return sizeof(float);
        case PROTOBUF_C_TYPE_DOUBLE:
                return sizeof(double);
        case PROTOBUF_C_TYPE_BOOL:
                return sizeof(protobuf_c_boolean);
        case PROTOBUF_C_TYPE_ENUM:
                return sizeof(int);
        case PROTOBUF_C_TYPE_STRING:
                return sizeof(char *);
        case PROTOBUF_C_TYPE_BYTES:
                return sizeof(ProtobufCBinaryData);
        case PROTOBUF_C_TYPE_MESSAGE:
                return sizeof(ProtobufCMessage *);
        }
        return 0;
}

/* One value of the field's type at p (a struct member or an array element). */
static int write_value(JsonWriter *w, const ProtobufCFieldDescriptor *fd, const void *p) {
        switch (fd->type) {
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_SFIXED32:
                fprintf(w->f, "%" PRId32, *(const int32_t *) p);
                return 0;
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_FIXED32:
                fprintf(w->f, "%" PRIu32, *(const uint32_t *) p);
                return 0;
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
                fprintf(w->f, "\"%" PRId64 "\"", *(const int64_t *) p);
                return 0;
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
                fprintf(w->f, "\"%" PRIu64 "\"", *(const uint64_t *) p);
                return 0;
        case PROTOBUF_C_TYPE_FLOAT:
                write_double(w, *(const float *) p, true);
                return 0;
        case PROTOBUF_C_TYPE_DOUBLE:
                write_double(w, *(const double *) p, false);
                return 0;
        case PROTOBUF_C_TYPE_BOOL:
                fputs(*(const protobuf_c_boolean *) p ? "true" : "false", w->f);
                return 0;
        case PROTOBUF_C_TYPE_ENUM: {
                int v = *(const int *) p;
                const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(fd->descriptor, v);

                /* An unknown number stays a number, as proto3 JSON says. */
                if (ev)
                        write_cstring(w, ev->name);
                else
                        fprintf(w->f, "%d", v);
                return 0;
        }
        case PROTOBUF_C_TYPE_STRING:
                write_cstring(w, *(char *const *) p);
                return 0;
        case PROTOBUF_C_TYPE_BYTES: {
                const ProtobufCBinaryData *b = p;

                write_base64(w, b->data, b->len);
                return 0;
        }
        case PROTOBUF_C_TYPE_MESSAGE: {
                const ProtobufCMessage *sub = *(ProtobufCMessage *const *) p;

                if (!sub) {
                        fputs("{}", w->f);
                        return 0;
                }
                return write_message(w, sub);
        }
        }
        return -EINVAL;
}

static bool is_map_field(const ProtobufCFieldDescriptor *fd) {
        const ProtobufCMessageDescriptor *d;
        size_t n;

        if (fd->label != PROTOBUF_C_LABEL_REPEATED || fd->type != PROTOBUF_C_TYPE_MESSAGE)
                return false;
        d = fd->descriptor;
        if (!d || d->n_fields != 2)
                return false;
        n = strlen(d->name);
        return n > 5 && streq(d->name + n - 5, "Entry") &&
                d->fields[0].id == 1 && streq(d->fields[0].name, "key") &&
                d->fields[1].id == 2 && streq(d->fields[1].name, "value");
}

/* Map keys are JSON strings whatever their proto type. */
static int write_map_key(JsonWriter *w, const ProtobufCFieldDescriptor *kd, const void *p) {
        char buf[32];

        switch (kd->type) {
        case PROTOBUF_C_TYPE_STRING:
                write_cstring(w, *(char *const *) p);
                return 0;
        case PROTOBUF_C_TYPE_BOOL:
                write_cstring(w, *(const protobuf_c_boolean *) p ? "true" : "false");
                return 0;
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_SFIXED32:
                (void) snprintf(buf, sizeof(buf), "%" PRId32, *(const int32_t *) p);
                break;
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_FIXED32:
                (void) snprintf(buf, sizeof(buf), "%" PRIu32, *(const uint32_t *) p);
                break;
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
                (void) snprintf(buf, sizeof(buf), "%" PRId64, *(const int64_t *) p);
                break;
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
                (void) snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *) p);
                break;
        default:
                return -EINVAL;
        }
        write_cstring(w, buf);
        return 0;
}

static int write_map(JsonWriter *w, const ProtobufCFieldDescriptor *fd, ProtobufCMessage *const *entries, size_t n) {
        const ProtobufCMessageDescriptor *ed = fd->descriptor;
        const ProtobufCFieldDescriptor *kd = &ed->fields[0], *vd = &ed->fields[1];
        int r;

        fputc('{', w->f);
        w->depth++;
        for (size_t i = 0; i < n; i++) {
                const uint8_t *e = (const uint8_t *) entries[i];

                if (i > 0)
                        fputc(',', w->f);
                write_indent(w);
                r = write_map_key(w, kd, e + kd->offset);
                if (r < 0)
                        return r;
                fputs(w->pretty ? ": " : ":", w->f);
                r = write_value(w, vd, e + vd->offset);
                if (r < 0)
                        return r;
        }
        w->depth--;
        if (n > 0)
                write_indent(w);
        fputc('}', w->f);
        return 0;
}

static int write_array(JsonWriter *w, const ProtobufCFieldDescriptor *fd, const uint8_t *array, size_t n) {
        size_t sz = element_size(fd->type);
        int r;

        fputc('[', w->f);
        w->depth++;
        for (size_t i = 0; i < n; i++) {
                if (i > 0)
                        fputc(',', w->f);
                write_indent(w);
                r = write_value(w, fd, array + i * sz);
                if (r < 0)
                        return r;
        }
        w->depth--;
        if (n > 0)
                write_indent(w);
        fputc(']', w->f);
        return 0;
}

/* Whether a field without presence holds its type's default, and so is left out. */
static bool is_default(const ProtobufCFieldDescriptor *fd, const void *p) {
        switch (fd->type) {
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32:
        case PROTOBUF_C_TYPE_SFIXED32:
        case PROTOBUF_C_TYPE_UINT32:
        case PROTOBUF_C_TYPE_FIXED32:
                return *(const uint32_t *) p == 0;
        case PROTOBUF_C_TYPE_INT64:
        case PROTOBUF_C_TYPE_SINT64:
        case PROTOBUF_C_TYPE_SFIXED64:
        case PROTOBUF_C_TYPE_UINT64:
        case PROTOBUF_C_TYPE_FIXED64:
                return *(const uint64_t *) p == 0;
        case PROTOBUF_C_TYPE_FLOAT:
                /* -0.0 is not the default: its sign bit is set, and proto3 writes it. */
                return *(const float *) p == 0 && !signbit(*(const float *) p);
        case PROTOBUF_C_TYPE_DOUBLE:
                return *(const double *) p == 0 && !signbit(*(const double *) p);
        case PROTOBUF_C_TYPE_BOOL:
                return !*(const protobuf_c_boolean *) p;
        case PROTOBUF_C_TYPE_ENUM:
                return *(const int *) p == 0;
        case PROTOBUF_C_TYPE_STRING:
                return isempty(*(char *const *) p);
        case PROTOBUF_C_TYPE_BYTES:
                return ((const ProtobufCBinaryData *) p)->len == 0;
        case PROTOBUF_C_TYPE_MESSAGE:
                return !*(ProtobufCMessage *const *) p;
        }
        return true;
}

static bool field_present(const ProtobufCFieldDescriptor *fd, const uint8_t *m) {
        const void *p = m + fd->offset;

        if (fd->label == PROTOBUF_C_LABEL_REPEATED)
                return *(const size_t *) (m + fd->quantifier_offset) > 0;
        if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
                return *(const uint32_t *) (m + fd->quantifier_offset) == fd->id;
        if (fd->label == PROTOBUF_C_LABEL_REQUIRED)
                return true;
        if (fd->label == PROTOBUF_C_LABEL_OPTIONAL) {
                /* proto2: strings and messages are present when non-NULL, the rest by has_. */
                if (fd->type == PROTOBUF_C_TYPE_STRING || fd->type == PROTOBUF_C_TYPE_MESSAGE)
                        return *(const void *const *) p != NULL;
                return *(const protobuf_c_boolean *) (m + fd->quantifier_offset);
        }
        return !is_default(fd, p);
}

static int write_message(JsonWriter *w, const ProtobufCMessage *msg) {
        const ProtobufCMessageDescriptor *d = msg->descriptor;
        const uint8_t *m = (const uint8_t *) msg;
        bool first = true;
        int r;

        if (w->depth >= JSON_MAX_DEPTH)
                return -ELOOP;

        fputc('{', w->f);
        w->depth++;
        for (unsigned i = 0; i < d->n_fields; i++) {
                const ProtobufCFieldDescriptor *fd = &d->fields[i];

                if (!field_present(fd, m))
                        continue;

                if (!first)
                        fputc(',', w->f);
                first = false;
                write_indent(w);
                write_json_name(w, fd->name);
                fputs(w->pretty ? ": " : ":", w->f);

                if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
                        size_t n = *(const size_t *) (m + fd->quantifier_offset);
                        const void *array = *(const void *const *) (m + fd->offset);

                        if (is_map_field(fd))
                                r = write_map(w, fd, array, n);
                        else
                                r = write_array(w, fd, array, n);
                } else
                        r = write_value(w, fd, m + fd->offset);
                if (r < 0)
                        return r;
        }
        w->depth--;
        if (!first)
                write_indent(w);
        fputc('}', w->f);
        return 0;
}

int familyd_json_encode(const ProtobufCMessage *message, unsigned flags, char **ret_json) {
        _cleanup_free_ char *buf = NULL;
        size_t size = 0;
        JsonWriter w = { .pretty = flags & FAMILYD_JSON_PRETTY };
        int r;

        if (!message || !message->descriptor || !ret_json)
                return -EINVAL;

        w.f = open_memstream(&buf, &size);
        if (!w.f)
                return -ENOMEM;
        r = write_message(&w, message);
        if (ferror(w.f) && r >= 0)
                r = -ENOMEM;
        if (fclose(w.f) != 0 && r >= 0)
                r = -ENOMEM;
        if (r < 0)
                return r;

        *ret_json = TAKE_PTR(buf);
        return 0;
}

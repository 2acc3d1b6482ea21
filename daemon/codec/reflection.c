/* reflection.c: gRPC server reflection answered from the embedded FileDescriptorSet. */
/*
 * DESIGN: a pure engine, bytes in and bytes out; the adapter owns the gRPC stream and calls
 * reflection_answer() once per request message. Everything costly happens once in
 * reflection_new(): every FileDescriptorProto is re-serialized a single time, files and
 * fully-qualified symbols are put in sorted arrays, dependencies are resolved to indices, and the
 * list_services answer is prebuilt. After that a Reflection is read-only, so any number of
 * threads may answer from it without a lock. Answers borrow its bytes; nothing is copied until
 * the final pack.
 */
#include <assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "google-protobuf-descriptor.pb-c.h"
#include "grpc-reflection-v1-reflection.pb-c.h"
#include "common/macro.h"
#include "reflection.h"

/* gRPC status numbers, fixed by the gRPC spec; this file stays free of gRPC's headers. */
#define REFLECTION_STATUS_NOT_FOUND     5
#define REFLECTION_STATUS_UNIMPLEMENTED 12

/* The set is built with the daemon, yet an accidental or broken set must fail at start with a
 * clear error rather than recurse or allocate without end. */
#define REFLECTION_MAX_FILES   4096u
#define REFLECTION_MAX_SYMBOLS (1u << 20)
#define REFLECTION_MAX_NESTING 64u
/* Names quoted back in error texts are cut here; the whole request is echoed anyway. */
#define REFLECTION_MAX_QUOTED  256u

/* protoc-c's names for the oneof cases do not fit on a line. */
#define REQUEST_CASE(c) GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_##c
#define RESPONSE_CASE(c) GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_##c

/* gen-c.sh turns proto2 `optional T x = N;` into one-field oneofs, so presence of the `name`
 * field (number 1 in every descriptor message) is a non-zero case. */
#define DESCRIPTOR_NAME(m) ((m)->_name_case != 0 ? (m)->name : NULL)

typedef enum SymbolKind {
        SYMBOL_FILE,
        SYMBOL_MESSAGE,
        SYMBOL_ENUM,
        SYMBOL_SERVICE,
        SYMBOL_METHOD,
        _SYMBOL_KIND_MAX,
        _SYMBOL_KIND_INVALID = -EINVAL,
} SymbolKind;

typedef struct Symbol {
        char *name;             /* fully qualified, owned */
        size_t file;            /* index into Reflection.files */
        SymbolKind kind;
} Symbol;

typedef struct ReflectionFile {
        ProtobufCBinaryData bytes;      /* the serialized FileDescriptorProto, owned */
        size_t *deps;                   /* indices into Reflection.files */
        size_t n_deps;
} ReflectionFile;

typedef struct SymbolTable {
        Symbol *items;
        size_t n, allocated;
} SymbolTable;

struct Reflection {
        ReflectionFile *files;
        size_t n_files;

        SymbolTable by_filename;        /* kind SYMBOL_FILE, sorted by name */
        SymbolTable symbols;            /* everything else, sorted by name */

        /* The prebuilt list_services answer, in set order. Names point into symbols. */
        Grpc__Reflection__V1__ServiceResponse *services;
        Grpc__Reflection__V1__ServiceResponse **service_ptrs;
        size_t n_services, n_services_allocated;
};

static void symbol_table_done(SymbolTable *t) {
        for (size_t i = 0; i < t->n; i++)
                free(t->items[i].name);
        t->items = mfree(t->items);
        t->n = t->allocated = 0;
}

static int symbol_compare(const void *a, const void *b) {
        return strcmp(((const Symbol *) a)->name, ((const Symbol *) b)->name);
}

/* Copies name in; the table owns the copy. ret_name, if given, is that copy. */
static int symbol_table_add(SymbolTable *t, const char *name, size_t file, SymbolKind kind,
                            const char **ret_name) {
        if (t->n >= REFLECTION_MAX_SYMBOLS)
                return -EINVAL;
        if (!GREEDY_REALLOC(t->items, t->allocated, t->n + 1))
                return -ENOMEM;

        char *copy = strdup(name);
        if (!copy)
                return -ENOMEM;

        t->items[t->n++] = (Symbol) { .name = copy, .file = file, .kind = kind };
        if (ret_name)
                *ret_name = copy;
        return 0;
}

/* Sorts for bsearch. A duplicate means two files claim one name: reflection could not tell the
 * client which one is meant, so the set is refused. */
static int symbol_table_seal(SymbolTable *t) {
        if (t->n == 0)
                return 0;
        qsort(t->items, t->n, sizeof(Symbol), symbol_compare);
        for (size_t i = 1; i < t->n; i++)
                if (streq(t->items[i - 1].name, t->items[i].name))
                        return -EINVAL;
        return 0;
}

static const Symbol *symbol_table_find(const SymbolTable *t, const char *name) {
        Symbol key = { .name = (char *) name };

        if (!name || t->n == 0)
                return NULL;
        return bsearch(&key, t->items, t->n, sizeof(Symbol), symbol_compare);
}

static char *name_join(const char *prefix, const char *name) {
        char *s;

        if (isempty(prefix))
                return strdup(name);
        if (asprintf(&s, "%s.%s", prefix, name) < 0)
                return NULL;
        return s;
}

static int index_named(Reflection *rf, size_t file, const char *prefix, const char *name,
                       SymbolKind kind, char **ret_full) {
        _cleanup_free_ char *full = NULL;
        int r;

        if (isempty(name))
                return -EINVAL;

        full = name_join(prefix, name);
        if (!full)
                return -ENOMEM;

        r = symbol_table_add(&rf->symbols, full, file, kind, NULL);
        if (r < 0)
                return r;

        if (ret_full)
                *ret_full = TAKE_PTR(full);
        return 0;
}

static int index_enums(Reflection *rf, size_t file, const char *prefix,
                       Google__Protobuf__EnumDescriptorProto **enums, size_t n) {
        int r;

        for (size_t i = 0; i < n; i++) {
                r = index_named(rf, file, prefix, DESCRIPTOR_NAME(enums[i]), SYMBOL_ENUM, NULL);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int index_message(Reflection *rf, size_t file, const char *prefix,
                         const Google__Protobuf__DescriptorProto *m, unsigned depth) {
        _cleanup_free_ char *full = NULL;
        int r;

        if (depth >= REFLECTION_MAX_NESTING)
                return -EINVAL;

        r = index_named(rf, file, prefix, DESCRIPTOR_NAME(m), SYMBOL_MESSAGE, &full);
        if (r < 0)
                return r;

        for (size_t i = 0; i < m->n_nested_type; i++) {
                r = index_message(rf, file, full, m->nested_type[i], depth + 1);
                if (r < 0)
                        return r;
        }

        return index_enums(rf, file, full, m->enum_type, m->n_enum_type);
}

static int index_service(Reflection *rf, size_t file, const char *prefix,
                         const Google__Protobuf__ServiceDescriptorProto *s) {
        _cleanup_free_ char *full = NULL;
        const char *kept;
        int r;

        if (isempty(DESCRIPTOR_NAME(s)))
                return -EINVAL;
        full = name_join(prefix, s->name);
        if (!full)
                return -ENOMEM;

        r = symbol_table_add(&rf->symbols, full, file, SYMBOL_SERVICE, &kept);
        if (r < 0)
                return r;

        /* Pointers into the services array are taken only once it stops growing. */
        if (!GREEDY_REALLOC(rf->services, rf->n_services_allocated, rf->n_services + 1))
                return -ENOMEM;
        rf->services[rf->n_services++] = (Grpc__Reflection__V1__ServiceResponse)
                GRPC__REFLECTION__V1__SERVICE_RESPONSE__INIT;
        rf->services[rf->n_services - 1].name = (char *) kept;

        for (size_t i = 0; i < s->n_method; i++) {
                r = index_named(rf, file, full, DESCRIPTOR_NAME(s->method[i]), SYMBOL_METHOD, NULL);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int index_file(Reflection *rf, size_t i, const Google__Protobuf__FileDescriptorProto *f) {
        ReflectionFile *file = rf->files + i;
        const char *package;
        size_t size;
        int r;

        if (isempty(DESCRIPTOR_NAME(f)))
                return -EINVAL;
        package = f->_package_case == GOOGLE__PROTOBUF__FILE_DESCRIPTOR_PROTO___PACKAGE_PACKAGE ?
                f->package : NULL;

        r = symbol_table_add(&rf->by_filename, f->name, i, SYMBOL_FILE, NULL);
        if (r < 0)
                return r;

        /* Serialized once here; every answer reuses these bytes. */
        size = google__protobuf__file_descriptor_proto__get_packed_size(f);
        file->bytes.data = malloc(size > 0 ? size : 1);
        if (!file->bytes.data)
                return -ENOMEM;
        file->bytes.len = google__protobuf__file_descriptor_proto__pack(f, file->bytes.data);
        assert(file->bytes.len == size);

        for (size_t j = 0; j < f->n_message_type; j++) {
                r = index_message(rf, i, package, f->message_type[j], 0);
                if (r < 0)
                        return r;
        }

        r = index_enums(rf, i, package, f->enum_type, f->n_enum_type);
        if (r < 0)
                return r;

        for (size_t j = 0; j < f->n_service; j++) {
                r = index_service(rf, i, package, f->service[j]);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Needs by_filename sealed. A missing import would leave clients unable to build the file, so
 * the set is refused rather than served half. */
static int resolve_dependencies(Reflection *rf, size_t i, const Google__Protobuf__FileDescriptorProto *f) {
        ReflectionFile *file = rf->files + i;

        if (f->n_dependency == 0)
                return 0;

        file->deps = calloc(f->n_dependency, sizeof(size_t));
        if (!file->deps)
                return -ENOMEM;

        for (size_t j = 0; j < f->n_dependency; j++) {
                const Symbol *dep = symbol_table_find(&rf->by_filename, f->dependency[j]);
                if (!dep)
                        return -EINVAL;
                file->deps[file->n_deps++] = dep->file;
        }
        return 0;
}

Reflection *reflection_free(Reflection *rf) {
        if (!rf)
                return NULL;

        for (size_t i = 0; i < rf->n_files; i++) {
                free(rf->files[i].bytes.data);
                free(rf->files[i].deps);
        }
        free(rf->files);
        symbol_table_done(&rf->by_filename);
        symbol_table_done(&rf->symbols);
        free(rf->services);
        free(rf->service_ptrs);
        return mfree(rf);
}

static void file_descriptor_set_freep(Google__Protobuf__FileDescriptorSet **p) {
        if (*p)
                google__protobuf__file_descriptor_set__free_unpacked(*p, NULL);
}

int reflection_new(const uint8_t *descriptor_set, size_t size, Reflection **ret) {
        _cleanup_(file_descriptor_set_freep) Google__Protobuf__FileDescriptorSet *set = NULL;
        _cleanup_(reflection_freep) Reflection *rf = NULL;
        int r;

        assert(descriptor_set || size == 0);
        assert(ret);

        set = google__protobuf__file_descriptor_set__unpack(NULL, size, descriptor_set);
        if (!set)
                return -EBADMSG;
        if (set->n_file > REFLECTION_MAX_FILES)
                return -EINVAL;

        rf = calloc(1, sizeof(Reflection));
        if (!rf)
                return -ENOMEM;

        if (set->n_file > 0) {
                rf->files = calloc(set->n_file, sizeof(ReflectionFile));
                if (!rf->files)
                        return -ENOMEM;
        }
        rf->n_files = set->n_file;

        for (size_t i = 0; i < set->n_file; i++) {
                r = index_file(rf, i, set->file[i]);
                if (r < 0)
                        return r;
        }

        r = symbol_table_seal(&rf->by_filename);
        if (r < 0)
                return r;
        r = symbol_table_seal(&rf->symbols);
        if (r < 0)
                return r;

        for (size_t i = 0; i < set->n_file; i++) {
                r = resolve_dependencies(rf, i, set->file[i]);
                if (r < 0)
                        return r;
        }

        if (rf->n_services > 0) {
                rf->service_ptrs = calloc(rf->n_services, sizeof(Grpc__Reflection__V1__ServiceResponse *));
                if (!rf->service_ptrs)
                        return -ENOMEM;
                for (size_t i = 0; i < rf->n_services; i++)
                        rf->service_ptrs[i] = rf->services + i;
        }

        *ret = TAKE_PTR(rf);
        return 0;
}

/* The file first, then its imports breadth-first, each once: clients need the whole closure to
 * build the file, and the spec allows any order after the first. */
static int collect_files(const Reflection *rf, size_t first,
                         ProtobufCBinaryData **ret, size_t *ret_n) {
        _cleanup_free_ bool *seen = NULL;
        _cleanup_free_ size_t *queue = NULL;
        _cleanup_free_ ProtobufCBinaryData *out = NULL;
        size_t head = 0, tail = 0;

        assert(first < rf->n_files);

        seen = calloc(rf->n_files, sizeof(bool));
        queue = calloc(rf->n_files, sizeof(size_t));
        out = calloc(rf->n_files, sizeof(ProtobufCBinaryData));
        if (!seen || !queue || !out)
                return -ENOMEM;

        seen[first] = true;
        queue[tail++] = first;
        while (head < tail) {
                const ReflectionFile *f = rf->files + queue[head];

                out[head++] = f->bytes;
                for (size_t j = 0; j < f->n_deps; j++)
                        if (!seen[f->deps[j]]) {
                                seen[f->deps[j]] = true;
                                queue[tail++] = f->deps[j];
                        }
        }

        *ret = TAKE_PTR(out);
        *ret_n = tail;
        return 0;
}

/* A client-chosen name goes back in the text; cut it so the answer stays small. */
static int error_not_found(Grpc__Reflection__V1__ErrorResponse *e, char **buf, const char *what,
                           const char *name) {
        bool cut = strnlen(name, REFLECTION_MAX_QUOTED + 1) > REFLECTION_MAX_QUOTED;

        if (asprintf(buf, "%s not found: %.*s%s", what, (int) REFLECTION_MAX_QUOTED, name,
                     cut ? "..." : "") < 0)
                return -ENOMEM;

        e->error_code = REFLECTION_STATUS_NOT_FOUND;
        e->error_message = *buf;
        return 0;
}

/* The set declares no extensions, so every extension lookup misses. */
static int error_no_extension(const Grpc__Reflection__V1__ExtensionRequest *x,
                              Grpc__Reflection__V1__ErrorResponse *e, char **buf) {
        _cleanup_free_ char *key = NULL;

        if (asprintf(&key, "%d of %.*s", x ? x->extension_number : 0,
                     (int) REFLECTION_MAX_QUOTED, x ? strempty(x->containing_type) : "") < 0)
                return -ENOMEM;
        return error_not_found(e, buf, "Extension", key);
}

static int response_pack(const Grpc__Reflection__V1__ServerReflectionResponse *resp,
                         uint8_t **ret_reply, size_t *ret_reply_size) {
        size_t size = grpc__reflection__v1__server_reflection_response__get_packed_size(resp);
        uint8_t *reply = malloc(size > 0 ? size : 1);

        if (!reply)
                return -ENOMEM;
        *ret_reply_size = grpc__reflection__v1__server_reflection_response__pack(resp, reply);
        *ret_reply = reply;
        return 0;
}

static void request_freep(Grpc__Reflection__V1__ServerReflectionRequest **p) {
        if (*p)
                grpc__reflection__v1__server_reflection_request__free_unpacked(*p, NULL);
}

int reflection_answer(const Reflection *rf, const uint8_t *request, size_t size,
                      uint8_t **ret_reply, size_t *ret_reply_size) {
        _cleanup_(request_freep) Grpc__Reflection__V1__ServerReflectionRequest *req = NULL;
        Grpc__Reflection__V1__ServerReflectionResponse resp =
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
        Grpc__Reflection__V1__FileDescriptorResponse files =
                GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
        Grpc__Reflection__V1__ExtensionNumberResponse numbers =
                GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
        Grpc__Reflection__V1__ListServiceResponse list =
                GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
        Grpc__Reflection__V1__ErrorResponse error = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
        _cleanup_free_ ProtobufCBinaryData *file_data = NULL;
        _cleanup_free_ char *message = NULL;
        const Symbol *file = NULL;      /* answered with this file and its imports */
        const char *name;
        int r;

        assert(rf);
        assert(request || size == 0);
        assert(ret_reply);
        assert(ret_reply_size);

        if (size > REFLECTION_MAX_REQUEST_BYTES)
                return -EBADMSG;
        req = grpc__reflection__v1__server_reflection_request__unpack(NULL, size, request);
        if (!req)
                return -EBADMSG;

        switch (req->message_request_case) {

        case REQUEST_CASE(FILE_BY_FILENAME):
                name = strempty(req->file_by_filename);
                file = symbol_table_find(&rf->by_filename, name);
                if (!file) {
                        r = error_not_found(&error, &message, "File", name);
                        if (r < 0)
                                return r;
                }
                break;

        case REQUEST_CASE(FILE_CONTAINING_SYMBOL):
                name = strempty(req->file_containing_symbol);
                file = symbol_table_find(&rf->symbols, name);
                if (!file) {
                        r = error_not_found(&error, &message, "Symbol", name);
                        if (r < 0)
                                return r;
                }
                break;

        case REQUEST_CASE(FILE_CONTAINING_EXTENSION):
                r = error_no_extension(req->file_containing_extension, &error, &message);
                if (r < 0)
                        return r;
                break;

        case REQUEST_CASE(ALL_EXTENSION_NUMBERS_OF_TYPE): {
                const Symbol *type;

                name = strempty(req->all_extension_numbers_of_type);
                type = symbol_table_find(&rf->symbols, name);
                if (!type || type->kind != SYMBOL_MESSAGE) {
                        r = error_not_found(&error, &message, "Message type", name);
                        if (r < 0)
                                return r;
                        break;
                }

                /* A known message with no extensions: an empty list, not an error. */
                numbers.base_type_name = (char *) name;
                resp.message_response_case = RESPONSE_CASE(ALL_EXTENSION_NUMBERS_RESPONSE);
                resp.all_extension_numbers_response = &numbers;
                break;
        }

        case REQUEST_CASE(LIST_SERVICES):
                /* The request's content is not checked, as the spec says. */
                list.n_service = rf->n_services;
                list.service = rf->service_ptrs;
                resp.message_response_case = RESPONSE_CASE(LIST_SERVICES_RESPONSE);
                resp.list_services_response = &list;
                break;

        default:
                /* Empty, or a kind newer than this code: gRPC's own servers say UNIMPLEMENTED. */
                error.error_code = REFLECTION_STATUS_UNIMPLEMENTED;
                error.error_message = (char *) "Unsupported or empty reflection request";
                break;
        }

        if (file) {
                r = collect_files(rf, file->file, &file_data, &files.n_file_descriptor_proto);
                if (r < 0)
                        return r;
                files.file_descriptor_proto = file_data;
                resp.message_response_case = RESPONSE_CASE(FILE_DESCRIPTOR_RESPONSE);
                resp.file_descriptor_response = &files;
        }

        /* Whatever did not produce an answer above filled error. */
        if (resp.message_response_case == RESPONSE_CASE(_NOT_SET)) {
                resp.message_response_case = RESPONSE_CASE(ERROR_RESPONSE);
                resp.error_response = &error;
        }

        resp.valid_host = req->host;
        resp.original_request = req;
        return response_pack(&resp, ret_reply, ret_reply_size);
}

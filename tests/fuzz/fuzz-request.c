/* fuzz-request.c: one RPC through the daemon's own decode-and-handle path, as call.c runs it. */

/*
 * DESIGN: the first byte of an input picks the method (its value modulo the table below:
 * Resolve, CreateMesh, Build, Validate, GetFamily), the rest is the request's wire bytes. Each
 * goes the way call_handle() in daemon/rpc/call.c takes it: codec_wire_check(), protobuf-c
 * unpack into the call's arena, the service's registered handler (the RpcMethod of
 * service_family / service_mesh / service_build / service_validate, not a copy), then the reply
 * packed, or the error truncated and encoded as the grpc-status-details-bin trailer.
 *
 * The handlers run against one Manager (the conformance registry, 8 host devices, a 256 KiB
 * shm budget so that small Builds materialise and large ones meet the budget) with a shard
 * table and no executor: a materialising Build fills on this thread. Setup creates two meshes
 * and two builds (ids bld-f022f022-1 and -2, which the Validate seeds name). Every input
 * leaves that state as it found it: a Build it made is released and a mesh it made is deleted,
 * through the ReleaseBuild and DeleteMesh handlers, so each input is reproducible on its own.
 *
 * A handler that fails without saying why (call.c would answer INTERNAL) aborts: untrusted
 * bytes must never get there.
 *
 * FUZZ_STATS=1 prints, per method, how many inputs were unpacked, answered OK or answered an
 * error (FUZZ_STATS=2: also each input's outcome); FUZZ_SETUP=1 prints the seeded mesh and
 * build ids (tests/fuzz/gen-corpus.py uses them). The registry is
 * $FAMILYD_CONFORMANCE/registry, by default tests/conformance/registry of the source tree.
 */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/manager.h"
#include "core/resource-limits.h"
#include "codec/codec-status.h"
#include "codec/codec-wire.h"
#include "codec/codec.h"
#include "rpc/rpc.h"
#include "handout/shard-table.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_BOOT_TAG 0xf022f022u
#define FUZZ_SHM_BUDGET (256u * 1024u)
#define FUZZ_MAX_BUILDS 64u

typedef struct FuzzMethod {
        const char *path;
        const RpcMethod *method;
        size_t n_inputs, n_unpacked, n_ok, n_error;
} FuzzMethod;

/* The order is the meaning of the first byte: the corpus depends on it. */
static FuzzMethod methods[] = {
        { "/familyd.v1.FamilyService/Resolve" },
        { "/familyd.v1.MeshService/CreateMesh" },
        { "/familyd.v1.FamilyService/Build" },
        { "/familyd.v1.FamilyService/Validate" },
        { "/familyd.v1.FamilyService/GetFamily" },
};
enum { M_RESOLVE, M_CREATE_MESH, M_BUILD, M_VALIDATE, M_GET_FAMILY };

static const RpcMethod *release_method, *delete_mesh_method;
static Manager *manager;
static ShardTable *shards;
static RpcContext context;
static char seeded_meshes[2][64];
static bool ready;
static int verbose; /* FUZZ_STATS=2: each outcome */

static const RpcMethod *find_method(const char *path) {
        const RpcService *services[] = { &service_family, &service_build, &service_validate,
                                         &service_mesh };
        for (size_t i = 0; i < ELEMENTSOF(services); i++)
                for (size_t j = 0; j < services[i]->n_methods; j++)
                        if (streq(services[i]->methods[j].path, path))
                                return &services[i]->methods[j];
        fprintf(stderr, "fuzz-request: no handler for %s\n", path);
        abort();
}

static void *arena_pb_alloc(void *data, size_t size) {
        return arena_alloc(data, size);
}

static void arena_pb_free(void *data, void *p) {
}

/* What call_answer()/call_set_status() do with the outcome: pack the reply (refused over the
 * reply limit), or truncate the error text and encode the trailer. */
static void finish(ProtobufCMessage *reply, FamilyError *e) {
        if (reply) {
                size_t n = protobuf_c_message_get_packed_size(reply);
                if (n > FAMILYD_MAX_REPLY_BYTES)
                        return;
                uint8_t *buf = malloc(n ? n : 1);
                if (!buf)
                        abort();
                if (protobuf_c_message_pack(reply, buf) != n)
                        abort();
                free(buf);
                return;
        }
        /* A handler that failed must say why: call.c would otherwise answer INTERNAL. */
        if (e->status == FAMILY_STATUS_OK || !e->message)
                return;
        (void) family_error_truncate(e, FAMILYD_MAX_STATUS_MESSAGE);
        uint8_t *detail = NULL;
        size_t detail_size = 0;
        if (codec_status_encode((int) e->status, e->message,
                                e->reason ? e->reason : family_status_to_string(e->status),
                                "familyd", e->field ? "field" : NULL, e->field, &detail,
                                &detail_size) >= 0)
                free(detail);
}

/* Decodes and handles one request the way call_handle() does. Returns the handler's result
 * (< 0: failed, -EBADMSG: not decoded); a reply is in *ret_reply, allocated in arena. */
static int handle(const RpcMethod *m, Arena *arena, const uint8_t *data, size_t size,
                  ProtobufCMessage **ret_reply, FamilyError *e, bool *ret_unpacked) {
        ProtobufCAllocator allocator = {
                .alloc = arena_pb_alloc,
                .free = arena_pb_free,
                .allocator_data = arena,
        };
        ProtobufCMessage *request;

        *ret_unpacked = false;
        if (codec_wire_check(m->request_type, data, size, FAMILYD_MAX_REQUEST_DEPTH,
                             FAMILYD_MAX_REQUEST_MESSAGES) < 0)
                return -EBADMSG;
        request = protobuf_c_message_unpack(m->request_type, &allocator, size, data);
        if (!request)
                return -EBADMSG;
        *ret_unpacked = true;
        int r = m->handler(&context, arena, request, ret_reply, e);
        if (r == RPC_PENDING)
                abort(); /* no executor: a Build never defers here */
        return r;
}

/* Runs a request given as a message (setup and cleanup); aborts unless it succeeds. */
static void run_message(const RpcMethod *m, const ProtobufCMessage *msg, char *ret_id,
                        size_t id_size) {
        size_t n = protobuf_c_message_get_packed_size(msg);
        uint8_t *buf = malloc(n ? n : 1);
        ProtobufCMessage *reply = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        bool unpacked;
        Arena arena;

        if (!buf)
                abort();
        (void) protobuf_c_message_pack(msg, buf);
        arena_init(&arena);
        int r = handle(m, &arena, buf, n, &reply, &e, &unpacked);
        if (r < 0) {
                fprintf(stderr, "fuzz-request: setup %s failed: %s\n", m->path,
                        strempty(e.message));
                abort();
        }
        if (ret_id && m->request_type == &familyd__v1__build_request__descriptor)
                snprintf(ret_id, id_size, "%s",
                         ((Familyd__V1__BuildResponse *) reply)->build->build_id);
        if (ret_id && m->request_type == &familyd__v1__create_mesh_request__descriptor)
                snprintf(ret_id, id_size, "%s", ((Familyd__V1__Mesh *) reply)->mesh_id);
        family_error_done(&e);
        arena_done(&arena);
        free(buf);
}

static void create_mesh(const char *const *names, const int64_t *sizes, size_t n,
                        const char *const *expert_names, const int64_t *expert_sizes,
                        size_t n_expert, char *ret_id, size_t id_size) {
        Familyd__V1__MeshDim dims[4], edims[4];
        Familyd__V1__MeshDim *pdims[4], *pedims[4];
        Familyd__V1__Mesh mesh = FAMILYD__V1__MESH__INIT;
        Familyd__V1__CreateMeshRequest req = FAMILYD__V1__CREATE_MESH_REQUEST__INIT;

        for (size_t i = 0; i < n; i++) {
                familyd__v1__mesh_dim__init(&dims[i]);
                dims[i].name = (char *) names[i];
                dims[i].size = sizes[i];
                pdims[i] = &dims[i];
        }
        for (size_t i = 0; i < n_expert; i++) {
                familyd__v1__mesh_dim__init(&edims[i]);
                edims[i].name = (char *) expert_names[i];
                edims[i].size = expert_sizes[i];
                pedims[i] = &edims[i];
        }
        mesh.n_device_mesh = n;
        mesh.device_mesh = pdims;
        mesh.n_expert_mesh = n_expert;
        mesh.expert_mesh = pedims;
        req.mesh = &mesh;
        run_message(methods[M_CREATE_MESH].method, &req.base, ret_id, id_size);
}

static void build(const char *family, const char *const *keys, const int64_t *values, size_t n,
                  const char *mesh_id, char *ret_id, size_t id_size) {
        Familyd__V1__Config__FieldsEntry entries[8], *pentries[9];
        Familyd__V1__Value vals[9];
        Familyd__V1__Config config = FAMILYD__V1__CONFIG__INIT;
        Familyd__V1__BuildRequest req = FAMILYD__V1__BUILD_REQUEST__INIT;

        for (size_t i = 0; i <= n; i++) {
                familyd__v1__config__fields_entry__init(&entries[i]);
                familyd__v1__value__init(&vals[i]);
                if (i < n) {
                        vals[i].kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
                        vals[i].int_value = values[i];
                        entries[i].key = (char *) keys[i];
                } else {
                        vals[i].kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                        vals[i].double_value = 0.02;
                        entries[i].key = (char *) "initializer_range";
                }
                entries[i].value = &vals[i];
                pentries[i] = &entries[i];
        }
        config.n_fields = n + 1;
        config.fields = pentries;
        req.family = (char *) family;
        req.config = &config;
        req.mesh_id = (char *) (mesh_id ? mesh_id : "");
        run_message(methods[M_BUILD].method, &req.base, ret_id, id_size);
}

static void print_stats(void) {
        for (size_t i = 0; i < ELEMENTSOF(methods); i++)
                fprintf(stderr,
                        "fuzz-request: %-36s %zu inputs, %zu unpacked, %zu ok, %zu errors\n",
                        methods[i].path, methods[i].n_inputs, methods[i].n_unpacked,
                        methods[i].n_ok, methods[i].n_error);
}

static void cleanup(void) {
        manager = manager_free(manager);
        shards = shard_table_unref(shards);
}

static void setup(void) {
        const char *conformance = getenv("FAMILYD_CONFORMANCE");
        _cleanup_free_ char *dir = NULL;
        LoadDiagnostics diag = {};

        if (!conformance || !*conformance)
                conformance = FUZZ_DEFAULT_CONFORMANCE;
        if (asprintf(&dir, "%s/registry", conformance) < 0)
                abort();
        ManagerParams params = {
                .registry_path = dir,
                .node_name = "fuzz",
                .node_rank = 0,
                .address = "",
                .host_devices = 8,
                .shm_budget_bytes = FUZZ_SHM_BUDGET,
                .max_builds = FUZZ_MAX_BUILDS,
                .boot_tag = FUZZ_BOOT_TAG,
        };
        int r = manager_new(&params, &manager, &diag);
        if (r < 0) {
                char *j = load_diagnostics_join(&diag);
                fprintf(stderr, "fuzz-request: %s: cannot load (%d)\n%s\n", dir, r, strempty(j));
                free(j);
                exit(2);
        }
        load_diagnostics_done(&diag);
        if (shard_table_new(0, &shards) < 0)
                abort();
        context = (RpcContext) {
                .manager = manager,
                .shards = shards,
                .shard_socket = "/run/familyd/shard.sock",
        };
        for (size_t i = 0; i < ELEMENTSOF(methods); i++)
                methods[i].method = find_method(methods[i].path);
        release_method = find_method("/familyd.v1.FamilyService/ReleaseBuild");
        delete_mesh_method = find_method("/familyd.v1.MeshService/DeleteMesh");
        atexit(cleanup);

        /* The state every input starts from (DESIGN). */
        char build_ids[2][64];
        create_mesh((const char *[]) { "dp", "tp" }, (const int64_t[]) { 2, 4 }, 2, NULL, NULL,
                    0, seeded_meshes[0], sizeof seeded_meshes[0]);
        create_mesh((const char *[]) { "dp" }, (const int64_t[]) { 8 }, 1,
                    (const char *[]) { "edp_shard", "ep" }, (const int64_t[]) { 2, 4 }, 2,
                    seeded_meshes[1], sizeof seeded_meshes[1]);
        build("grouped_experts",
              (const char *[]) { "num_experts", "hidden_size", "moe_intermediate_size" },
              (const int64_t[]) { 8, 16, 8 }, 3, seeded_meshes[1], build_ids[0],
              sizeof build_ids[0]);
        build("attention",
              (const char *[]) { "num_attention_heads", "num_key_value_heads", "head_dim",
                                 "hidden_size" },
              (const int64_t[]) { 4, 2, 8, 32 }, 4, seeded_meshes[0], build_ids[1],
              sizeof build_ids[1]);

        const char *e = getenv("FUZZ_SETUP");
        if (e && *e == '1')
                fprintf(stderr, "fuzz-request: meshes %s %s, builds %s %s\n", seeded_meshes[0],
                        seeded_meshes[1], build_ids[0], build_ids[1]);
        e = getenv("FUZZ_STATS");
        if (e && (*e == '1' || *e == '2'))
                atexit(print_stats);
        verbose = e && *e == '2';
        ready = true;
}

/* Puts the state back as setup left it (DESIGN). */
static void undo(size_t which, const ProtobufCMessage *reply) {
        if (which == M_BUILD) {
                const Familyd__V1__BuildResponse *b = (const Familyd__V1__BuildResponse *) reply;
                Familyd__V1__ReleaseBuildRequest req = FAMILYD__V1__RELEASE_BUILD_REQUEST__INIT;
                req.build_id = b->build->build_id;
                run_message(release_method, &req.base, NULL, 0);
        } else if (which == M_CREATE_MESH) {
                const Familyd__V1__Mesh *m = (const Familyd__V1__Mesh *) reply;
                if (streq(m->mesh_id, seeded_meshes[0]) || streq(m->mesh_id, seeded_meshes[1]))
                        return;
                Familyd__V1__DeleteMeshRequest req = FAMILYD__V1__DELETE_MESH_REQUEST__INIT;
                req.mesh_id = m->mesh_id;
                run_message(delete_mesh_method, &req.base, NULL, 0);
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!ready)
                setup();
        if (size < 1 || size - 1 > FAMILYD_MAX_REQUEST_BYTES)
                return 0;

        size_t which = data[0] % ELEMENTSOF(methods);
        FuzzMethod *fm = &methods[which];
        ProtobufCMessage *reply = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        bool unpacked;
        Arena arena;

        fm->n_inputs++;
        arena_init(&arena);
        int r = handle(fm->method, &arena, data + 1, size - 1, &reply, &e, &unpacked);
        fm->n_unpacked += unpacked;
        if (verbose)
                fprintf(stderr, "fuzz-request: %s: %s %s\n", fm->path,
                        !unpacked  ? "undecodable"
                        : r >= 0   ? "OK"
                                   : family_status_to_string(e.status),
                        strempty(e.message));
        if (unpacked && r >= 0) {
                if (!reply)
                        abort(); /* success without a reply: call.c would send nothing */
                fm->n_ok++;
                finish(reply, &e);
                undo(which, reply);
        } else if (unpacked) {
                fm->n_error++;
                /* What call.c answers for a failure the handler did not describe: INTERNAL.
                 * Untrusted bytes must never get there (out of memory aside). */
                if (!family_error_is_set(&e) && r != -ENOMEM) {
                        fprintf(stderr, "fuzz-request: %s failed without an error: %s\n",
                                fm->path, strerror(-r));
                        abort();
                }
                finish(NULL, &e);
        }
        family_error_done(&e);
        arena_done(&arena);
        return 0;
}

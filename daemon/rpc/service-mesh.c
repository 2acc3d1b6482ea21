/* service-mesh.c: familyd.v1.MeshService: the topology and job meshes. */
#include "codec/codec.h"
#include "core/resource-limits.h"
#include "rpc.h"

static int get_topology(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                        ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        _cleanup_(topology_unrefp) Topology *t = manager_topology(ctx->manager);
        Familyd__V1__Topology *reply;
        int r;

        r = codec_topology_encode(arena, t, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static int create_mesh(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__CreateMeshRequest *req =
                (const Familyd__V1__CreateMeshRequest *) request;
        _cleanup_(mesh_spec_done) MeshSpec spec = {};
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        Familyd__V1__Mesh *reply;
        int r;

        r = codec_mesh_spec_decode(req->mesh, &spec, ret_error);
        if (r < 0)
                return r;
        r = manager_create_mesh(ctx->manager, &spec, &mesh, ret_error);
        if (r < 0)
                return r;
        RpcCaller caller;
        if (rpc_call_caller(&caller) >= 0)
                mesh_claim(mesh, caller.uid);
        r = codec_mesh_encode(arena, mesh, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static int get_mesh(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                    ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__GetMeshRequest *req = (const Familyd__V1__GetMeshRequest *) request;
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        Familyd__V1__Mesh *reply;
        int r;

        r = codec_check_length(req->mesh_id, FAMILYD_MAX_NAME_LENGTH, "mesh_id", ret_error);
        if (r < 0)
                return r;
        r = mesh_table_get(ctx->manager->meshes, req->mesh_id, &mesh, ret_error);
        if (r < 0)
                return r;
        r = codec_mesh_encode(arena, mesh, &reply);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static int list_meshes(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        Familyd__V1__ListMeshesResponse *reply;
        Mesh **list = NULL;
        size_t n = 0;
        int r;

        r = mesh_table_list(ctx->manager->meshes, &list, &n);
        if (r < 0)
                return r;

        reply = MSG_NEW(arena, Familyd__V1__ListMeshesResponse, familyd__v1__list_meshes_response__init);
        r = -ENOMEM;
        if (reply && ARRAY_NEW(arena, reply->meshes, n)) {
                r = 0;
                for (size_t i = 0; i < n && r >= 0; i++)
                        r = codec_mesh_encode(arena, list[i], &reply->meshes[i]);
        }
        mesh_list_free(list, n);
        if (r < 0)
                return r;
        reply->n_meshes = n;

        *ret_reply = &reply->base;
        return 0;
}

/* DeleteMesh of another uid's mesh needs an admin; a mesh without a known owner (restored
 * after a restart) may be deleted by anyone, as before owners. Unknown ids pass (NOT_FOUND
 * comes from the removal). */
static int mesh_check_owner(RpcContext *ctx, const char *id, FamilyError *ret_error) {
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        RpcCaller caller;
        uint32_t owner;

        if (mesh_table_get(ctx->manager->meshes, id, &mesh, NULL) < 0 || !mesh_owner(mesh, &owner))
                return 0;
        if (rpc_call_caller(&caller) >= 0 && caller.uid == owner)
                return 0;
        return rpc_require_admin("DeleteMesh of another user's mesh", ret_error);
}

static int delete_mesh(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__DeleteMeshRequest *req =
                (const Familyd__V1__DeleteMeshRequest *) request;
        Familyd__V1__DeleteMeshResponse *reply;
        int r;

        r = codec_check_length(req->mesh_id, FAMILYD_MAX_NAME_LENGTH, "mesh_id", ret_error);
        if (r < 0)
                return r;
        r = mesh_check_owner(ctx, req->mesh_id, ret_error);
        if (r < 0)
                return r;
        r = mesh_table_remove(ctx->manager->meshes, req->mesh_id, ret_error);
        if (r < 0)
                return r;
        reply = MSG_NEW(arena, Familyd__V1__DeleteMeshResponse, familyd__v1__delete_mesh_response__init);
        if (!reply)
                return -ENOMEM;
        *ret_reply = &reply->base;
        return 0;
}

static int forget_node(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                       ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__ForgetNodeRequest *req =
                (const Familyd__V1__ForgetNodeRequest *) request;
        Familyd__V1__ForgetNodeResponse *reply;
        int r;

        r = rpc_require_admin("ForgetNode", ret_error);
        if (r < 0)
                return r;
        r = codec_check_length(req->node, FAMILYD_MAX_NAME_LENGTH, "node", ret_error);
        if (r < 0)
                return r;
        if (isempty(req->node))
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "BAD_REQUEST",
                                        "node", "node is required");
        r = manager_forget_node(ctx->manager, req->node, ret_error);
        if (r < 0)
                return r;

        _cleanup_(topology_unrefp) Topology *t = manager_topology(ctx->manager);
        reply = MSG_NEW(arena, Familyd__V1__ForgetNodeResponse,
                        familyd__v1__forget_node_response__init);
        if (!reply)
                return -ENOMEM;
        r = codec_topology_encode(arena, t, &reply->topology);
        if (r < 0)
                return r;
        *ret_reply = &reply->base;
        return 0;
}

static const RpcMethod methods[] = {
        { "/familyd.v1.MeshService/GetTopology", RPC_UNARY,
          &familyd__v1__get_topology_request__descriptor, get_topology, NULL },
        /* The current topology, then the topology anew after each change. */
        { "/familyd.v1.MeshService/WatchTopology", RPC_WATCH,
          &familyd__v1__watch_topology_request__descriptor, get_topology, NULL,
          .pushes_changes = true },
        { "/familyd.v1.MeshService/CreateMesh", RPC_UNARY,
          &familyd__v1__create_mesh_request__descriptor, create_mesh, NULL,
          .audited = true },
        { "/familyd.v1.MeshService/GetMesh", RPC_UNARY,
          &familyd__v1__get_mesh_request__descriptor, get_mesh, NULL },
        { "/familyd.v1.MeshService/ListMeshes", RPC_UNARY,
          &familyd__v1__list_meshes_request__descriptor, list_meshes, NULL },
        { "/familyd.v1.MeshService/DeleteMesh", RPC_UNARY,
          &familyd__v1__delete_mesh_request__descriptor, delete_mesh, NULL,
          .audited = true },
        { "/familyd.v1.MeshService/ForgetNode", RPC_UNARY,
          &familyd__v1__forget_node_request__descriptor, forget_node, NULL,
          .audited = true },
};

const RpcService service_mesh = {
        .name = "familyd.v1.MeshService",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};

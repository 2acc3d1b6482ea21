/* service-family.c: familyd.v1.FamilyService: the registry and Resolve. */
#include "codec/codec.h"
#include "common/log.h"
#include "core/resource-limits.h"
#include "rpc.h"

static int list_families(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                         ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(ctx->manager);
        Familyd__V1__ListFamiliesResponse *reply;
        int r;

        reply = MSG_NEW(arena, Familyd__V1__ListFamiliesResponse,
                        familyd__v1__list_families_response__init);
        if (!reply || !ARRAY_NEW(arena, reply->families, reg->n_families))
                return -ENOMEM;
        for (size_t i = 0; i < reg->n_families; i++) {
                r = codec_family_encode(arena, &reg->families[i], &reply->families[i]);
                if (r < 0)
                        return r;
        }
        reply->n_families = reg->n_families;

        *ret_reply = &reply->base;
        return 0;
}

static int get_family(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                      ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__GetFamilyRequest *req = (const Familyd__V1__GetFamilyRequest *) request;
        _cleanup_(registry_unrefp) Registry *reg = NULL;
        Familyd__V1__Family *reply;
        const Family *f;
        int r;

        r = codec_check_length(req->family, FAMILYD_MAX_NAME_LENGTH * 4, "family", ret_error);
        if (r < 0)
                return r;
        r = manager_get_family(ctx->manager, req->family, &reg, &f, ret_error);
        if (r < 0)
                return r;
        r = codec_family_encode(arena, f, &reply);
        if (r < 0)
                return r;

        *ret_reply = &reply->base;
        return 0;
}

static int resolve(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request, ProtobufCMessage **ret_reply,
                   FamilyError *ret_error) {
        _cleanup_(resolve_request_done) ResolveRequest req = {};
        _cleanup_(resolved_family_done) ResolvedFamily res = {};
        Familyd__V1__ResolveResponse *reply;
        int r;

        r = codec_resolve_request_decode((const Familyd__V1__ResolveRequest *) request, &req,
                                         ret_error);
        if (r < 0)
                return r;
        r = manager_resolve(ctx->manager, &req, &res, ret_error);
        if (r < 0)
                return r;

        reply = MSG_NEW(arena, Familyd__V1__ResolveResponse, familyd__v1__resolve_response__init);
        if (!reply)
                return -ENOMEM;
        r = codec_resolved_family_encode(arena, &res, &reply->resolved);
        if (r < 0)
                return r;

        *ret_reply = &reply->base;
        return 0;
}

static const RpcMethod methods[] = {
        { "/familyd.v1.FamilyService/ListFamilies", RPC_UNARY,
          &familyd__v1__list_families_request__descriptor, list_families, NULL },
        { "/familyd.v1.FamilyService/GetFamily", RPC_UNARY,
          &familyd__v1__get_family_request__descriptor, get_family, NULL },
        { "/familyd.v1.FamilyService/Resolve", RPC_UNARY,
          &familyd__v1__resolve_request__descriptor, resolve, NULL },
};

/* Build, GetBuild, ListBuilds and ReleaseBuild are in service-build.c. */
const RpcService service_family = {
        .name = "familyd.v1.FamilyService",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};

/* service-validate.c: Validate: a trainer's model checked against its job and its builds. */
#include "build/build-state.h"
#include "codec/codec.h"
#include "core/resource-limits.h"
#include "rpc.h"
#include "core/validate.h"

typedef struct Lookup {
        BuildTable *builds;
        Arena *arena;
        BuildRecord **held; /* references kept until the checks are done */
        size_t n_held, allocated;
        /* Models list one build under many boundaries: remember the last one. */
        const char *last_id;
        BuiltFamily last;
} Lookup;

static int lookup_build(const char *build_id, BuiltFamily *ret, void *userdata) {
        Lookup *l = userdata;
        BuildRecord *rec = NULL;
        FamilyError e = FAMILY_ERROR_NULL;

        if (l->last_id && streq(l->last_id, build_id)) {
                *ret = l->last;
                return 0;
        }
        if (build_table_get(l->builds, build_id, &rec, &e) < 0) {
                bool missing = e.status == FAMILY_STATUS_NOT_FOUND;
                family_error_done(&e);
                return missing ? 1 : -ENOMEM;
        }
        if (!GREEDY_REALLOC(l->held, l->allocated, l->n_held + 1)) {
                build_record_unref(rec);
                return -ENOMEM;
        }
        l->held[l->n_held++] = rec;

        const BuildState *b = rec->payload;
        ValidateParameter *params = arena_alloc_array(l->arena, b->layout.n_parameters ?: 1,
                                                      sizeof(ValidateParameter));
        if (!params)
                return -ENOMEM;
        for (size_t i = 0; i < b->layout.n_parameters; i++) {
                const ParameterLayout *p = &b->layout.parameters[i];
                params[i] = (ValidateParameter) {
                        .name = p->name,
                        .shape = p->shape,
                        .n_dims = p->n_dims,
                        .placements = p->placements,
                        .n_placements = p->n_placements,
                        .dtype = (char *) dtype_to_string(p->dtype),
                };
        }
        *ret = (BuiltFamily) {
                .mesh_id = b->plan.mesh ? b->plan.mesh->id : NULL,
                .mesh_axis_size = b->plan.mesh ? b->plan.mesh->axis_size : NULL,
                .axis_size = b->plan.resolved.axis_size,
                .parameters = params,
                .n_parameters = b->layout.n_parameters,
        };
        l->last_id = rec->id;
        l->last = *ret;
        return 0;
}

static void lookup_done(Lookup *l) {
        for (size_t i = 0; i < l->n_held; i++)
                build_record_unref(l->held[i]);
        free(l->held);
}

static int validate(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                    ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__ValidateRequest *req = (const Familyd__V1__ValidateRequest *) request;
        Manager *m = ctx->manager;
        _cleanup_(job_context_done) JobContext context = {};
        _cleanup_(violation_list_done) ViolationList violations = {};
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        ModelBoundary *boundaries = NULL;
        size_t n = 0;
        ValidateJob job = {};
        int r;

        /* The job's context is checked as Resolve checks it (steps 3-5). */
        r = codec_job_context_decode(req->context, &context, ret_error);
        if (r < 0)
                return r;
        r = resolve_axis_sizes(m->meshes, &context, job.size, &mesh, ret_error);
        if (r < 0)
                return r;
        job.mesh_id = context.mesh_id;
        for (Axis a = 0; a < _AXIS_MAX; a++) {
                job.has_size[a] = context.has_size[a];
                job.context_size[a] = context.size[a];
        }

        r = codec_model_decode(arena, req->boundaries, req->n_boundaries, &boundaries, &n,
                               ret_error);
        if (r < 0)
                return r;

        Lookup l = { .builds = m->builds, .arena = arena };
        r = validate_model(boundaries, n, &job, lookup_build, &l, &violations);
        lookup_done(&l);
        if (r < 0)
                return r;

        Familyd__V1__ValidateResponse *reply = MSG_NEW(arena, Familyd__V1__ValidateResponse,
                                                       familyd__v1__validate_response__init);
        if (!reply || !ARRAY_NEW(arena, reply->violations, violations.n))
                return -ENOMEM;
        for (size_t i = 0; i < violations.n; i++) {
                const Violation *v = &violations.items[i];
                Familyd__V1__Violation *pb = MSG_NEW(arena, Familyd__V1__Violation,
                                                     familyd__v1__violation__init);
                if (!pb || !ARRAY_NEW(arena, pb->fqns, v->n_fqns) ||
                    !(pb->message = arena_strdup(arena, v->message)))
                        return -ENOMEM;
                for (size_t j = 0; j < v->n_fqns; j++)
                        if (!(pb->fqns[j] = arena_strdup(arena, v->fqns[j])))
                                return -ENOMEM;
                pb->n_fqns = v->n_fqns;
                pb->reason = (char *) v->reason;
                reply->violations[i] = pb;
        }
        reply->n_violations = violations.n;
        reply->ok = violations.n == 0;
        *ret_reply = &reply->base;
        return 0;
}

static const RpcMethod methods[] = {
        { "/familyd.v1.FamilyService/Validate", RPC_UNARY,
          &familyd__v1__validate_request__descriptor, validate, NULL },
};

const RpcService service_validate = {
        .name = "familyd.v1.FamilyService",
        .methods = methods,
        .n_methods = ELEMENTSOF(methods),
};

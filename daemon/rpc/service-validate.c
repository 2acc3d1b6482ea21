/* service-validate.c: Validate: a trainer's model checked against its job and its builds. */
#include "build/build-state.h"
#include "codec/codec.h"
#include "core/resource-limits.h"
#include "rpc.h"
#include "core/validate.h"

/* A build looked up once in this call, kept (and referenced) until the checks are done. */
typedef struct LookupEntry {
        BuildRecord *rec;
        BuiltFamily built;
} LookupEntry;

typedef struct Lookup {
        BuildTable *builds;
        Arena *arena;
        /* Sorted by build id: boundaries and shared parameters name the same builds many
         * times, and each is converted once. At most the live builds. */
        LookupEntry *entries;
        size_t n_entries, allocated;
} Lookup;

static int lookup_entry_cmp(const void *key, const void *x) {
        const LookupEntry *e = x;
        return strcmp(key, e->rec->id);
}

/* The index where build_id is, or would be inserted; *ret_found whether it is there. */
static size_t lookup_position(const Lookup *l, const char *build_id, bool *ret_found) {
        size_t lo = 0, hi = l->n_entries;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;
                int c = lookup_entry_cmp(build_id, &l->entries[mid]);
                if (c == 0) {
                        *ret_found = true;
                        return mid;
                }
                if (c < 0)
                        hi = mid;
                else
                        lo = mid + 1;
        }
        *ret_found = false;
        return lo;
}

static int parameter_cmp(const void *x, const void *y) {
        const ValidateParameter *a = x, *b = y;
        return strcmp(a->name, b->name);
}

static int built_family_make(Arena *arena, const BuildState *b, BuiltFamily *ret) {
        ValidateParameter *params = arena_alloc_array(arena, b->layout.n_parameters ?: 1,
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
        qsort(params, b->layout.n_parameters, sizeof(ValidateParameter), parameter_cmp);
        *ret = (BuiltFamily) {
                .mesh_id = b->plan.mesh ? b->plan.mesh->id : NULL,
                .mesh_axis_size = b->plan.mesh ? b->plan.mesh->axis_size : NULL,
                .axis_size = b->plan.resolved.axis_size,
                .parameters = params,
                .n_parameters = b->layout.n_parameters,
                .sorted = true,
                .activations = b->plan.has_activations ? &b->plan.activations : NULL,
        };
        return 0;
}

static int lookup_build(const char *build_id, BuiltFamily *ret, void *userdata) {
        Lookup *l = userdata;
        BuildRecord *rec = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        bool found;
        int r;

        size_t at = lookup_position(l, build_id, &found);
        if (found) {
                *ret = l->entries[at].built;
                return 0;
        }
        if (build_table_get(l->builds, build_id, &rec, &e) < 0) {
                bool missing = e.status == FAMILY_STATUS_NOT_FOUND;
                family_error_done(&e);
                return missing ? 1 : -ENOMEM;
        }
        if (!GREEDY_REALLOC(l->entries, l->allocated, l->n_entries + 1)) {
                build_record_unref(rec);
                return -ENOMEM;
        }
        LookupEntry entry = { .rec = rec };
        r = built_family_make(l->arena, rec->payload, &entry.built);
        if (r < 0) {
                build_record_unref(rec);
                return r;
        }
        memmove(&l->entries[at + 1], &l->entries[at],
                (l->n_entries - at) * sizeof(LookupEntry));
        l->entries[at] = entry;
        l->n_entries++;
        *ret = entry.built;
        return 0;
}

static void lookup_done(Lookup *l) {
        for (size_t i = 0; i < l->n_entries; i++)
                build_record_unref(l->entries[i].rec);
        free(l->entries);
}

static int validate(RpcContext *ctx, Arena *arena, const ProtobufCMessage *request,
                    ProtobufCMessage **ret_reply, FamilyError *ret_error) {
        const Familyd__V1__ValidateRequest *req = (const Familyd__V1__ValidateRequest *) request;
        Manager *m = ctx->manager;
        _cleanup_(job_context_done) JobContext context = {};
        _cleanup_(violation_list_done) ViolationList violations = {};
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        ModelBoundary *boundaries = NULL;
        SharedParameter *shared = NULL;
        size_t n = 0, n_shared = 0;
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
        r = codec_shared_parameters_decode(arena, req->shared_parameters,
                                           req->n_shared_parameters, &shared, &n_shared,
                                           ret_error);
        if (r < 0)
                return r;

        Lookup l = { .builds = m->builds, .arena = arena };
        r = validate_model(boundaries, n, shared, n_shared, &job, lookup_build, &l, &violations);
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

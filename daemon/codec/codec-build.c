/* codec-build.c: the Build messages: BuildRequest in, Build (provenance, layout, shards) out. */
#include "core/build-plan.h"
#include "codec-build.h"
#include "core/checkpoint-source.h"
#include "codec.h"
#include "core/resource-limits.h"
#include "core/validate.h"

static int source_module_decode(const Familyd__V1__SourceModule *pb, SourceModule *ret,
                                FamilyError *ret_error) {
        _cleanup_(source_module_done) SourceModule m = {};
        int r;

        r = codec_check_length(pb->fqn, FAMILYD_MAX_NAME_LENGTH * 4, "module.fqn", ret_error);
        if (r < 0)
                return r;
        m.fqn = strdup(pb->fqn);
        if (!m.fqn)
                return -ENOMEM;

        if (pb->n_parameters > FAMILYD_MAX_SOURCE_PARAMETERS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                        "module.parameters",
                                        "module has more than %u parameters",
                                        FAMILYD_MAX_SOURCE_PARAMETERS);
        if (pb->n_parameters > 0) {
                m.parameters = calloc(pb->n_parameters, sizeof(SourceParameter));
                if (!m.parameters)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < pb->n_parameters; i++) {
                const Familyd__V1__SourceParameter *sp = pb->parameters[i];
                SourceParameter *p = &m.parameters[i];

                r = codec_check_length(sp->name, FAMILYD_MAX_NAME_LENGTH, "module.parameters",
                                       ret_error);
                if (r < 0)
                        return r;
                if (sp->n_shape > FAMILYD_MAX_SHAPE_RANK)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                "LIMIT", "module.parameters",
                                                "a source parameter has more than %u dimensions",
                                                FAMILYD_MAX_SHAPE_RANK);
                m.n_parameters++;
                p->name = strdup(sp->name);
                p->dtype = strdup(sp->dtype);
                if (!p->name || !p->dtype)
                        return -ENOMEM;
                if (sp->n_shape > 0) {
                        p->shape = malloc(sp->n_shape * sizeof(int64_t));
                        if (!p->shape)
                                return -ENOMEM;
                        memcpy(p->shape, sp->shape, sp->n_shape * sizeof(int64_t));
                }
                p->n_dims = sp->n_shape;
        }

        *ret = m;
        m = (SourceModule) {};
        return 0;
}

static int materialize_decode(const Familyd__V1__MaterializeOptions *pb, MaterializeOptions *ret,
                              FamilyError *ret_error) {
        _cleanup_(materialize_options_done) MaterializeOptions o = {};

        if (!pb) {
                *ret = o;
                return 0;
        }
        o.enabled = pb->enabled;
        o.has_seed = pb->_seed_case == FAMILYD__V1__MATERIALIZE_OPTIONS___SEED_SEED;
        o.seed = o.has_seed ? pb->seed : 0;
        if (codec_check_length(pb->dtype, 32, "materialize.dtype", ret_error) < 0)
                return -EINVAL;
        o.dtype = strdup(pb->dtype);
        if (!o.dtype)
                return -ENOMEM;
        if (pb->n_ranks > FAMILYD_MAX_RANKS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                        "materialize.ranks", "more than %u ranks",
                                        FAMILYD_MAX_RANKS);
        if (pb->n_ranks > 0) {
                o.ranks = malloc(pb->n_ranks * sizeof(int64_t));
                if (!o.ranks)
                        return -ENOMEM;
                memcpy(o.ranks, pb->ranks, pb->n_ranks * sizeof(int64_t));
                o.n_ranks = pb->n_ranks;
        }

        *ret = o;
        o = (MaterializeOptions) {};
        return 0;
}

/* BuildRequest.parameter_dtypes: bounded here, checked against the build at step 7. */
static int parameter_dtypes_decode(Familyd__V1__BuildRequest__ParameterDtypesEntry *const *pb,
                                   size_t n, ParameterDtype **ret, size_t *ret_n,
                                   FamilyError *ret_error) {
        ParameterDtype *d = NULL;

        if (n > BUILD_PLAN_MAX_PARAMETER_DTYPES)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                        "parameter_dtypes",
                                        "parameter_dtypes has more than %u entries",
                                        BUILD_PLAN_MAX_PARAMETER_DTYPES);
        for (size_t i = 0; i < n; i++) {
                if (strlen(pb[i]->key) > FAMILYD_MAX_NAME_LENGTH)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                                "parameter_dtypes",
                                                "parameter_dtypes: a key is longer than %u bytes",
                                                FAMILYD_MAX_NAME_LENGTH);
                if (codec_check_length(pb[i]->value, 32, "parameter_dtypes", ret_error) < 0)
                        return -EINVAL;
        }
        if (n == 0)
                return 0;

        /* The message's strings, borrowed for the copy. */
        _cleanup_free_ ParameterDtype *view = calloc(n, sizeof(ParameterDtype));
        if (!view)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                view[i] = (ParameterDtype) { .name = pb[i]->key, .dtype = pb[i]->value };
        int r = parameter_dtypes_copy(view, n, &d);
        if (r < 0)
                return r;
        *ret = d;
        *ret_n = n;
        return 0;
}

int codec_build_request_decode(const Familyd__V1__BuildRequest *pb, BuildRequest *ret,
                               FamilyError *ret_error) {
        _cleanup_(build_request_done) BuildRequest req = {};
        int r;

        r = codec_check_length(pb->family, FAMILYD_MAX_NAME_LENGTH * 4, "family", ret_error);
        if (r < 0)
                return r;
        req.family = strdup(pb->family);
        if (!req.family)
                return -ENOMEM;

        r = codec_value_map_decode((void *const *) pb->arguments, pb->n_arguments, "arguments",
                                   &req.arguments, ret_error);
        if (r < 0)
                return r;

        if (pb->config) {
                req.has_config = true;
                r = codec_value_map_decode((void *const *) pb->config->fields,
                                           pb->config->n_fields, "config", &req.config,
                                           ret_error);
                if (r < 0)
                        return r;
        }

        if (pb->module) {
                req.has_module = true;
                r = source_module_decode(pb->module, &req.module, ret_error);
                if (r < 0)
                        return r;
        }

        /* The source module's config: as config, and bounded as config. */
        if (pb->source_config) {
                req.has_source_config = true;
                r = codec_value_map_decode((void *const *) pb->source_config->fields,
                                           pb->source_config->n_fields, "source_config",
                                           &req.source_config, ret_error);
                if (r < 0)
                        return r;
        }

        r = codec_check_length(pb->module_fqn, FAMILYD_MAX_NAME_LENGTH * 4, "module_fqn",
                               ret_error);
        if (r < 0)
                return r;
        req.module_fqn = strdup(pb->module_fqn);
        if (!req.module_fqn)
                return -ENOMEM;

        r = codec_job_context_decode(pb->context, &req.context, ret_error);
        if (r < 0)
                return r;

        if (!isempty(pb->mesh_id)) {
                r = codec_check_length(pb->mesh_id, FAMILYD_MAX_NAME_LENGTH, "mesh_id",
                                       ret_error);
                if (r < 0)
                        return r;
                req.mesh_id = strdup(pb->mesh_id);
                if (!req.mesh_id)
                        return -ENOMEM;
        }

        r = materialize_decode(pb->materialize, &req.materialize, ret_error);
        if (r < 0)
                return r;
        req.private_build = pb->private_build;
        req.writable = pb->writable;
        r = parameter_dtypes_decode(pb->parameter_dtypes, pb->n_parameter_dtypes,
                                    &req.parameter_dtypes, &req.n_parameter_dtypes, ret_error);
        if (r < 0)
                return r;

        if (pb->checkpoint) {
                /* A token is 32 characters: a longer one is unknown as any other. */
                r = codec_check_length(pb->checkpoint->token, FAMILYD_MAX_NAME_LENGTH,
                                       "checkpoint.token", ret_error);
                if (r >= 0)
                        r = codec_check_length(pb->checkpoint->prefix, CHECKPOINT_TEMPLATE_MAX,
                                               "checkpoint.prefix", ret_error);
                if (r < 0)
                        return r;
                if (!isempty(pb->checkpoint->names) &&
                    !streq(pb->checkpoint->names, "registry") &&
                    !streq(pb->checkpoint->names, "parameters")) {
                        r = codec_check_length(pb->checkpoint->names, FAMILYD_MAX_NAME_LENGTH,
                                               "checkpoint.names", ret_error);
                        if (r < 0)
                                return r;
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                "BAD_REQUEST", "checkpoint.names",
                                                "checkpoint.names must be \"registry\" or "
                                                "\"parameters\", not '%s'",
                                                pb->checkpoint->names);
                }
                req.checkpoint_by_parameter = streq_ptr(pb->checkpoint->names, "parameters");
                req.has_checkpoint = true;
                req.checkpoint_token = strdup(pb->checkpoint->token);
                req.checkpoint_prefix = strdup(pb->checkpoint->prefix);
                if (!req.checkpoint_token || !req.checkpoint_prefix)
                        return -ENOMEM;
        }

        *ret = req;
        req = (BuildRequest) {};
        return 0;
}

static int int64_array(Arena *a, const int64_t *v, size_t n, int64_t **ret, size_t *ret_n) {
        if (!ARRAY_NEW(a, *ret, n))
                return -ENOMEM;
        if (n > 0)
                memcpy(*ret, v, n * sizeof(int64_t));
        *ret_n = n;
        return 0;
}

static int request_encode(Arena *a, const ResolveRequest *req, Familyd__V1__ResolveRequest **ret) {
        Familyd__V1__ResolveRequest *pb = MSG_NEW(a, Familyd__V1__ResolveRequest,
                                                  familyd__v1__resolve_request__init);
        int r;

        if (!pb || !(pb->family = arena_strdup(a, req->family)))
                return -ENOMEM;
        r = codec_value_map_encode(a, &req->arguments,
                                   &familyd__v1__resolve_request__arguments_entry__descriptor,
                                   (void ***) &pb->arguments, &pb->n_arguments);
        if (r < 0)
                return r;
        r = codec_job_context_encode(a, &req->context, &pb->context);
        if (r < 0)
                return r;
        *ret = pb;
        return 0;
}

static int placements_encode(Arena *a, const Placement *p, size_t n, Familyd__V1__Placement ***ret,
                             size_t *ret_n) {
        if (!ARRAY_NEW(a, *ret, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                Familyd__V1__Placement *e = MSG_NEW(a, Familyd__V1__Placement,
                                                    familyd__v1__placement__init);
                if (!e || !(e->axis = arena_strdup(a, p[i].axis)))
                        return -ENOMEM;
                e->kind = (char *) placement_kind_to_string(p[i].kind);
                e->dim = p[i].kind == PLACEMENT_SHARD ? p[i].dim : 0;
                (*ret)[i] = e;
        }
        *ret_n = n;
        return 0;
}

static int layout_encode(Arena *a, const CodecBuild *b, Familyd__V1__Layout **ret) {
        const Layout *l = b->layout;
        Familyd__V1__Layout *pb = MSG_NEW(a, Familyd__V1__Layout, familyd__v1__layout__init);
        int r;

        if (!pb || !(pb->mesh_id = arena_strdup(a, l->mesh_id)) ||
            !ARRAY_NEW(a, pb->parameters, l->n_parameters))
                return -ENOMEM;
        for (size_t i = 0; i < l->n_parameters; i++) {
                const ParameterLayout *p = &l->parameters[i];
                Familyd__V1__ParameterLayout *e = MSG_NEW(a, Familyd__V1__ParameterLayout,
                                                          familyd__v1__parameter_layout__init);
                if (!e || !(e->name = arena_strdup(a, p->name)))
                        return -ENOMEM;
                r = int64_array(a, p->shape, p->n_dims, &e->shape, &e->n_shape);
                if (r < 0)
                        return r;
                e->dtype = (char *) dtype_to_string(p->dtype);
                r = placements_encode(a, p->placements, p->n_placements, &e->placements,
                                      &e->n_placements);
                if (r < 0)
                        return r;
                e->mesh_view = (char *) layout_view_to_string(p->view);
                e->checkpoint = (char *) strempty(p->checkpoint);
                pb->parameters[i] = e;
        }
        pb->n_parameters = l->n_parameters;
        if (b->plan->has_activations) {
                r = codec_activation_layout_encode(a, &b->plan->activations, &pb->activations);
                if (r < 0)
                        return r;
        }
        *ret = pb;
        return 0;
}

static int info_encode(Arena *a, const CodecBuild *b, Familyd__V1__FamilyBuildInfo **ret) {
        const BuildPlan *plan = b->plan;
        Familyd__V1__FamilyBuildInfo *pb = MSG_NEW(a, Familyd__V1__FamilyBuildInfo,
                                                   familyd__v1__family_build_info__init);
        int r;

        if (!pb)
                return -ENOMEM;
        r = request_encode(a, &plan->request, &pb->request);
        if (r < 0)
                return r;
        r = codec_resolved_family_encode(a, &plan->resolved, &pb->resolved);
        if (r < 0)
                return r;
        if (plan->has_config) {
                pb->config_snapshot = MSG_NEW(a, Familyd__V1__Config, familyd__v1__config__init);
                if (!pb->config_snapshot)
                        return -ENOMEM;
                r = codec_value_map_encode(a, &plan->config,
                                           &familyd__v1__config__fields_entry__descriptor,
                                           (void ***) &pb->config_snapshot->fields,
                                           &pb->config_snapshot->n_fields);
                if (r < 0)
                        return r;
        }
        pb->origin = (char *) build_origin_to_string(plan->origin);
        r = layout_encode(a, b, &pb->layout);
        if (r < 0)
                return r;
        pb->reset_after_materialization = plan->reset_after_materialization;
        *ret = pb;
        return 0;
}

static int rank_encode(Arena *a, const CodecBuild *b, size_t i, Familyd__V1__RankShard **ret) {
        const RankLayout *rl = &b->layout->ranks[i];
        const CodecBuildRank *rs = &b->ranks[i];
        Familyd__V1__RankShard *pb = MSG_NEW(a, Familyd__V1__RankShard,
                                             familyd__v1__rank_shard__init);
        int r;

        if (!pb || !(pb->node = arena_strdup(a, rs->node)))
                return -ENOMEM;
        pb->rank = rl->rank;
        pb->local_device = rs->local_device;
        pb->size_bytes = rl->size_bytes;
        pb->device_kind = (char *) (rs->device_kind ? rs->device_kind : CODEC_DEVICE_KIND_HOST);
        if (rs->token)
                pb->allocation_bytes = rs->allocation_bytes ? rs->allocation_bytes
                                                            : rl->size_bytes;
        if (rs->token && !(pb->token = arena_strdup(a, rs->token)))
                return -ENOMEM;

        if (!ARRAY_NEW(a, pb->slices, rl->n_slices))
                return -ENOMEM;
        for (size_t j = 0; j < rl->n_slices; j++) {
                const ShardSlice *s = &rl->slices[j];
                Familyd__V1__ShardSlice *e = MSG_NEW(a, Familyd__V1__ShardSlice,
                                                     familyd__v1__shard_slice__init);
                if (!e || !(e->parameter = arena_strdup(a, s->name)))
                        return -ENOMEM;
                r = int64_array(a, s->local_shape, s->n_dims, &e->local_shape, &e->n_local_shape);
                if (r < 0)
                        return r;
                r = int64_array(a, s->global_offset, s->n_dims, &e->global_offset,
                                &e->n_global_offset);
                if (r < 0)
                        return r;
                e->byte_offset = s->byte_offset;
                e->byte_length = s->byte_length;
                pb->slices[j] = e;
        }
        pb->n_slices = rl->n_slices;
        *ret = pb;
        return 0;
}

int codec_build_encode(Arena *a, const char *build_id, const CodecBuild *b,
                       const char *shard_socket, Familyd__V1__Build **ret) {
        Familyd__V1__Build *pb = MSG_NEW(a, Familyd__V1__Build, familyd__v1__build__init);
        int r;

        if (!pb || !(pb->build_id = arena_strdup(a, build_id)) ||
            !(pb->shard_socket = arena_strdup(a, shard_socket)) ||
            !(pb->registry_digest = arena_strdup(a, strempty(b->registry_digest))))
                return -ENOMEM;
        pb->writable = b->writable;
        r = info_encode(a, b, &pb->info);
        if (r < 0)
                return r;
        if (!ARRAY_NEW(a, pb->shards, b->n_ranks))
                return -ENOMEM;
        for (size_t i = 0; i < b->n_ranks; i++) {
                r = rank_encode(a, b, i, &pb->shards[i]);
                if (r < 0)
                        return r;
        }
        pb->n_shards = b->n_ranks;
        *ret = pb;
        return 0;
}

int codec_build_packed_size(const char *build_id, const CodecBuild *b, const char *shard_socket,
                            size_t *ret) {
        _cleanup_(arena_done) Arena a;
        Familyd__V1__Build *pb = NULL;
        int r;

        arena_init(&a);
        r = codec_build_encode(&a, build_id, b, shard_socket, &pb);
        if (r < 0)
                return r;
        *ret = protobuf_c_message_get_packed_size(&pb->base);
        return 0;
}

bool codec_token_is_valid(const char *s) {
        if (!s)
                return false;
        for (size_t i = 0; i < CODEC_TOKEN_LENGTH; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                        return false; /* also stops at a NUL before the end */
        return s[CODEC_TOKEN_LENGTH] == 0;
}

/* Applied layouts and model boundaries point into the arena: they live as long as the call. */
static int validate_parameter_decode(Arena *a, const Familyd__V1__ParameterLayout *pb,
                                     ValidateParameter *ret, FamilyError *ret_error) {
        if (codec_check_length(pb->name, FAMILYD_MAX_NAME_LENGTH, "applied_layout", ret_error) <
            0)
                return -EINVAL;
        if (pb->n_shape > FAMILYD_MAX_SHAPE_RANK || pb->n_placements > FAMILYD_MAX_MESH_DIMS * 4)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                        "applied_layout",
                                        "an applied layout parameter has too many dimensions "
                                        "or placements");
        ret->name = pb->name;
        ret->shape = pb->shape;
        ret->n_dims = pb->n_shape;
        ret->dtype = pb->dtype;
        if (!ARRAY_NEW(a, ret->placements, pb->n_placements))
                return -ENOMEM;
        for (size_t i = 0; i < pb->n_placements; i++) {
                const Familyd__V1__Placement *p = pb->placements[i];
                ret->placements[i] = (Placement) {
                        .axis = p->axis,
                        .kind = streq(p->kind, "replicate") ? PLACEMENT_REPLICATE
                                                            : PLACEMENT_SHARD,
                        .dim = p->dim,
                };
        }
        ret->n_placements = pb->n_placements;
        return 0;
}

int codec_model_decode(Arena *a, Familyd__V1__ModelBoundary *const *pb, size_t n,
                       ModelBoundary **ret, size_t *ret_n, FamilyError *ret_error) {
        ModelBoundary *b = NULL;
        int r;

        if (!ARRAY_NEW(a, b, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const Familyd__V1__ModelBoundary *m = pb[i];

                for (size_t j = 0; j < m->n_fqns; j++) {
                        r = codec_check_length(m->fqns[j], FAMILYD_MAX_NAME_LENGTH * 4, "fqns",
                                               ret_error);
                        if (r < 0)
                                return r;
                }
                r = codec_check_length(m->build_id, FAMILYD_MAX_NAME_LENGTH, "build_id",
                                       ret_error);
                if (r < 0)
                        return r;
                b[i].fqns = m->fqns;
                b[i].n_fqns = m->n_fqns;
                b[i].build_id = m->build_id;
                if (m->applied_layout) {
                        const Familyd__V1__Layout *l = m->applied_layout;
                        b[i].has_layout = true;
                        b[i].layout.mesh_id = l->mesh_id;
                        if (!ARRAY_NEW(a, b[i].layout.parameters, l->n_parameters))
                                return -ENOMEM;
                        for (size_t j = 0; j < l->n_parameters; j++) {
                                r = validate_parameter_decode(a, l->parameters[j],
                                                              &b[i].layout.parameters[j],
                                                              ret_error);
                                if (r < 0)
                                        return r;
                        }
                        b[i].layout.n_parameters = l->n_parameters;
                        if (l->activations) {
                                r = codec_activation_layout_decode(a, l->activations,
                                                                   &b[i].layout.activations, ret_error);
                                if (r < 0)
                                        return r;
                                b[i].layout.has_activations = true;
                        }
                }
        }
        *ret = b;
        *ret_n = n;
        return 0;
}

int codec_shared_parameters_decode(Arena *a, Familyd__V1__SharedParameter *const *pb, size_t n,
                                   SharedParameter **ret, size_t *ret_n,
                                   FamilyError *ret_error) {
        SharedParameter *s = NULL;
        int r;

        /* Bounded before decoding; the rest of the checks are Validate's own. */
        if (n > FAMILYD_MAX_SHARED_PARAMETERS)
                return validate_shared_check(NULL, n, ret_error);
        if (!ARRAY_NEW(a, s, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                const Familyd__V1__SharedParameter *p = pb[i];
                if (!ARRAY_NEW(a, s[i].uses, p->n_uses))
                        return -ENOMEM;
                for (size_t j = 0; j < p->n_uses; j++)
                        s[i].uses[j] = (SharedParameterUse) {
                                .fqn = p->uses[j]->fqn,
                                .build_id = p->uses[j]->build_id,
                                .parameter = p->uses[j]->parameter,
                        };
                s[i].n_uses = p->n_uses;
        }
        r = validate_shared_check(s, n, ret_error);
        if (r < 0)
                return r;
        *ret = s;
        *ret_n = n;
        return 0;
}

int codec_build_progress_encode(Arena *a, const CodecBuildProgress *p,
                                Familyd__V1__BuildProgress **ret) {
        static const Familyd__V1__BuildProgressState states[_CODEC_BUILD_PROGRESS_MAX] = {
                [CODEC_BUILD_PROGRESS_FILLING] = FAMILYD__V1__BUILD_PROGRESS_STATE__BUILD_PROGRESS_STATE_FILLING,
                [CODEC_BUILD_PROGRESS_DONE] = FAMILYD__V1__BUILD_PROGRESS_STATE__BUILD_PROGRESS_STATE_DONE,
                [CODEC_BUILD_PROGRESS_FAILED] = FAMILYD__V1__BUILD_PROGRESS_STATE__BUILD_PROGRESS_STATE_FAILED,
        };
        Familyd__V1__BuildProgress *pb = MSG_NEW(a, Familyd__V1__BuildProgress,
                                                 familyd__v1__build_progress__init);

        if (p->state < 0 || p->state >= _CODEC_BUILD_PROGRESS_MAX)
                return -EINVAL;
        if (!pb || !(pb->build_id = arena_strdup(a, strempty(p->build_id))) ||
            !(pb->progress_tag = arena_strdup(a, strempty(p->progress_tag))) ||
            !(pb->family = arena_strdup(a, strempty(p->family))) ||
            !(pb->error = arena_strdup(a, strempty(p->error))))
                return -ENOMEM;
        pb->state = states[p->state];
        pb->bytes_filled = p->bytes_filled;
        pb->bytes_total = p->bytes_total;
        pb->bytes_read = p->bytes_read;
        pb->bytes_to_read = p->bytes_to_read;
        pb->bytes_per_second = p->bytes_per_second;
        pb->elapsed_ms = p->elapsed_ms;
        pb->started_unix_ms = p->started_unix_ms;
        *ret = pb;
        return 0;
}

int codec_build_progress_list_encode(Arena *a, const CodecBuildProgress *list, size_t n,
                                     Familyd__V1__BuildProgress ***ret) {
        Familyd__V1__BuildProgress **pbs = NULL;
        int r;

        if (n > 0 && !ARRAY_NEW(a, pbs, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                r = codec_build_progress_encode(a, &list[i], &pbs[i]);
                if (r < 0)
                        return r;
        }
        *ret = pbs;
        return 0;
}

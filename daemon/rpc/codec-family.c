/* codec-family.c: the FamilyService messages: Family, JobContext, ResolveRequest, ResolvedFamily. */
#include "codec.h"
#include "resource-limits.h"



static int typed_field_encode(const TypedField *t, Familyd__V1__TypedField **ret) {
        Familyd__V1__TypedField *pb = MSG_NEW(Familyd__V1__TypedField, familyd__v1__typed_field__init);
        if (!pb)
                return -ENOMEM;
        *ret = pb;

        pb->name = codec_strdup(t->name);
        pb->type = codec_strdup(field_type_to_string(t->type));
        if (!pb->name || !pb->type)
                return -ENOMEM;
        if (t->default_value.kind != VALUE_NONE)
                return codec_value_encode(&t->default_value, &pb->default_);
        return 0;
}

static int typed_fields_encode(const TypedField *fields, size_t n, Familyd__V1__TypedField ***ret,
                               size_t *ret_n) {
        if (!ARRAY_NEW(*ret, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                int r = typed_field_encode(&fields[i], &(*ret)[i]);
                if ((*ret)[i])
                        (*ret_n)++;
                if (r < 0)
                        return r;
        }
        return 0;
}

static int placement_encode(const Placement *p, Familyd__V1__Placement **ret) {
        Familyd__V1__Placement *pb = MSG_NEW(Familyd__V1__Placement, familyd__v1__placement__init);
        if (!pb)
                return -ENOMEM;
        *ret = pb;

        pb->axis = codec_strdup(p->axis);
        pb->kind = codec_strdup(placement_kind_to_string(p->kind));
        pb->dim = p->kind == PLACEMENT_SHARD ? p->dim : 0;
        return pb->axis && pb->kind ? 0 : -ENOMEM;
}

static int parameter_encode(const ParameterSpec *p, Familyd__V1__ParameterSpec **ret) {
        Familyd__V1__ParameterSpec *pb =
                MSG_NEW(Familyd__V1__ParameterSpec, familyd__v1__parameter_spec__init);
        if (!pb)
                return -ENOMEM;
        *ret = pb;

        pb->name = codec_strdup(p->name);
        pb->init = codec_strdup(p->init_text);
        if (!pb->name || !pb->init)
                return -ENOMEM;

        if (!ARRAY_NEW(pb->shape, p->n_dims))
                return -ENOMEM;
        for (size_t i = 0; i < p->n_dims; i++) {
                pb->shape[i] = expr_to_string(p->shape[i]);
                if (!pb->shape[i])
                        return -ENOMEM;
                pb->n_shape++;
        }

        if (!ARRAY_NEW(pb->placements, p->n_placements))
                return -ENOMEM;
        for (size_t i = 0; i < p->n_placements; i++) {
                int r = placement_encode(&p->placements[i], &pb->placements[i]);
                if (pb->placements[i])
                        pb->n_placements++;
                if (r < 0)
                        return r;
        }
        return 0;
}

static int parameters_encode(const ParameterSpec *params, size_t n,
                             Familyd__V1__ParameterSpec ***ret, size_t *ret_n) {
        if (!ARRAY_NEW(*ret, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                int r = parameter_encode(&params[i], &(*ret)[i]);
                if ((*ret)[i])
                        (*ret_n)++;
                if (r < 0)
                        return r;
        }
        return 0;
}

static int requirement_encode(const Requirement *q, Familyd__V1__Variant__RequiresEntry **ret) {
        Familyd__V1__Variant__RequiresEntry *pb = MSG_NEW(Familyd__V1__Variant__RequiresEntry,
                                                          familyd__v1__variant__requires_entry__init);
        if (!pb)
                return -ENOMEM;
        *ret = pb;

        pb->key = codec_strdup(axis_to_string(q->axis));
        pb->value = MSG_NEW(Familyd__V1__ValueList, familyd__v1__value_list__init);
        if (!pb->key || !pb->value)
                return -ENOMEM;
        if (!ARRAY_NEW(pb->value->values, q->n_values))
                return -ENOMEM;
        for (size_t i = 0; i < q->n_values; i++) {
                Value v = { .kind = VALUE_INT, .i = q->values[i] };
                int r = codec_value_encode(&v, &pb->value->values[i]);
                if (r < 0)
                        return r;
                pb->value->n_values++;
        }
        return 0;
}

static int variant_encode(const Variant *v, Familyd__V1__Variant **ret) {
        Familyd__V1__Variant *pb = MSG_NEW(Familyd__V1__Variant, familyd__v1__variant__init);
        int r;

        if (!pb)
                return -ENOMEM;
        *ret = pb;

        pb->name = codec_strdup(v->name);
        pb->constructor = codec_strdup(v->constructor);
        if (!pb->name || !pb->constructor)
                return -ENOMEM;

        if (!ARRAY_NEW(pb->accepts, v->n_accepts))
                return -ENOMEM;
        for (size_t i = 0; i < v->n_accepts; i++) {
                pb->accepts[i] = codec_strdup(v->accepts[i]);
                if (!pb->accepts[i])
                        return -ENOMEM;
                pb->n_accepts++;
        }

        if (!ARRAY_NEW(pb->requires, v->n_requires))
                return -ENOMEM;
        for (size_t i = 0; i < v->n_requires; i++) {
                r = requirement_encode(&v->requires[i], &pb->requires[i]);
                if (pb->requires[i])
                        pb->n_requires++;
                if (r < 0)
                        return r;
        }

        if (v->has_parameters)
                return parameters_encode(v->parameters, v->n_parameters, &pb->parameters,
                                         &pb->n_parameters);
        return 0;
}

static int rule_encode(const Rule *rule, Familyd__V1__Rule **ret) {
        _cleanup_(value_map_done) ValueMap when = {};
        Familyd__V1__Rule *pb = MSG_NEW(Familyd__V1__Rule, familyd__v1__rule__init);
        int r;

        if (!pb)
                return -ENOMEM;
        *ret = pb;

        for (size_t i = 0; i < rule->n_when; i++) {
                Value v;
                r = value_copy(&rule->when[i].value, &v);
                if (r < 0)
                        return r;
                r = value_map_put(&when, rule->when[i].key, &v);
                if (r < 0) {
                        value_done(&v);
                        return r;
                }
        }
        r = codec_value_map_encode(&when, &familyd__v1__rule__when_entry__descriptor,
                                   (void ***) &pb->when, &pb->n_when);
        if (r < 0)
                return r;

        char *text = codec_strdup(rule->text);
        if (!text)
                return -ENOMEM;
        switch (rule->outcome) {
        case RULE_OUTCOME_VARIANT:
                pb->outcome_case = FAMILYD__V1__RULE__OUTCOME_VARIANT;
                pb->variant = text;
                break;
        case RULE_OUTCOME_ERROR:
                pb->outcome_case = FAMILYD__V1__RULE__OUTCOME_ERROR;
                pb->error = text;
                break;
        default:
                pb->outcome_case = FAMILYD__V1__RULE__OUTCOME_UNSUPPORTED;
                pb->unsupported = text;
                break;
        }
        return 0;
}

static int family_encode_into(const Family *f, Familyd__V1__Family *pb) {
        int r;

        pb->name = codec_strdup(f->name);
        pb->baseline = codec_strdup(f->baseline);
        pb->default_variant = codec_strdup(f->default_variant);
        pb->parallel_axis = codec_strdup(axis_to_string(f->parallel_axis));
        pb->source = codec_strdup(f->source);
        if (!pb->name || !pb->baseline || !pb->default_variant || !pb->parallel_axis ||
            !pb->source)
                return -ENOMEM;

        r = typed_fields_encode(f->selectors, f->n_selectors, &pb->selectors, &pb->n_selectors);
        if (r < 0)
                return r;
        r = typed_fields_encode(f->arguments, f->n_arguments, &pb->arguments, &pb->n_arguments);
        if (r < 0)
                return r;

        if (!ARRAY_NEW(pb->variants, f->n_variants))
                return -ENOMEM;
        for (size_t i = 0; i < f->n_variants; i++) {
                r = variant_encode(&f->variants[i], &pb->variants[i]);
                if (pb->variants[i])
                        pb->n_variants++;
                if (r < 0)
                        return r;
        }

        if (!ARRAY_NEW(pb->rules, f->n_rules))
                return -ENOMEM;
        for (size_t i = 0; i < f->n_rules; i++) {
                r = rule_encode(&f->rules[i], &pb->rules[i]);
                if (pb->rules[i])
                        pb->n_rules++;
                if (r < 0)
                        return r;
        }

        return parameters_encode(f->parameters, f->n_parameters, &pb->parameters,
                                 &pb->n_parameters);
}

int codec_family_encode(const Family *f, Familyd__V1__Family **ret) {
        Familyd__V1__Family *pb = MSG_NEW(Familyd__V1__Family, familyd__v1__family__init);
        if (!pb)
                return -ENOMEM;

        int r = family_encode_into(f, pb);
        if (r < 0) {
                protobuf_c_message_free_unpacked(&pb->base, NULL);
                return r;
        }
        *ret = pb;
        return 0;
}

int codec_job_context_decode(const Familyd__V1__JobContext *pb, JobContext *ret,
                             FamilyError *ret_error) {
        JobContext c = {};

        if (pb) {
                c.has_size[AXIS_TP] = pb->_tp_size_case == FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
                c.size[AXIS_TP] = pb->tp_size;
                c.has_size[AXIS_CP] = pb->_cp_size_case == FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
                c.size[AXIS_CP] = pb->cp_size;
                c.has_size[AXIS_EP] = pb->_ep_size_case == FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                c.size[AXIS_EP] = pb->ep_size;
                c.has_size[AXIS_PP] = pb->_pp_size_case == FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
                c.size[AXIS_PP] = pb->pp_size;
                c.active[AXIS_TP] = pb->tp;
                c.active[AXIS_CP] = pb->cp;
                c.active[AXIS_EP] = pb->ep;
                c.active[AXIS_PP] = pb->pp;
                c.sequence_parallel = pb->sequence_parallel;
                c.loss_parallel = pb->loss_parallel;
                for (Axis a = 0; a < _AXIS_MAX; a++)
                        if (!c.has_size[a])
                                c.size[a] = 0;

                if (!isempty(pb->mesh_id)) {
                        if (strlen(pb->mesh_id) > FAMILYD_MAX_NAME_LENGTH)
                                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                        "LIMIT", "mesh_id",
                                                        "mesh_id is longer than %u bytes",
                                                        FAMILYD_MAX_NAME_LENGTH);
                        c.mesh_id = strdup(pb->mesh_id);
                        if (!c.mesh_id)
                                return -ENOMEM;
                }
        }

        *ret = c;
        return 0;
}

int codec_resolve_request_decode(const Familyd__V1__ResolveRequest *pb, ResolveRequest *ret,
                                 FamilyError *ret_error) {
        _cleanup_(resolve_request_done) ResolveRequest req = {};
        int r;

        if (strlen(pb->family) > FAMILYD_MAX_NAME_LENGTH * 4)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                        "family", "family is longer than %u bytes",
                                        FAMILYD_MAX_NAME_LENGTH * 4);
        req.family = strdup(pb->family);
        if (!req.family)
                return -ENOMEM;

        r = codec_value_map_decode((void *const *) pb->arguments, pb->n_arguments, "arguments",
                                   &req.arguments, ret_error);
        if (r < 0)
                return r;

        r = codec_job_context_decode(pb->context, &req.context, ret_error);
        if (r < 0)
                return r;

        *ret = req;
        req = (ResolveRequest) {};
        return 0;
}

int codec_resolved_family_encode(const ResolvedFamily *res, Familyd__V1__ResolvedFamily **ret) {
        Familyd__V1__ResolvedFamily *pb =
                MSG_NEW(Familyd__V1__ResolvedFamily, familyd__v1__resolved_family__init);
        int r = -ENOMEM;

        if (!pb)
                return -ENOMEM;

        pb->family = codec_strdup(res->family);
        pb->variant = codec_strdup(res->variant);
        pb->constructor = codec_strdup(res->constructor);
        if (!pb->family || !pb->variant || !pb->constructor)
                goto fail;

        r = codec_value_map_encode(&res->arguments,
                                   &familyd__v1__resolved_family__arguments_entry__descriptor,
                                   (void ***) &pb->arguments, &pb->n_arguments);
        if (r < 0)
                goto fail;
        r = codec_value_map_encode(&res->selectors,
                                   &familyd__v1__resolved_family__selectors_entry__descriptor,
                                   (void ***) &pb->selectors, &pb->n_selectors);
        if (r < 0)
                goto fail;

        r = -ENOMEM;
        pb->axis_sizes = calloc(_AXIS_MAX, sizeof(*pb->axis_sizes));
        if (!pb->axis_sizes)
                goto fail;
        for (Axis a = 0; a < _AXIS_MAX; a++) {
                Familyd__V1__ResolvedFamily__AxisSizesEntry *e =
                        MSG_NEW(Familyd__V1__ResolvedFamily__AxisSizesEntry,
                                familyd__v1__resolved_family__axis_sizes_entry__init);
                if (!e)
                        goto fail;
                pb->axis_sizes[pb->n_axis_sizes++] = e;
                e->key = codec_strdup(axis_to_string(a));
                if (!e->key)
                        goto fail;
                e->value = res->axis_size[a];
        }

        *ret = pb;
        return 0;
fail:
        protobuf_c_message_free_unpacked(&pb->base, NULL);
        return r;
}

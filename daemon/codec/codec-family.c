/* codec-family.c: the FamilyService messages: Family, JobContext, ResolveRequest, ResolvedFamily. */
#include "codec.h"
#include "core/resource-limits.h"



static int typed_fields_encode(Arena *a, const TypedField *fields, size_t n,
                               Familyd__V1__TypedField ***ret, size_t *ret_n) {
        if (!ARRAY_NEW(a, *ret, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                Familyd__V1__TypedField *pb = MSG_NEW(a, Familyd__V1__TypedField,
                                                      familyd__v1__typed_field__init);
                if (!pb)
                        return -ENOMEM;
                pb->name = arena_strdup(a, fields[i].name);
                pb->type = arena_strdup(a, field_type_to_string(fields[i].type));
                if (!pb->name || !pb->type)
                        return -ENOMEM;
                if (fields[i].default_value.kind != VALUE_NONE) {
                        int r = codec_value_encode(a, &fields[i].default_value, &pb->default_);
                        if (r < 0)
                                return r;
                }
                (*ret)[i] = pb;
        }
        *ret_n = n;
        return 0;
}

/* A placement that depends on the job: kind "cases", dim 0, and each case. */
static int placement_cases_encode(Arena *a, const PlacementCases *c, Familyd__V1__Placement *e) {
        e->kind = (char *) "cases";
        e->dim = 0;
        if (!ARRAY_NEW(a, e->cases, c->n))
                return -ENOMEM;
        for (size_t i = 0; i < c->n; i++) {
                const PlacementCase *pc = &c->items[i];
                Familyd__V1__PlacementCase *x =
                        MSG_NEW(a, Familyd__V1__PlacementCase, familyd__v1__placement_case__init);
                _cleanup_free_ char *when = pc->when ? expr_to_string(pc->when) : strdup("");

                if (!x || !when)
                        return -ENOMEM;
                x->when = arena_strdup(a, when);
                x->kind = arena_strdup(a, pc->none ? "none" : placement_kind_to_string(pc->kind));
                if (!x->when || !x->kind)
                        return -ENOMEM;
                x->dim = !pc->none && pc->kind == PLACEMENT_SHARD ? pc->dim : 0;
                e->cases[i] = x;
        }
        e->n_cases = c->n;
        return 0;
}

static int parameter_encode(Arena *a, const ParameterSpec *p, Familyd__V1__ParameterSpec **ret) {
        int r;
        Familyd__V1__ParameterSpec *pb =
                MSG_NEW(a, Familyd__V1__ParameterSpec, familyd__v1__parameter_spec__init);
        if (!pb)
                return -ENOMEM;

        pb->name = arena_strdup(a, p->name);
        pb->init = arena_strdup(a, p->init_text);
        pb->dtype = arena_strdup(a, strempty(p->dtype));
        pb->checkpoint = arena_strdup(a, p->has_checkpoint ? p->checkpoint.text : "");
        if (!pb->name || !pb->init || !pb->dtype || !pb->checkpoint)
                return -ENOMEM;

        if (!ARRAY_NEW(a, pb->shape, p->n_dims))
                return -ENOMEM;
        for (size_t i = 0; i < p->n_dims; i++) {
                _cleanup_free_ char *text = expr_to_string(p->shape[i]);
                pb->shape[i] = text ? arena_strdup(a, text) : NULL;
                if (!pb->shape[i])
                        return -ENOMEM;
        }
        pb->n_shape = p->n_dims;

        if (!ARRAY_NEW(a, pb->placements, p->n_placements))
                return -ENOMEM;
        for (size_t i = 0; i < p->n_placements; i++) {
                const Placement *pl = &p->placements[i];
                Familyd__V1__Placement *e =
                        MSG_NEW(a, Familyd__V1__Placement, familyd__v1__placement__init);
                if (!e)
                        return -ENOMEM;
                e->axis = arena_strdup(a, pl->axis);
                e->kind = arena_strdup(a, placement_kind_to_string(pl->kind));
                if (!e->axis || !e->kind)
                        return -ENOMEM;
                e->dim = pl->kind == PLACEMENT_SHARD ? pl->dim : 0;
                if (p->placement_cases && p->placement_cases[i].n > 0) {
                        r = placement_cases_encode(a, &p->placement_cases[i], e);
                        if (r < 0)
                                return r;
                }
                pb->placements[i] = e;
        }
        pb->n_placements = p->n_placements;

        *ret = pb;
        return 0;
}

static int parameters_encode(Arena *a, const ParameterSpec *params, size_t n,
                             Familyd__V1__ParameterSpec ***ret, size_t *ret_n) {
        if (!ARRAY_NEW(a, *ret, n))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                int r = parameter_encode(a, &params[i], &(*ret)[i]);
                if (r < 0)
                        return r;
        }
        *ret_n = n;
        return 0;
}

static int requirement_encode(Arena *a, const Requirement *q,
                              Familyd__V1__Variant__RequiresEntry **ret) {
        Familyd__V1__Variant__RequiresEntry *pb = MSG_NEW(
                a, Familyd__V1__Variant__RequiresEntry, familyd__v1__variant__requires_entry__init);
        if (!pb)
                return -ENOMEM;

        pb->key = arena_strdup(a, axis_to_string(q->axis));
        pb->value = MSG_NEW(a, Familyd__V1__ValueList, familyd__v1__value_list__init);
        if (!pb->key || !pb->value || !ARRAY_NEW(a, pb->value->values, q->n_values))
                return -ENOMEM;
        for (size_t i = 0; i < q->n_values; i++) {
                Value v = { .kind = VALUE_INT, .i = q->values[i] };
                int r = codec_value_encode(a, &v, &pb->value->values[i]);
                if (r < 0)
                        return r;
        }
        pb->value->n_values = q->n_values;

        *ret = pb;
        return 0;
}

/* A job flag's requirement: its name -> a list of the one bool it must be. */
static int flag_requirement_encode(Arena *a, JobFlag f, bool value,
                                   Familyd__V1__Variant__RequiresEntry **ret) {
        Familyd__V1__Variant__RequiresEntry *pb = MSG_NEW(
                a, Familyd__V1__Variant__RequiresEntry, familyd__v1__variant__requires_entry__init);
        Value v = { .kind = VALUE_BOOL, .b = value };
        int r;

        if (!pb)
                return -ENOMEM;
        pb->key = arena_strdup(a, job_flag_to_string(f));
        pb->value = MSG_NEW(a, Familyd__V1__ValueList, familyd__v1__value_list__init);
        if (!pb->key || !pb->value || !ARRAY_NEW(a, pb->value->values, 1))
                return -ENOMEM;
        r = codec_value_encode(a, &v, &pb->value->values[0]);
        if (r < 0)
                return r;
        pb->value->n_values = 1;

        *ret = pb;
        return 0;
}

static int variant_encode(Arena *a, const Variant *v, Familyd__V1__Variant **ret) {
        Familyd__V1__Variant *pb = MSG_NEW(a, Familyd__V1__Variant, familyd__v1__variant__init);
        int r;

        if (!pb)
                return -ENOMEM;
        pb->name = arena_strdup(a, v->name);
        pb->constructor = arena_strdup(a, v->constructor);
        if (!pb->name || !pb->constructor)
                return -ENOMEM;

        if (!ARRAY_NEW(a, pb->accepts, v->n_accepts))
                return -ENOMEM;
        for (size_t i = 0; i < v->n_accepts; i++) {
                pb->accepts[i] = arena_strdup(a, v->accepts[i]);
                if (!pb->accepts[i])
                        return -ENOMEM;
        }
        pb->n_accepts = v->n_accepts;

        size_t n_flags = 0;
        for (JobFlag f = 0; f < _JOB_FLAG_MAX; f++)
                n_flags += v->requires_flag[f];
        if (!ARRAY_NEW(a, pb->requires, v->n_requires + n_flags))
                return -ENOMEM;
        for (size_t i = 0; i < v->n_requires; i++) {
                r = requirement_encode(a, &v->requires[i], &pb->requires[i]);
                if (r < 0)
                        return r;
        }
        pb->n_requires = v->n_requires;
        for (JobFlag f = 0; f < _JOB_FLAG_MAX; f++)
                if (v->requires_flag[f]) {
                        r = flag_requirement_encode(a, f, v->required_value[f], &pb->requires[pb->n_requires]);
                        if (r < 0)
                                return r;
                        pb->n_requires++;
                }

        if (v->has_parameters) {
                r = parameters_encode(a, v->parameters, v->n_parameters, &pb->parameters,
                                      &pb->n_parameters);
                if (r < 0)
                        return r;
        }

        *ret = pb;
        return 0;
}

static int rule_encode(Arena *a, const Rule *rule, Familyd__V1__Rule **ret) {
        Familyd__V1__Rule *pb = MSG_NEW(a, Familyd__V1__Rule, familyd__v1__rule__init);
        if (!pb || !ARRAY_NEW(a, pb->when, rule->n_when))
                return -ENOMEM;

        /* Conditions are unique by key (the loader refuses duplicates), in file order. */
        for (size_t i = 0; i < rule->n_when; i++) {
                Familyd__V1__Rule__WhenEntry *e = MSG_NEW(a, Familyd__V1__Rule__WhenEntry,
                                                          familyd__v1__rule__when_entry__init);
                if (!e)
                        return -ENOMEM;
                e->key = arena_strdup(a, rule->when[i].key);
                if (!e->key)
                        return -ENOMEM;
                int r = codec_value_encode(a, &rule->when[i].value, &e->value);
                if (r < 0)
                        return r;
                pb->when[i] = e;
        }
        pb->n_when = rule->n_when;

        char *text = arena_strdup(a, rule->text);
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

        *ret = pb;
        return 0;
}

int codec_family_encode(Arena *a, const Family *f, Familyd__V1__Family **ret) {
        Familyd__V1__Family *pb = MSG_NEW(a, Familyd__V1__Family, familyd__v1__family__init);
        int r;

        if (!pb)
                return -ENOMEM;
        pb->name = arena_strdup(a, f->name);
        pb->baseline = arena_strdup(a, f->baseline);
        pb->default_variant = arena_strdup(a, f->default_variant);
        pb->parallel_axis = arena_strdup(a, axis_to_string(f->parallel_axis));
        pb->source = arena_strdup(a, f->source);
        if (!pb->name || !pb->baseline || !pb->default_variant || !pb->parallel_axis ||
            !pb->source)
                return -ENOMEM;

        r = typed_fields_encode(a, f->selectors, f->n_selectors, &pb->selectors,
                                &pb->n_selectors);
        if (r < 0)
                return r;
        r = typed_fields_encode(a, f->arguments, f->n_arguments, &pb->arguments,
                                &pb->n_arguments);
        if (r < 0)
                return r;

        if (!ARRAY_NEW(a, pb->variants, f->n_variants))
                return -ENOMEM;
        for (size_t i = 0; i < f->n_variants; i++) {
                r = variant_encode(a, &f->variants[i], &pb->variants[i]);
                if (r < 0)
                        return r;
        }
        pb->n_variants = f->n_variants;

        if (!ARRAY_NEW(a, pb->rules, f->n_rules))
                return -ENOMEM;
        for (size_t i = 0; i < f->n_rules; i++) {
                r = rule_encode(a, &f->rules[i], &pb->rules[i]);
                if (r < 0)
                        return r;
        }
        pb->n_rules = f->n_rules;

        r = parameters_encode(a, f->parameters, f->n_parameters, &pb->parameters,
                              &pb->n_parameters);
        if (r < 0)
                return r;
        if (f->has_layout) {
                r = codec_activation_layout_encode(a, &f->layout, &pb->layout);
                if (r < 0)
                        return r;
        }

        *ret = pb;
        return 0;
}

int codec_activation_layout_encode(Arena *a, const ActivationLayout *l, Familyd__V1__ActivationLayout **ret) {
        Familyd__V1__ActivationLayout *pb =
                MSG_NEW(a, Familyd__V1__ActivationLayout, familyd__v1__activation_layout__init);
        Familyd__V1__Activation ***lists[_ACTIVATION_PLACEMENT_FIELDS];
        size_t *counts[_ACTIVATION_PLACEMENT_FIELDS];

        if (!pb)
                return -ENOMEM;
        lists[ACTIVATION_IN_SRC] = &pb->in_src;
        lists[ACTIVATION_IN_DST] = &pb->in_dst;
        lists[ACTIVATION_OUT_SRC] = &pb->out_src;
        lists[ACTIVATION_OUT_DST] = &pb->out_dst;
        counts[ACTIVATION_IN_SRC] = &pb->n_in_src;
        counts[ACTIVATION_IN_DST] = &pb->n_in_dst;
        counts[ACTIVATION_OUT_SRC] = &pb->n_out_src;
        counts[ACTIVATION_OUT_DST] = &pb->n_out_dst;
        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++) {
                if (!ARRAY_NEW(a, *lists[f], l->n_lists[f]))
                        return -ENOMEM;
                for (size_t i = 0; i < l->n_lists[f]; i++) {
                        const Activation *act = &l->lists[f][i];
                        Familyd__V1__Activation *e =
                                MSG_NEW(a, Familyd__V1__Activation, familyd__v1__activation__init);

                        if (!e || !ARRAY_NEW(a, e->placements, act->n_placements))
                                return -ENOMEM;
                        for (size_t j = 0; j < act->n_placements; j++) {
                                Familyd__V1__Placement *p =
                                        MSG_NEW(a, Familyd__V1__Placement, familyd__v1__placement__init);

                                if (!p || !(p->axis = arena_strdup(a, act->placements[j].axis)) ||
                                    !(p->kind = arena_strdup(a, act->placements[j].kind)))
                                        return -ENOMEM;
                                p->dim = streq(act->placements[j].kind, "shard") ? act->placements[j].dim : 0;
                                e->placements[j] = p;
                        }
                        e->n_placements = act->n_placements;
                        (*lists[f])[i] = e;
                }
                *counts[f] = l->n_lists[f];
        }
        if (!ARRAY_NEW(a, pb->out_names, l->n_out_names))
                return -ENOMEM;
        for (size_t i = 0; i < l->n_out_names; i++)
                if (!(pb->out_names[i] = arena_strdup(a, l->out_names[i])))
                        return -ENOMEM;
        pb->n_out_names = l->n_out_names;
        pb->is_boundary = l->is_boundary;
        *ret = pb;
        return 0;
}

int codec_activation_layout_decode(Arena *a, const Familyd__V1__ActivationLayout *pb, ActivationLayout *ret,
                                   FamilyError *ret_error) {
        Familyd__V1__Activation *const *lists[_ACTIVATION_PLACEMENT_FIELDS] = {
                pb->in_src, pb->in_dst, pb->out_src, pb->out_dst,
        };
        const size_t counts[_ACTIVATION_PLACEMENT_FIELDS] = {
                pb->n_in_src, pb->n_in_dst, pb->n_out_src, pb->n_out_dst,
        };

        *ret = (ActivationLayout) { .is_boundary = pb->is_boundary };
        for (size_t f = 0; f < _ACTIVATION_PLACEMENT_FIELDS; f++) {
                if (counts[f] > FAMILYD_MAX_MESH_DIMS)
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT", "applied_layout",
                                                "an activation layout lists more than %u activations",
                                                FAMILYD_MAX_MESH_DIMS);
                if (!ARRAY_NEW(a, ret->lists[f], counts[f]))
                        return -ENOMEM;
                for (size_t i = 0; i < counts[f]; i++) {
                        const Familyd__V1__Activation *e = lists[f][i];
                        Activation *act = &ret->lists[f][i];

                        if (e->n_placements > FAMILYD_MAX_MESH_DIMS)
                                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT",
                                                        "applied_layout",
                                                        "an activation has more than %u placements",
                                                        FAMILYD_MAX_MESH_DIMS);
                        if (!ARRAY_NEW(a, act->placements, e->n_placements))
                                return -ENOMEM;
                        for (size_t j = 0; j < e->n_placements; j++) {
                                const Familyd__V1__Placement *p = e->placements[j];

                                if (codec_check_length(p->axis, FAMILYD_MAX_NAME_LENGTH, "applied_layout", ret_error) < 0 ||
                                    codec_check_length(p->kind, FAMILYD_MAX_NAME_LENGTH, "applied_layout", ret_error) < 0)
                                        return -EINVAL;
                                act->placements[j] = (ActivationPlacement) {
                                        .axis = p->axis, .kind = p->kind, .dim = p->dim,
                                };
                        }
                        act->n_placements = e->n_placements;
                }
                ret->n_lists[f] = counts[f];
        }
        if (pb->n_out_names > FAMILYD_MAX_MESH_DIMS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "LIMIT", "applied_layout",
                                        "an activation layout names more than %u outputs", FAMILYD_MAX_MESH_DIMS);
        for (size_t i = 0; i < pb->n_out_names; i++)
                if (codec_check_length(pb->out_names[i], FAMILYD_MAX_NAME_LENGTH, "applied_layout", ret_error) < 0)
                        return -EINVAL;
        ret->out_names = pb->out_names;
        ret->n_out_names = pb->n_out_names;
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

int codec_resolved_family_encode(Arena *a, const ResolvedFamily *res,
                                 Familyd__V1__ResolvedFamily **ret) {
        Familyd__V1__ResolvedFamily *pb =
                MSG_NEW(a, Familyd__V1__ResolvedFamily, familyd__v1__resolved_family__init);
        int r;

        if (!pb)
                return -ENOMEM;
        pb->family = arena_strdup(a, res->family);
        pb->variant = arena_strdup(a, res->variant);
        pb->constructor = arena_strdup(a, res->constructor);
        if (!pb->family || !pb->variant || !pb->constructor)
                return -ENOMEM;

        r = codec_value_map_encode(a, &res->arguments,
                                   &familyd__v1__resolved_family__arguments_entry__descriptor,
                                   (void ***) &pb->arguments, &pb->n_arguments);
        if (r < 0)
                return r;
        r = codec_value_map_encode(a, &res->selectors,
                                   &familyd__v1__resolved_family__selectors_entry__descriptor,
                                   (void ***) &pb->selectors, &pb->n_selectors);
        if (r < 0)
                return r;

        if (!ARRAY_NEW(a, pb->axis_sizes, _AXIS_MAX))
                return -ENOMEM;
        for (Axis x = 0; x < _AXIS_MAX; x++) {
                Familyd__V1__ResolvedFamily__AxisSizesEntry *e =
                        MSG_NEW(a, Familyd__V1__ResolvedFamily__AxisSizesEntry,
                                familyd__v1__resolved_family__axis_sizes_entry__init);
                if (!e)
                        return -ENOMEM;
                /* Static names: pack only reads, and the arena never frees piecewise. */
                e->key = (char *) axis_to_string(x);
                e->value = res->axis_size[x];
                pb->axis_sizes[x] = e;
        }
        pb->n_axis_sizes = _AXIS_MAX;
        pb->sequence_parallel = res->flag[JOB_FLAG_SEQUENCE_PARALLEL];
        pb->loss_parallel = res->flag[JOB_FLAG_LOSS_PARALLEL];

        *ret = pb;
        return 0;
}

int codec_job_context_encode(Arena *a, const JobContext *c, Familyd__V1__JobContext **ret) {
        Familyd__V1__JobContext *pb = MSG_NEW(a, Familyd__V1__JobContext,
                                              familyd__v1__job_context__init);
        if (!pb)
                return -ENOMEM;

        if (c->has_size[AXIS_TP]) {
                pb->_tp_size_case = FAMILYD__V1__JOB_CONTEXT___TP_SIZE_TP_SIZE;
                pb->tp_size = c->size[AXIS_TP];
        }
        if (c->has_size[AXIS_CP]) {
                pb->_cp_size_case = FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
                pb->cp_size = c->size[AXIS_CP];
        }
        if (c->has_size[AXIS_EP]) {
                pb->_ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                pb->ep_size = c->size[AXIS_EP];
        }
        if (c->has_size[AXIS_PP]) {
                pb->_pp_size_case = FAMILYD__V1__JOB_CONTEXT___PP_SIZE_PP_SIZE;
                pb->pp_size = c->size[AXIS_PP];
        }
        pb->tp = c->active[AXIS_TP];
        pb->cp = c->active[AXIS_CP];
        pb->ep = c->active[AXIS_EP];
        pb->pp = c->active[AXIS_PP];
        pb->sequence_parallel = c->sequence_parallel;
        pb->loss_parallel = c->loss_parallel;
        pb->mesh_id = arena_strdup(a, c->mesh_id);
        if (!pb->mesh_id)
                return -ENOMEM;

        *ret = pb;
        return 0;
}

/* codec-mesh.c: the MeshService messages: Mesh to MeshSpec, and Mesh and Topology replies. */
#include "codec.h"
#include "core/resource-limits.h"


static int view_decode(Familyd__V1__MeshDim *const *dims, size_t n, const char *what,
                       MeshView *ret, FamilyError *ret_error) {
        MeshView v = {};

        if (n > FAMILYD_MAX_MESH_DIMS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "MESH_INVALID",
                                        what, "%s has more than %u dimensions", what,
                                        FAMILYD_MAX_MESH_DIMS);
        if (n > 0) {
                v.dims = calloc(n, sizeof(MeshDim));
                if (!v.dims)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < n; i++) {
                if (strlen(dims[i]->name) > FAMILYD_MAX_NAME_LENGTH) {
                        for (size_t j = 0; j < v.n; j++)
                                free(v.dims[j].name);
                        free(v.dims);
                        return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT,
                                                "MESH_INVALID", what,
                                                "mesh dimension names must be at most %u bytes",
                                                FAMILYD_MAX_NAME_LENGTH);
                }
                v.dims[i].name = strdup(dims[i]->name);
                if (!v.dims[i].name) {
                        for (size_t j = 0; j < v.n; j++)
                                free(v.dims[j].name);
                        free(v.dims);
                        return -ENOMEM;
                }
                v.dims[i].size = dims[i]->size;
                v.n++;
        }

        *ret = v;
        return 0;
}

int codec_mesh_spec_decode(const Familyd__V1__Mesh *pb, MeshSpec *ret, FamilyError *ret_error) {
        _cleanup_(mesh_spec_done) MeshSpec s = {};
        Familyd__V1__Mesh empty = FAMILYD__V1__MESH__INIT;
        int r;

        if (!pb)
                pb = &empty;

        r = view_decode(pb->device_mesh, pb->n_device_mesh, "device_mesh", &s.device, ret_error);
        if (r < 0)
                return r;
        r = view_decode(pb->expert_mesh, pb->n_expert_mesh, "expert_mesh", &s.expert, ret_error);
        if (r < 0)
                return r;

        s.has_size[AXIS_TP] = pb->_tp_size_case == FAMILYD__V1__MESH___TP_SIZE_TP_SIZE;
        s.size[AXIS_TP] = s.has_size[AXIS_TP] ? pb->tp_size : 0;
        s.has_size[AXIS_CP] = pb->_cp_size_case == FAMILYD__V1__MESH___CP_SIZE_CP_SIZE;
        s.size[AXIS_CP] = s.has_size[AXIS_CP] ? pb->cp_size : 0;
        s.has_size[AXIS_EP] = pb->_ep_size_case == FAMILYD__V1__MESH___EP_SIZE_EP_SIZE;
        s.size[AXIS_EP] = s.has_size[AXIS_EP] ? pb->ep_size : 0;
        s.has_size[AXIS_PP] = pb->_pp_size_case == FAMILYD__V1__MESH___PP_SIZE_PP_SIZE;
        s.size[AXIS_PP] = s.has_size[AXIS_PP] ? pb->pp_size : 0;
        s.sequence_parallel = pb->sequence_parallel;
        s.loss_parallel = pb->loss_parallel;

        if (pb->n_ranks > FAMILYD_MAX_RANKS)
                return family_error_set(ret_error, FAMILY_STATUS_INVALID_ARGUMENT, "MESH_INVALID",
                                        "ranks", "a mesh has at most %u ranks", FAMILYD_MAX_RANKS);
        if (pb->n_ranks > 0) {
                s.ranks = malloc(pb->n_ranks * sizeof(int64_t));
                if (!s.ranks)
                        return -ENOMEM;
                memcpy(s.ranks, pb->ranks, pb->n_ranks * sizeof(int64_t));
                s.n_ranks = pb->n_ranks;
        }

        *ret = s;
        s = (MeshSpec) {};
        return 0;
}

static int view_encode(Arena *a, const MeshView *v, Familyd__V1__MeshDim ***ret, size_t *ret_n) {
        if (!ARRAY_NEW(a, *ret, v->n))
                return -ENOMEM;
        for (size_t i = 0; i < v->n; i++) {
                Familyd__V1__MeshDim *d = MSG_NEW(a, Familyd__V1__MeshDim,
                                                  familyd__v1__mesh_dim__init);
                if (!d)
                        return -ENOMEM;
                d->name = arena_strdup(a, v->dims[i].name);
                if (!d->name)
                        return -ENOMEM;
                d->size = v->dims[i].size;
                (*ret)[i] = d;
        }
        *ret_n = v->n;
        return 0;
}

int codec_mesh_encode(Arena *a, const Mesh *m, Familyd__V1__Mesh **ret) {
        const MeshSpec *s = &m->spec;
        Familyd__V1__Mesh *pb = MSG_NEW(a, Familyd__V1__Mesh, familyd__v1__mesh__init);
        int r;

        if (!pb)
                return -ENOMEM;
        pb->mesh_id = arena_strdup(a, m->id);
        if (!pb->mesh_id)
                return -ENOMEM;
        r = view_encode(a, &s->device, &pb->device_mesh, &pb->n_device_mesh);
        if (r < 0)
                return r;
        r = view_encode(a, &s->expert, &pb->expert_mesh, &pb->n_expert_mesh);
        if (r < 0)
                return r;

        if (s->has_size[AXIS_TP]) {
                pb->_tp_size_case = FAMILYD__V1__MESH___TP_SIZE_TP_SIZE;
                pb->tp_size = s->size[AXIS_TP];
        }
        if (s->has_size[AXIS_CP]) {
                pb->_cp_size_case = FAMILYD__V1__MESH___CP_SIZE_CP_SIZE;
                pb->cp_size = s->size[AXIS_CP];
        }
        if (s->has_size[AXIS_EP]) {
                pb->_ep_size_case = FAMILYD__V1__MESH___EP_SIZE_EP_SIZE;
                pb->ep_size = s->size[AXIS_EP];
        }
        if (s->has_size[AXIS_PP]) {
                pb->_pp_size_case = FAMILYD__V1__MESH___PP_SIZE_PP_SIZE;
                pb->pp_size = s->size[AXIS_PP];
        }
        pb->sequence_parallel = s->sequence_parallel;
        pb->loss_parallel = s->loss_parallel;

        if (!ARRAY_NEW(a, pb->ranks, s->n_ranks))
                return -ENOMEM;
        if (s->n_ranks > 0)
                memcpy(pb->ranks, s->ranks, s->n_ranks * sizeof(int64_t));
        pb->n_ranks = s->n_ranks;

        *ret = pb;
        return 0;
}

int codec_device_encode(Arena *a, const Device *d, Familyd__V1__Device **ret) {
        Familyd__V1__Device *pb = MSG_NEW(a, Familyd__V1__Device, familyd__v1__device__init);
        if (!pb)
                return -ENOMEM;
        pb->local_index = d->local_index;
        pb->kind = arena_strdup(a, d->kind);
        pb->name = arena_strdup(a, d->name);
        pb->uuid = arena_strdup(a, d->uuid);
        pb->pci_bus_id = arena_strdup(a, d->pci_bus_id);
        if (!pb->kind || !pb->name || !pb->uuid || !pb->pci_bus_id)
                return -ENOMEM;
        pb->memory_bytes = d->memory_bytes;
        pb->numa_node = d->numa_node;
        *ret = pb;
        return 0;
}

static int node_encode(Arena *a, const Node *n, Familyd__V1__Node **ret) {
        Familyd__V1__Node *pb = MSG_NEW(a, Familyd__V1__Node, familyd__v1__node__init);
        if (!pb)
                return -ENOMEM;
        pb->name = arena_strdup(a, n->name);
        pb->address = arena_strdup(a, n->address);
        pb->state = arena_strdup(a, node_state_to_string(n->state));
        pb->registry_digest = arena_strdup(a, n->registry_digest);
        if (!pb->name || !pb->address || !pb->state || !pb->registry_digest)
                return -ENOMEM;
        pb->first_rank = n->first_rank;
        pb->last_seen_unix_ms = n->last_seen_unix_ms;
        pb->local = n->local;
        pb->node_rank = n->node_rank;
        if (!ARRAY_NEW(a, pb->devices, n->n_devices))
                return -ENOMEM;
        for (size_t i = 0; i < n->n_devices; i++) {
                int r = codec_device_encode(a, &n->devices[i], &pb->devices[i]);
                if (r < 0)
                        return r;
        }
        pb->n_devices = n->n_devices;
        *ret = pb;
        return 0;
}

int codec_topology_encode(Arena *a, const Topology *t, Familyd__V1__Topology **ret) {
        Familyd__V1__Topology *pb = MSG_NEW(a, Familyd__V1__Topology, familyd__v1__topology__init);
        const Node *local = topology_local_node(t);

        if (!pb)
                return -ENOMEM;
        pb->version = t->version;
        pb->world_size = t->world_size;
        pb->local_node = arena_strdup(a, local ? local->name : "");
        if (!pb->local_node || !ARRAY_NEW(a, pb->nodes, t->n_nodes))
                return -ENOMEM;
        for (size_t i = 0; i < t->n_nodes; i++) {
                int r = node_encode(a, &t->nodes[i], &pb->nodes[i]);
                if (r < 0)
                        return r;
        }
        pb->n_nodes = t->n_nodes;
        *ret = pb;
        return 0;
}

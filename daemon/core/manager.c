/* manager.c: snapshot swaps and the RPC-facing operations composed from the core modules. */
#include <time.h>

#include "manager.h"
#include "resource-limits.h"

static uint64_t now_usec(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

int manager_new(const ManagerParams *params, Manager **ret, LoadDiagnostics *ret_diag) {
        _cleanup_(manager_freep) Manager *m = NULL;
        int r;

        m = calloc(1, sizeof *m);
        if (!m)
                return -ENOMEM;
        (void) pthread_mutex_init(&m->lock, NULL);
        (void) pthread_mutex_init(&m->reload_lock, NULL);
        (void) pthread_mutex_init(&m->hooks_lock, NULL);
        m->started_usec = now_usec();
        m->shm_budget_bytes = params->shm_budget_bytes;
        m->max_builds = params->max_builds;

        m->registry_path = strdup(params->registry_path);
        m->node_name = strdup(params->node_name);
        if (!m->registry_path || !m->node_name)
                return -ENOMEM;

        r = registry_load(m->registry_path, 1, &m->registry, ret_diag);
        if (r < 0)
                return r;

        if (params->n_devices > 0)
                r = topology_new_single(params->node_name, params->node_rank, params->address,
                                        params->devices, params->n_devices, &m->topology);
        else
                r = topology_new_local(params->node_name, params->node_rank, params->address,
                                       params->host_devices > 0 ? params->host_devices : 1, 0,
                                       &m->topology);
        if (r < 0)
                return r;

        r = mesh_table_new(FAMILYD_MAX_MESHES, &m->meshes);
        if (r < 0)
                return r;

        r = build_table_new(params->max_builds, params->shm_budget_bytes, params->boot_tag,
                            &m->builds);
        if (r < 0)
                return r;

        *ret = TAKE_PTR(m);
        return 0;
}

Manager *manager_free(Manager *m) {
        if (!m)
                return NULL;
        /* Builds first: they hold meshes (and count themselves on them). */
        build_table_free(m->builds);
        registry_unref(m->registry);
        topology_unref(m->topology);
        mesh_table_free(m->meshes);
        free(m->registry_path);
        free(m->node_name);
        (void) pthread_mutex_destroy(&m->lock);
        (void) pthread_mutex_destroy(&m->reload_lock);
        (void) pthread_mutex_destroy(&m->hooks_lock);
        return mfree(m);
}

Registry *manager_registry(Manager *m) {
        (void) pthread_mutex_lock(&m->lock);
        Registry *r = registry_ref(m->registry);
        (void) pthread_mutex_unlock(&m->lock);
        return r;
}

Topology *manager_topology(Manager *m) {
        (void) pthread_mutex_lock(&m->lock);
        Topology *t = topology_ref(m->topology);
        (void) pthread_mutex_unlock(&m->lock);
        return t;
}

void manager_set_topology(Manager *m, Topology *t) {
        (void) pthread_mutex_lock(&m->lock);
        Topology *old = m->topology;
        m->topology = topology_ref(t);
        (void) pthread_mutex_unlock(&m->lock);
        topology_unref(old);
        (void) pthread_mutex_lock(&m->hooks_lock);
        if (m->hooks.topology_changed)
                m->hooks.topology_changed(m->hooks.topology_userdata);
        (void) pthread_mutex_unlock(&m->hooks_lock);
}

void manager_set_hooks(Manager *m, const ManagerHooks *hooks) {
        (void) pthread_mutex_lock(&m->hooks_lock);
        m->hooks = hooks ? *hooks : (ManagerHooks) {};
        (void) pthread_mutex_unlock(&m->hooks_lock);
}

int manager_forget_node(Manager *m, const char *node, FamilyError *ret_error) {
        /* Not under hooks_lock: the peer thread, serving this, may publish meanwhile. The
         * forget hook is removed only once no call can arrive. */
        if (m->hooks.forget_node)
                return m->hooks.forget_node(m->hooks.forget_userdata, node, ret_error);

        _cleanup_(topology_unrefp) Topology *t = manager_topology(m);
        const Node *local = topology_local_node(t);
        if (local && streq(local->name, node))
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "NODE_IS_LOCAL", "node",
                                        "node '%s' is this daemon's own node", node);
        return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "NODE_NOT_FOUND", "node",
                                "node '%s' is not in the topology", node);
}

int manager_reload(Manager *m, Registry **ret_registry, LoadDiagnostics *ret_diag) {
        Registry *fresh = NULL, *old;
        int r;

        (void) pthread_mutex_lock(&m->reload_lock);

        /* The generation only moves on success, so it counts registries actually served. */
        (void) pthread_mutex_lock(&m->lock);
        uint64_t generation = m->registry->generation + 1;
        (void) pthread_mutex_unlock(&m->lock);

        r = registry_load(m->registry_path, generation, &fresh, ret_diag);
        if (r < 0) {
                (void) pthread_mutex_unlock(&m->reload_lock);
                return r;
        }

        (void) pthread_mutex_lock(&m->lock);
        old = m->registry;
        m->registry = fresh;
        if (ret_registry)
                *ret_registry = registry_ref(fresh);
        (void) pthread_mutex_unlock(&m->lock);

        (void) pthread_mutex_unlock(&m->reload_lock);
        registry_unref(old);
        return 0;
}

int manager_resolve(Manager *m, const ResolveRequest *req, ResolvedFamily *ret,
                    FamilyError *ret_error) {
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        return resolve_family(reg, m->meshes, req, ret, ret_error);
}

int manager_get_family(Manager *m, const char *target, Registry **ret_registry,
                       const Family **ret, FamilyError *ret_error) {
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        const Family *f;
        int r;

        r = registry_find(reg, target, &f, ret_error);
        if (r < 0)
                return r;

        *ret_registry = TAKE_PTR(reg);
        *ret = f;
        return 0;
}

int manager_create_mesh(Manager *m, const MeshSpec *spec, Mesh **ret, FamilyError *ret_error) {
        _cleanup_(topology_unrefp) Topology *t = manager_topology(m);
        _cleanup_(mesh_unrefp) Mesh *mesh = NULL;
        int r;

        r = mesh_new(spec, t->world_size, &mesh, ret_error);
        if (r < 0)
                return r;

        return mesh_table_add(m->meshes, mesh, ret, ret_error);
}

uint64_t manager_uptime_ms(const Manager *m) {
        return (now_usec() - m->started_usec) / 1000u;
}

uint64_t manager_registry_generation(Manager *m) {
        _cleanup_(registry_unrefp) Registry *reg = manager_registry(m);
        return reg->generation;
}

/* manager.c: snapshot swaps and the RPC-facing operations composed from the core modules. */
#include <stdio.h>
#include <time.h>

#include "manager.h"
#include "resource-limits.h"

static uint64_t now_usec(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static int digest_compute(Manager *m, const Registry *reg, char *ret) {
        if (!m->digest_fn) {
                ret[0] = 0;
                return 0;
        }
        return m->digest_fn(reg, ret);
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
        m->digest_fn = params->registry_digest;

        m->registry_path = strdup(params->registry_path);
        m->node_name = strdup(params->node_name);
        if (!m->registry_path || !m->node_name)
                return -ENOMEM;

        r = registry_load(m->registry_path, 1, &m->registry, ret_diag);
        if (r < 0)
                return r;
        r = digest_compute(m, m->registry, m->registry_digest);
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
        /* Not shared yet: the one place a topology is written after it was built. */
        memcpy(m->topology->nodes[m->topology->local].registry_digest, m->registry_digest,
               sizeof m->registry_digest);

        r = mesh_table_new(FAMILYD_MAX_MESHES, &m->meshes);
        if (r < 0)
                return r;

        r = build_table_new(params->max_builds, params->shm_budget_bytes, params->boot_tag,
                            &m->builds);
        if (r < 0)
                return r;
        build_table_set_uid_limits(m->builds, &params->uid_limits);

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

static void manager_topology_changed(Manager *m) {
        (void) pthread_mutex_lock(&m->hooks_lock);
        if (m->hooks.topology_changed)
                m->hooks.topology_changed(m->hooks.topology_userdata);
        (void) pthread_mutex_unlock(&m->hooks_lock);
}

/*
 * Installs t (a new reference), its local node showing the digest in force: a copy when t's is
 * another (the peer thread built it before a reload; copied outside the lock, checked again).
 * With `expected`, only while that is still the topology in force. True when installed.
 */
static bool manager_install_topology(Manager *m, Topology *t, const Topology *expected) {
        _cleanup_(topology_unrefp) Topology *candidate = topology_ref(t);
        char digest[REGISTRY_DIGEST_LENGTH + 1];

        for (;;) {
                Topology *old = NULL, *copy = NULL;
                bool stale, installed = false;

                (void) pthread_mutex_lock(&m->lock);
                memcpy(digest, m->registry_digest, sizeof digest);
                stale = expected && m->topology != expected;
                const Node *local = topology_local_node(candidate);
                if (!stale && (!local || streq(local->registry_digest, digest))) {
                        old = m->topology;
                        m->topology = TAKE_PTR(candidate);
                        installed = true;
                }
                (void) pthread_mutex_unlock(&m->lock);
                topology_unref(old);
                if (stale || installed)
                        return installed;

                if (topology_with_local_digest(candidate, digest, &copy) < 0) {
                        /* Out of memory: as it is; the peer thread's next one is stamped. */
                        (void) pthread_mutex_lock(&m->lock);
                        stale = expected && m->topology != expected;
                        if (!stale) {
                                old = m->topology;
                                m->topology = TAKE_PTR(candidate);
                        }
                        (void) pthread_mutex_unlock(&m->lock);
                        topology_unref(old);
                        return !stale;
                }
                topology_unref(candidate);
                candidate = copy;
        }
}

void manager_set_topology(Manager *m, Topology *t) {
        (void) manager_install_topology(m, t, NULL);
        manager_topology_changed(m);
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
        char digest[REGISTRY_DIGEST_LENGTH + 1];
        Registry *fresh = NULL, *old;
        bool changed;
        int r;

        (void) pthread_mutex_lock(&m->reload_lock);

        /* The generation only moves on success, so it counts registries actually served. */
        (void) pthread_mutex_lock(&m->lock);
        uint64_t generation = m->registry->generation + 1;
        (void) pthread_mutex_unlock(&m->lock);

        r = registry_load(m->registry_path, generation, &fresh, ret_diag);
        if (r >= 0) {
                r = digest_compute(m, fresh, digest);
                if (r < 0)
                        fresh = registry_unref(fresh);
        }
        if (r < 0) {
                (void) pthread_mutex_unlock(&m->reload_lock);
                return r;
        }

        (void) pthread_mutex_lock(&m->lock);
        old = m->registry;
        m->registry = fresh;
        changed = !streq(m->registry_digest, digest);
        memcpy(m->registry_digest, digest, sizeof digest);
        if (ret_registry)
                *ret_registry = registry_ref(fresh);
        (void) pthread_mutex_unlock(&m->lock);

        /* This node's entry in the topology shows the new digest at once. */
        if (changed) {
                _cleanup_(topology_unrefp) Topology *t = manager_topology(m);
                if (manager_install_topology(m, t, t))
                        manager_topology_changed(m);
        }

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

void manager_registry_digest(Manager *m, char ret[REGISTRY_DIGEST_LENGTH + 1]) {
        (void) pthread_mutex_lock(&m->lock);
        memcpy(ret, m->registry_digest, sizeof m->registry_digest);
        (void) pthread_mutex_unlock(&m->lock);
}

int manager_registry_digest_of(Manager *m, const Registry *reg,
                               char ret[REGISTRY_DIGEST_LENGTH + 1]) {
        char digest[REGISTRY_DIGEST_LENGTH + 1];
        bool current;

        (void) pthread_mutex_lock(&m->lock);
        current = reg == m->registry;
        memcpy(digest, m->registry_digest, sizeof digest);
        (void) pthread_mutex_unlock(&m->lock);
        if (!current)
                return digest_compute(m, reg, ret);
        memcpy(ret, digest, sizeof digest);
        return 0;
}

/* Nodes named in REGISTRY_MISMATCH's text besides this one: it stays under the status
 * message limit with names and digests of the longest allowed (4 * 330 bytes). */
#define AGREEMENT_MAX_LISTED 4u

/* "node 'a' has D, node 'b' has unknown, ..., and N more": this node, then the ones that
 * differ, in node order. */
static char *agreement_list(const Topology *t, const bool *differs, size_t n_differ,
                            const char *local_digest) {
        const Node *local = topology_local_node(t);
        _cleanup_free_ char *text = NULL;
        size_t listed = 0;
        int k;

        k = asprintf(&text, "node '%s' has %s", local ? local->name : "",
                     isempty(local_digest) ? "unknown" : local_digest);
        for (size_t i = 0; k >= 0 && i < t->n_nodes && listed < AGREEMENT_MAX_LISTED; i++) {
                char *more;
                if (!differs[i])
                        continue;
                k = asprintf(&more, "%s, node '%s' has %s", text, t->nodes[i].name,
                             isempty(t->nodes[i].registry_digest) ? "unknown"
                                                                  : t->nodes[i].registry_digest);
                free(text);
                text = k >= 0 ? more : NULL;
                listed++;
        }
        if (k >= 0 && n_differ > listed) {
                char *more;
                k = asprintf(&more, "%s, and %zu more", text, n_differ - listed);
                free(text);
                text = k >= 0 ? more : NULL;
        }
        return k < 0 ? NULL : TAKE_PTR(text);
}

int manager_check_registry_agreement(Manager *m, const Registry *reg, const Topology *t,
                                     const Mesh *mesh, FamilyError *ret_error) {
        char digest[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ bool *differs = NULL;
        _cleanup_free_ char *list = NULL;
        size_t n_differ = 0;
        int r;

        r = manager_registry_digest_of(m, reg, digest);
        if (r < 0)
                return r;
        differs = calloc(t->n_nodes ? t->n_nodes : 1, sizeof(bool));
        if (!differs)
                return -ENOMEM;
        for (size_t i = 0; i < mesh->spec.n_ranks; i++) {
                const Node *n = topology_node_of_rank(t, mesh->spec.ranks[i], NULL);
                size_t at = n ? (size_t) (n - t->nodes) : 0;

                if (!n || n->local || differs[at])
                        continue;
                if (isempty(n->registry_digest) || !streq(n->registry_digest, digest)) {
                        differs[at] = true;
                        n_differ++;
                }
        }
        if (n_differ == 0)
                return 0;

        list = agreement_list(t, differs, n_differ, digest);
        if (!list)
                return -ENOMEM;
        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "REGISTRY_MISMATCH",
                                NULL,
                                "registry differs across the mesh's nodes: %s; reload the "
                                "registries so they agree",
                                list);
}

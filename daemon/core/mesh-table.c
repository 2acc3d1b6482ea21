/* mesh-table.c: the daemon's meshes by id, in creation order, shared by every RPC thread. */
/*
 * DESIGN: one mutex guards the array; it is held for lookups, pointer moves and the n_builds
 * check of remove, never while a mesh is built or freed (meshes are built by mesh_new before
 * add, and the last reference of a removed mesh is dropped after unlocking). The table owns one
 * reference per mesh; every mesh handed out is a new reference, so a caller keeps using a mesh
 * that another thread removes meanwhile. Meshes are few (FAMILYD_MAX_MESHES) and ids are
 * compared linearly, which keeps creation order for free. Hooks (the state adapter's) run
 * under the lock too: they write or remove one small record, and a mesh must not be seen or
 * deleted by another thread before its record exists.
 */
#include <pthread.h>

#include "resource-limits.h"
#include "mesh.h"
#include "repr.h"

struct MeshTable {
        pthread_mutex_t lock;
        Mesh **meshes; /* creation order */
        size_t n;
        size_t allocated;
        size_t max;
        MeshTableHooks hooks;
};

int mesh_table_new(size_t max_meshes, MeshTable **ret) {
        _cleanup_free_ MeshTable *t = NULL;
        int r;

        if (!ret)
                return -EINVAL;

        t = calloc(1, sizeof(MeshTable));
        if (!t)
                return -ENOMEM;
        /* 0 means the compiled-in limit. */
        t->max = max_meshes > 0 ? max_meshes : FAMILYD_MAX_MESHES;
        r = pthread_mutex_init(&t->lock, NULL);
        if (r != 0)
                return -r;

        *ret = TAKE_PTR(t);
        return 0;
}

MeshTable *mesh_table_free(MeshTable *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n; i++)
                mesh_unref(t->meshes[i]);
        free(t->meshes);
        (void) pthread_mutex_destroy(&t->lock);
        return mfree(t);
}

static void unlockp(pthread_mutex_t **l) {
        if (*l)
                (void) pthread_mutex_unlock(*l);
}

/* Locks for the rest of the enclosing scope. */
#define LOCK_GUARD(t)                                                               \
        _cleanup_(unlockp) _unused_ pthread_mutex_t *_guard_ =                      \
                ({ (void) pthread_mutex_lock(&(t)->lock); &(t)->lock; })

static ssize_t find_locked(const MeshTable *t, const char *id) {
        if (!id)
                return -1;
        for (size_t i = 0; i < t->n; i++)
                if (streq(t->meshes[i]->id, id))
                        return (ssize_t) i;
        return -1;
}

int mesh_table_not_found(const char *id, FamilyError *ret_error) {
        _cleanup_free_ char *q = repr_string(strempty(id));
        if (!q)
                return -ENOMEM;
        return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "MESH_NOT_FOUND", "mesh_id",
                                "mesh %s not found", q);
}

int mesh_table_add(MeshTable *t, Mesh *m, Mesh **ret, FamilyError *ret_error) {
        if (!t || !m || !m->id || !ret)
                return -EINVAL;

        LOCK_GUARD(t);

        ssize_t i = find_locked(t, m->id);
        if (i >= 0) {
                /* A 64-bit content hash can collide; never hand out a different mesh for it. */
                if (!mesh_spec_equal(&t->meshes[i]->spec, &m->spec))
                        return family_error_set(ret_error, FAMILY_STATUS_ALREADY_EXISTS, "MESH_ID_COLLISION", "mesh_id",
                                                "a different mesh already has the id '%s'", m->id);
                *ret = mesh_ref(t->meshes[i]);
                return 0;
        }

        if (t->n >= t->max)
                return family_error_set(ret_error, FAMILY_STATUS_RESOURCE_EXHAUSTED, "MESH_LIMIT", NULL,
                                        "mesh limit reached: %zu meshes", t->max);
        if (!GREEDY_REALLOC(t->meshes, t->allocated, t->n + 1))
                return -ENOMEM;
        if (t->hooks.added) {
                int r = t->hooks.added(m, t->hooks.userdata, ret_error);
                if (r < 0)
                        return r;
        }

        t->meshes[t->n++] = mesh_ref(m);
        *ret = mesh_ref(m);
        return 0;
}

void mesh_table_set_hooks(MeshTable *t, const MeshTableHooks *hooks) {
        if (!t)
                return;
        LOCK_GUARD(t);
        t->hooks = hooks ? *hooks : (MeshTableHooks) {};
}

int mesh_table_restore(MeshTable *t, Mesh *m, Mesh **ret) {
        if (!t || !m || !m->id)
                return -EINVAL;

        LOCK_GUARD(t);

        if (find_locked(t, m->id) >= 0)
                return -EEXIST;
        if (!GREEDY_REALLOC(t->meshes, t->allocated, t->n + 1))
                return -ENOMEM;
        t->meshes[t->n++] = mesh_ref(m);
        if (ret)
                *ret = mesh_ref(m);
        return 0;
}

static int get_locked(MeshTable *t, const char *id, bool build, Mesh **ret, FamilyError *ret_error) {
        if (!t || !ret)
                return -EINVAL;

        LOCK_GUARD(t);

        ssize_t i = find_locked(t, id);
        if (i < 0)
                return mesh_table_not_found(id, ret_error);
        if (build)
                atomic_fetch_add_explicit(&t->meshes[i]->n_builds, 1, memory_order_acq_rel);
        *ret = mesh_ref(t->meshes[i]);
        return 0;
}

int mesh_table_get(MeshTable *t, const char *id, Mesh **ret, FamilyError *ret_error) {
        return get_locked(t, id, false, ret, ret_error);
}

int mesh_table_acquire(MeshTable *t, const char *id, Mesh **ret, FamilyError *ret_error) {
        return get_locked(t, id, true, ret, ret_error);
}

int mesh_table_remove(MeshTable *t, const char *id, FamilyError *ret_error) {
        _cleanup_(mesh_unrefp) Mesh *removed = NULL;

        if (!t)
                return -EINVAL;

        {
                LOCK_GUARD(t);

                ssize_t i = find_locked(t, id);
                if (i < 0)
                        return mesh_table_not_found(id, ret_error);

                unsigned n_builds = atomic_load_explicit(&t->meshes[i]->n_builds, memory_order_acquire);
                if (n_builds > 0) {
                        _cleanup_free_ char *q = repr_string(id);
                        if (!q)
                                return -ENOMEM;
                        return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION, "MESH_IN_USE", "mesh_id",
                                                "mesh %s is used by %u builds", q, n_builds);
                }

                removed = t->meshes[i];
                memmove(t->meshes + i, t->meshes + i + 1, (t->n - (size_t) i - 1) * sizeof(Mesh *));
                t->n--;
                if (t->hooks.removed)
                        t->hooks.removed(removed, t->hooks.userdata);
        }

        /* The table's reference is dropped outside the lock (cleanup of removed). */
        return 0;
}

int mesh_table_list(MeshTable *t, Mesh ***ret, size_t *ret_n) {
        _cleanup_free_ Mesh **list = NULL;

        if (!t || !ret || !ret_n)
                return -EINVAL;

        LOCK_GUARD(t);

        /* One extra slot: calloc(0) may return NULL, which would read as OOM. */
        list = calloc(t->n + 1, sizeof(Mesh *));
        if (!list)
                return -ENOMEM;
        for (size_t i = 0; i < t->n; i++)
                list[i] = mesh_ref(t->meshes[i]);

        *ret_n = t->n;
        *ret = TAKE_PTR(list);
        return 0;
}

void mesh_list_free(Mesh **list, size_t n) {
        if (!list)
                return;
        for (size_t i = 0; i < n; i++)
                mesh_unref(list[i]);
        free(list);
}

size_t mesh_table_size(MeshTable *t) {
        if (!t)
                return 0;

        LOCK_GUARD(t);
        return t->n;
}

/* mesh.c: CreateMesh's checks, content-derived mesh ids, and mesh reference counting. */
#include <inttypes.h>
#include <stdio.h>

#include "resource-limits.h"
#include "mesh.h"
#include "repr.h"

#define MESH_INVALID(e, ...) \
        family_error_set((e), FAMILY_STATUS_INVALID_ARGUMENT, "MESH_INVALID", __VA_ARGS__)

static void mesh_view_done(MeshView *v) {
        for (size_t i = 0; i < v->n; i++)
                free(v->dims[i].name);
        free(v->dims);
        *v = (MeshView) {};
}

static int mesh_view_copy(const MeshView *src, MeshView *ret) {
        _cleanup_(mesh_view_done) MeshView v = {};

        if (src->n > 0) {
                v.dims = calloc(src->n, sizeof(MeshDim));
                if (!v.dims)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < src->n; i++) {
                v.dims[i].name = strdup(strempty(src->dims[i].name));
                if (!v.dims[i].name)
                        return -ENOMEM;
                v.dims[i].size = src->dims[i].size;
                v.n++;
        }

        *ret = v;
        v = (MeshView) {};
        return 0;
}

void mesh_spec_done(MeshSpec *s) {
        if (!s)
                return;
        mesh_view_done(&s->device);
        mesh_view_done(&s->expert);
        free(s->ranks);
        *s = (MeshSpec) {};
}

int mesh_spec_copy(const MeshSpec *src, MeshSpec *ret) {
        _cleanup_(mesh_spec_done) MeshSpec s = {};
        int r;

        r = mesh_view_copy(&src->device, &s.device);
        if (r < 0)
                return r;
        r = mesh_view_copy(&src->expert, &s.expert);
        if (r < 0)
                return r;
        if (src->n_ranks > 0) {
                s.ranks = calloc(src->n_ranks, sizeof(int64_t));
                if (!s.ranks)
                        return -ENOMEM;
                memcpy(s.ranks, src->ranks, src->n_ranks * sizeof(int64_t));
                s.n_ranks = src->n_ranks;
        }
        memcpy(s.has_size, src->has_size, sizeof(s.has_size));
        memcpy(s.size, src->size, sizeof(s.size));
        s.sequence_parallel = src->sequence_parallel;
        s.loss_parallel = src->loss_parallel;

        *ret = s;
        s = (MeshSpec) {};
        return 0;
}

const MeshView *mesh_axis_view(const Mesh *m, Axis a) {
        if (a == AXIS_EP && m->spec.expert.n > 0)
                return &m->spec.expert;
        return &m->spec.device;
}

int64_t mesh_view_dim_size(const MeshView *v, const char *name) {
        for (size_t i = 0; i < v->n; i++)
                if (streq_ptr(v->dims[i].name, name))
                        return v->dims[i].size;
        return 0;
}

static bool mesh_view_has(const MeshView *v, const char *name) {
        for (size_t i = 0; i < v->n; i++)
                if (streq_ptr(v->dims[i].name, name))
                        return true;
        return false;
}

typedef struct RankSlot {
        int64_t rank;
        size_t index;
} RankSlot;

static int rank_slot_cmp(const void *a, const void *b) {
        const RankSlot *x = a, *y = b;

        if (x->rank != y->rank)
                return x->rank < y->rank ? -1 : 1;
        return x->index < y->index ? -1 : x->index > y->index;
}

/*
 * Check 1. Every rank is range-checked before any duplicate is looked for (the order of
 * docs/semantics.md). The duplicate named is the one whose second appearance comes first in the
 * list; sorting (rank, index) pairs finds it in O(n log n) whatever the world size.
 */
static int check_ranks(const int64_t *ranks, size_t n, int64_t world_size, FamilyError *e) {
        for (size_t i = 0; i < n; i++)
                if (ranks[i] < 0 || ranks[i] >= world_size)
                        return MESH_INVALID(e, "ranks", "rank %" PRId64 " is not in the topology (world size %" PRId64 ")",
                                            ranks[i], world_size);
        if (n < 2)
                return 0;

        _cleanup_free_ RankSlot *slots = calloc(n, sizeof(RankSlot));
        if (!slots)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                slots[i] = (RankSlot) { .rank = ranks[i], .index = i };
        qsort(slots, n, sizeof(RankSlot), rank_slot_cmp);

        size_t second = SIZE_MAX;
        for (size_t i = 1; i < n; i++)
                /* slots[i] is the second appearance of its rank: indices ascend within a rank. */
                if (slots[i].rank == slots[i - 1].rank && (i < 2 || slots[i - 2].rank != slots[i].rank) &&
                    slots[i].index < second)
                        second = slots[i].index;
        if (second != SIZE_MAX)
                return MESH_INVALID(e, "ranks", "rank %" PRId64 " appears twice", ranks[second]);
        return 0;
}

/* Check 2 for one view: each kind of problem over all dimensions before the next kind. */
static int check_view(const MeshView *v, const char *what, bool required, FamilyError *e) {
        if (v->n == 0) {
                if (required)
                        return MESH_INVALID(e, what, "%s must have at least one dimension", what);
                return 0;
        }
        if (v->n > FAMILYD_MAX_MESH_DIMS)
                return MESH_INVALID(e, what, "%s has %zu dimensions, more than the limit of %u",
                                    what, v->n, FAMILYD_MAX_MESH_DIMS);

        for (size_t i = 0; i < v->n; i++)
                if (isempty(v->dims[i].name))
                        return MESH_INVALID(e, what, "mesh dimension names must be non-empty");
        for (size_t i = 0; i < v->n; i++)
                if (strlen(v->dims[i].name) > FAMILYD_MAX_NAME_LENGTH)
                        return MESH_INVALID(e, what, "mesh dimension names must be at most %u bytes long",
                                            FAMILYD_MAX_NAME_LENGTH);

        for (size_t i = 1; i < v->n; i++)
                for (size_t j = 0; j < i; j++)
                        if (streq(v->dims[i].name, v->dims[j].name)) {
                                _cleanup_free_ char *q = repr_string(v->dims[i].name);
                                if (!q)
                                        return -ENOMEM;
                                return MESH_INVALID(e, v->dims[i].name, "duplicate mesh dimension %s", q);
                        }

        for (size_t i = 0; i < v->n; i++)
                if (v->dims[i].size <= 0) {
                        _cleanup_free_ char *q = repr_string(v->dims[i].name);
                        if (!q)
                                return -ENOMEM;
                        return MESH_INVALID(e, v->dims[i].name, "mesh dimension %s must have a positive size", q);
                }
        return 0;
}

/* Check 3 for one view; sizes are positive by now, so only overflow can go wrong. */
static int check_view_size(const MeshView *v, const char *what, size_t n_ranks, FamilyError *e) {
        int64_t product = 1;

        for (size_t i = 0; i < v->n; i++)
                if (__builtin_mul_overflow(product, v->dims[i].size, &product))
                        return MESH_INVALID(e, what, "%s size overflows a 64-bit integer and does not match %zu ranks",
                                            what, n_ranks);
        if ((uint64_t) product != n_ranks)
                return MESH_INVALID(e, what, "%s size %" PRId64 " does not match %zu ranks", what, product, n_ranks);
        return 0;
}

static const MeshView *spec_axis_view(const MeshSpec *s, Axis a) {
        if (a == AXIS_EP && s->expert.n > 0)
                return &s->expert;
        return &s->device;
}

/* Check 4: declared sizes against the view each axis is read from. */
static int check_declared_sizes(const MeshSpec *s, FamilyError *e) {
        for (Axis a = 0; a < _AXIS_MAX; a++) {
                const char *axis = axis_to_string(a);
                const MeshView *v = spec_axis_view(s, a);
                char field[16];

                if (!s->has_size[a])
                        continue;
                (void) snprintf(field, sizeof field, "%s_size", axis);

                int64_t size = s->size[a];
                if (size < 1)
                        return MESH_INVALID(e, field, "%s_size must be a positive integer", axis);

                if (mesh_view_has(v, axis)) {
                        int64_t actual = mesh_view_dim_size(v, axis);
                        if (size != actual)
                                return MESH_INVALID(e, field, "%s_size=%" PRId64 " disagrees with the mesh size %" PRId64,
                                                    axis, size, actual);
                } else if (size > 1 && a != AXIS_PP) {
                        _cleanup_free_ char **names = calloc(v->n + 1, sizeof(char *));
                        if (!names)
                                return -ENOMEM;
                        for (size_t i = 0; i < v->n; i++)
                                names[i] = v->dims[i].name;
                        _cleanup_free_ char *q = repr_string(axis);
                        _cleanup_free_ char *t = repr_string_tuple(names, v->n);
                        if (!q || !t)
                                return -ENOMEM;
                        return MESH_INVALID(e, field, "%s_size=%" PRId64 " requires an axis named %s; available mesh axes: %s",
                                            axis, size, q, t);
                }
        }
        return 0;
}

/*
 * The canonical serialisation the id is derived from: a version tag, then every field in a fixed
 * order, integers as 8 little-endian bytes and strings length-prefixed, so that no two different
 * meshes serialise alike and the bytes do not depend on the host's endianness or struct layout.
 */
#define FNV64_OFFSET UINT64_C(0xcbf29ce484222325)
#define FNV64_PRIME UINT64_C(0x100000001b3)

static void fnv64_bytes(uint64_t *h, const void *p, size_t n) {
        const unsigned char *b = p;

        for (size_t i = 0; i < n; i++) {
                *h ^= b[i];
                *h *= FNV64_PRIME;
        }
}

static void fnv64_u64(uint64_t *h, uint64_t v) {
        unsigned char b[8];

        for (size_t i = 0; i < 8; i++)
                b[i] = (unsigned char) (v >> (8 * i));
        fnv64_bytes(h, b, sizeof b);
}

static void fnv64_string(uint64_t *h, const char *s) {
        size_t n = strlen(s);

        fnv64_u64(h, n);
        fnv64_bytes(h, s, n);
}

static void fnv64_view(uint64_t *h, const MeshView *v) {
        fnv64_u64(h, v->n);
        for (size_t i = 0; i < v->n; i++) {
                fnv64_string(h, v->dims[i].name);
                fnv64_u64(h, (uint64_t) v->dims[i].size);
        }
}

static uint64_t mesh_spec_hash(const MeshSpec *s) {
        uint64_t h = FNV64_OFFSET;

        fnv64_string(&h, "familyd.mesh.v1");
        fnv64_view(&h, &s->device);
        fnv64_view(&h, &s->expert);
        for (Axis a = 0; a < _AXIS_MAX; a++) {
                /* An absent size and a declared one of any value must differ. */
                fnv64_u64(&h, s->has_size[a]);
                fnv64_u64(&h, s->has_size[a] ? (uint64_t) s->size[a] : 0);
        }
        fnv64_u64(&h, s->sequence_parallel);
        fnv64_u64(&h, s->loss_parallel);
        fnv64_u64(&h, s->n_ranks);
        for (size_t i = 0; i < s->n_ranks; i++)
                fnv64_u64(&h, (uint64_t) s->ranks[i]);
        return h;
}

static Mesh *mesh_free(Mesh *m) {
        if (!m)
                return NULL;
        free(m->id);
        mesh_spec_done(&m->spec);
        return mfree(m);
}

DEFINE_TRIVIAL_CLEANUP_FUNC(Mesh *, mesh_free);

int mesh_new(const MeshSpec *spec, int64_t world_size, Mesh **ret, FamilyError *ret_error) {
        _cleanup_(mesh_freep) Mesh *m = NULL;
        int r;

        if (!spec || !ret)
                return -EINVAL;
        if (world_size < 0)
                world_size = 0;

        /* The limit comes first: the checks below are linear or n log n in the rank count. */
        size_t n_ranks = spec->n_ranks > 0 ? spec->n_ranks : (size_t) world_size;
        if ((uint64_t) n_ranks > FAMILYD_MAX_RANKS)
                return MESH_INVALID(ret_error, "ranks", "mesh has %zu ranks, more than the limit of %u",
                                    n_ranks, FAMILYD_MAX_RANKS);

        r = check_ranks(spec->ranks, spec->n_ranks, world_size, ret_error);
        if (r < 0)
                return r;
        r = check_view(&spec->device, "device_mesh", true, ret_error);
        if (r < 0)
                return r;
        r = check_view(&spec->expert, "expert_mesh", false, ret_error);
        if (r < 0)
                return r;
        r = check_view_size(&spec->device, "device_mesh", n_ranks, ret_error);
        if (r < 0)
                return r;
        if (spec->expert.n > 0) {
                r = check_view_size(&spec->expert, "expert_mesh", n_ranks, ret_error);
                if (r < 0)
                        return r;
        }
        r = check_declared_sizes(spec, ret_error);
        if (r < 0)
                return r;

        m = calloc(1, sizeof(Mesh));
        if (!m)
                return -ENOMEM;
        atomic_init(&m->n_ref, 1);
        atomic_init(&m->n_builds, 0);

        r = mesh_spec_copy(spec, &m->spec);
        if (r < 0)
                return r;
        if (m->spec.n_ranks == 0 && n_ranks > 0) {
                m->spec.ranks = calloc(n_ranks, sizeof(int64_t));
                if (!m->spec.ranks)
                        return -ENOMEM;
                for (size_t i = 0; i < n_ranks; i++)
                        m->spec.ranks[i] = (int64_t) i;
                m->spec.n_ranks = n_ranks;
        }
        /* Undeclared sizes carry no meaning; zero them so that they cannot leak into the id. */
        for (Axis a = 0; a < _AXIS_MAX; a++)
                if (!m->spec.has_size[a])
                        m->spec.size[a] = 0;

        for (Axis a = 0; a < _AXIS_MAX; a++) {
                const MeshView *v = mesh_axis_view(m, a);
                if (m->spec.has_size[a])
                        m->axis_size[a] = m->spec.size[a];
                else if (mesh_view_has(v, axis_to_string(a)))
                        m->axis_size[a] = mesh_view_dim_size(v, axis_to_string(a));
                else
                        m->axis_size[a] = 1;
        }

        if (asprintf(&m->id, "mesh-%016" PRIx64, mesh_spec_hash(&m->spec)) < 0) {
                m->id = NULL;
                return -ENOMEM;
        }

        *ret = TAKE_PTR(m);
        return 0;
}

Mesh *mesh_ref(Mesh *m) {
        if (!m)
                return NULL;
        atomic_fetch_add_explicit(&m->n_ref, 1, memory_order_relaxed);
        return m;
}

Mesh *mesh_unref(Mesh *m) {
        if (!m)
                return NULL;
        /* acq_rel: the last owner must see every write made through the other references. */
        if (atomic_fetch_sub_explicit(&m->n_ref, 1, memory_order_acq_rel) == 1)
                mesh_free(m);
        return NULL;
}

bool mesh_spec_equal(const MeshSpec *a, const MeshSpec *b) {
        const MeshView *va[] = { &a->device, &a->expert }, *vb[] = { &b->device, &b->expert };

        for (size_t k = 0; k < ELEMENTSOF(va); k++) {
                if (va[k]->n != vb[k]->n)
                        return false;
                for (size_t i = 0; i < va[k]->n; i++)
                        if (!streq_ptr(va[k]->dims[i].name, vb[k]->dims[i].name) ||
                            va[k]->dims[i].size != vb[k]->dims[i].size)
                                return false;
        }
        for (Axis x = 0; x < _AXIS_MAX; x++)
                if (a->has_size[x] != b->has_size[x] || (a->has_size[x] && a->size[x] != b->size[x]))
                        return false;
        if (a->sequence_parallel != b->sequence_parallel || a->loss_parallel != b->loss_parallel)
                return false;
        if (a->n_ranks != b->n_ranks)
                return false;
        return a->n_ranks == 0 || memcmp(a->ranks, b->ranks, a->n_ranks * sizeof(int64_t)) == 0;
}

void mesh_build_release(Mesh *m) {
        if (!m)
                return;
        atomic_fetch_sub_explicit(&m->n_builds, 1, memory_order_acq_rel);
}

void mesh_claim(Mesh *m, uint32_t uid) {
        unsigned none = 0;

        (void) atomic_compare_exchange_strong(&m->owner_uid_1, &none, uid + 1u);
}

bool mesh_owner(const Mesh *m, uint32_t *ret_uid) {
        unsigned v = atomic_load(&((Mesh *) m)->owner_uid_1);

        if (v == 0)
                return false;
        *ret_uid = v - 1u;
        return true;
}

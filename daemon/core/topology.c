/* topology.c: the global rank order over nodes, reference counting and rank lookups. */
/*
 * DESIGN: a topology is published on every membership change and read by many threads, so it
 * is built as one allocation: the struct, then its nodes, their devices and every string they
 * point to, measured in one pass and copied in the next. Publishing N members costs two
 * allocations (the block and the sort's order) instead of a few per member and device, and
 * the last topology_unref() frees it with one free().
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "topology.h"

static const char *const node_state_table[_NODE_STATE_MAX] = {
        [NODE_UP] = "up",
        [NODE_SUSPECT] = "suspect",
        [NODE_DOWN] = "down",
};

const char *node_state_to_string(NodeState s) {
        if (s < 0 || s >= _NODE_STATE_MAX)
                return NULL;
        return node_state_table[s];
}

void device_done(Device *d) {
        free(d->kind);
        free(d->name);
        free(d->uuid);
        free(d->pci_bus_id);
        *d = (Device) {};
}

void node_done(Node *n) {
        free(n->name);
        free(n->address);
        for (size_t i = 0; i < n->n_devices; i++)
                device_done(&n->devices[i]);
        free(n->devices);
        *n = (Node) {};
}

bool node_registry_digest_valid(const char *digest) {
        size_t n = 0;

        if (!digest)
                return false;
        for (; digest[n]; n++)
                if (n >= REGISTRY_DIGEST_LENGTH ||
                    !((digest[n] >= '0' && digest[n] <= '9') ||
                      (digest[n] >= 'a' && digest[n] <= 'f')))
                        return false;
        return n == 0 || n == REGISTRY_DIGEST_LENGTH;
}

int device_copy(const Device *from, Device *ret) {
        Device d = {
                .local_index = from->local_index,
                .memory_bytes = from->memory_bytes,
                .numa_node = from->numa_node,
                .kind = strdup(strempty(from->kind)),
                .name = strdup(strempty(from->name)),
                .uuid = strdup(strempty(from->uuid)),
                .pci_bus_id = strdup(strempty(from->pci_bus_id)),
        };

        if (!d.kind || !d.name || !d.uuid || !d.pci_bus_id) {
                device_done(&d);
                return -ENOMEM;
        }
        *ret = d;
        return 0;
}

int node_copy(const Node *from, Node *ret) {
        _cleanup_(node_done) Node n = *from;

        n.name = strdup(strempty(from->name));
        n.address = strdup(strempty(from->address));
        n.devices = calloc(from->n_devices ? from->n_devices : 1, sizeof(Device));
        n.n_devices = 0;
        if (!n.name || !n.address || !n.devices)
                return -ENOMEM;
        for (size_t i = 0; i < from->n_devices; i++) {
                int r = device_copy(&from->devices[i], &n.devices[i]);
                if (r < 0)
                        return r;
                n.n_devices++;
        }
        *ret = n;
        n = (Node) {};
        return 0;
}

/* The block a topology lives in: the struct, its nodes, their devices, their strings. */
typedef struct TopologyLayout {
        size_t nodes;   /* offsets into the block */
        size_t devices;
        size_t strings;
        size_t size;
} TopologyLayout;

/* Places count items of each bytes at the end of a block of *size bytes, aligned. */
static int layout_reserve(size_t *size, size_t count, size_t each, size_t *ret_offset) {
        const size_t align = _Alignof(max_align_t);
        size_t offset, bytes;

        if (__builtin_add_overflow(*size, align - 1, &offset))
                return -ENOMEM;
        offset &= ~(align - 1);
        if (__builtin_mul_overflow(count, each, &bytes) ||
            __builtin_add_overflow(offset, bytes, size))
                return -ENOMEM;
        *ret_offset = offset;
        return 0;
}

static int layout_compute(size_t n_nodes, size_t n_devices, size_t string_bytes,
                          TopologyLayout *ret) {
        TopologyLayout l = { .size = sizeof(Topology) };
        int r;

        r = layout_reserve(&l.size, n_nodes, sizeof(Node), &l.nodes);
        if (r < 0)
                return r;
        r = layout_reserve(&l.size, n_devices, sizeof(Device), &l.devices);
        if (r < 0)
                return r;
        r = layout_reserve(&l.size, string_bytes, 1, &l.strings);
        if (r < 0)
                return r;
        *ret = l;
        return 0;
}

static int strings_add(size_t *bytes, const char *s) {
        return __builtin_add_overflow(*bytes, strlen(strempty(s)) + 1, bytes) ? -ENOMEM : 0;
}

/* What a node takes in a topology's block: its devices and the bytes of all its strings. */
static int node_measure(const Node *n, size_t *n_devices, size_t *string_bytes) {
        int r;

        if (n->n_devices > 0 && !n->devices)
                return -EINVAL;
        if (__builtin_add_overflow(*n_devices, n->n_devices, n_devices))
                return -ENOMEM;
        r = strings_add(string_bytes, n->name);
        if (r >= 0)
                r = strings_add(string_bytes, n->address);
        for (size_t i = 0; i < n->n_devices && r >= 0; i++) {
                const Device *d = &n->devices[i];

                r = strings_add(string_bytes, d->kind);
                if (r >= 0)
                        r = strings_add(string_bytes, d->name);
                if (r >= 0)
                        r = strings_add(string_bytes, d->uuid);
                if (r >= 0)
                        r = strings_add(string_bytes, d->pci_bus_id);
        }
        return r;
}

static char *string_place(char **cursor, const char *s) {
        char *p = *cursor;

        *cursor = stpcpy(p, strempty(s)) + 1;
        return p;
}

/* Copies a node into the block: devices at *devices, strings at *strings, both moved on. */
static void node_place(const Node *from, Node *to, Device **devices, char **strings) {
        *to = *from;
        to->registry_digest[REGISTRY_DIGEST_LENGTH] = 0;
        to->name = string_place(strings, from->name);
        to->address = string_place(strings, from->address);
        to->devices = from->n_devices > 0 ? *devices : NULL;
        for (size_t i = 0; i < from->n_devices; i++) {
                const Device *f = &from->devices[i];
                Device *d = &to->devices[i];

                *d = *f;
                d->kind = string_place(strings, f->kind);
                d->name = string_place(strings, f->name);
                d->uuid = string_place(strings, f->uuid);
                d->pci_bus_id = string_place(strings, f->pci_bus_id);
        }
        *devices += from->n_devices;
}

static int node_compare(const void *a, const void *b) {
        const Node *x = *(const Node *const *) a, *y = *(const Node *const *) b;

        /* Configured ranks first: an operator who numbers some nodes wants them in front. */
        if ((x->node_rank >= 0) != (y->node_rank >= 0))
                return x->node_rank >= 0 ? -1 : 1;
        if (x->node_rank != y->node_rank)
                return x->node_rank < y->node_rank ? -1 : 1;
        return strcmp(strempty(x->name), strempty(y->name));
}

/*
 * Puts order[0..n) in node_compare()'s order. Configured node ranks are distinct in every table
 * (membership and the cluster table refuse a taken rank) and usually dense, 0..N-1: those are
 * placed by rank in O(N): sorting took a fifth of a 1,000-member simulator run (docs/scale.md).
 * A repeated rank, sparse ranks or no memory for the slots: sorted as a whole.
 */
static void order_nodes(const Node *nodes, size_t n, const Node **order) {
        _cleanup_free_ const Node **slots = NULL;
        size_t n_ranked = 0, k = 0;
        int64_t max_rank = -1;

        for (size_t i = 0; i < n; i++) {
                order[i] = &nodes[i];
                if (nodes[i].node_rank >= 0) {
                        n_ranked++;
                        max_rank = MAX(max_rank, nodes[i].node_rank);
                }
        }
        if (n_ranked > 1 && (uint64_t) max_rank < 2 * (uint64_t) n_ranked)
                slots = calloc((size_t) max_rank + 1, sizeof *slots);
        for (size_t i = 0; slots && i < n; i++) {
                if (nodes[i].node_rank < 0)
                        continue;
                if (slots[nodes[i].node_rank])
                        slots = mfree(slots);
                else
                        slots[nodes[i].node_rank] = &nodes[i];
        }
        if (!slots) {
                qsort(order, n, sizeof *order, node_compare);
                return;
        }
        for (int64_t r = 0; r <= max_rank; r++)
                if (slots[r])
                        order[k++] = slots[r];
        for (size_t i = 0; i < n; i++)
                if (nodes[i].node_rank < 0)
                        order[k++] = &nodes[i];
        qsort(order + n_ranked, n - n_ranked, sizeof *order, node_compare);
}

int topology_new_copy(const Node *nodes, size_t n, const char *local_name, uint64_t version,
                      Topology **ret) {
        _cleanup_free_ const Node **order = NULL;
        size_t n_devices = 0, string_bytes = 0;
        TopologyLayout l;
        Topology *t;
        Device *devices;
        char *strings;
        int64_t rank = 0;
        int r;

        if ((n > 0 && !nodes) || !ret)
                return -EINVAL;
        if (n > SIZE_MAX / sizeof(Node))
                return -ENOMEM;
        order = reallocarray(NULL, MAX(n, (size_t) 1), sizeof *order);
        if (!order)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                r = node_measure(&nodes[i], &n_devices, &string_bytes);
                if (r < 0)
                        return r;
        }
        r = layout_compute(n, n_devices, string_bytes, &l);
        if (r < 0)
                return r;
        order_nodes(nodes, n, order);

        t = malloc(l.size);
        if (!t)
                return -ENOMEM;
        *t = (Topology) {
                .version = version,
                .nodes = (Node *) ((char *) t + l.nodes),
                .n_nodes = n,
                .local = n, /* none until found */
        };
        atomic_init(&t->n_ref, 1);
        devices = (Device *) ((char *) t + l.devices);
        strings = (char *) t + l.strings;
        for (size_t i = 0; i < n; i++) {
                Node *node = &t->nodes[i];

                node_place(order[i], node, &devices, &strings);
                node->first_rank = rank;
                rank += (int64_t) node->n_devices;
                node->local = streq_ptr(node->name, local_name);
                if (node->local)
                        t->local = i;
        }
        t->world_size = rank;
        *ret = t;
        return 0;
}

int topology_new(Node *nodes, size_t n, const char *local_name, uint64_t version,
                 Topology **ret) {
        int r = topology_new_copy(nodes, n, local_name, version, ret);

        for (size_t i = 0; nodes && i < n; i++)
                node_done(&nodes[i]);
        free(nodes);
        return r;
}

static int64_t now_unix_ms(void) {
        struct timespec ts;

        if (clock_gettime(CLOCK_REALTIME, &ts) < 0)
                return 0;
        return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/*
 * memory_bytes is what each host device reports. uuid and pci_bus_id are empty strings rather
 * than NULL so that every consumer (codecs included) can treat the strings as always present.
 */
int topology_new_local(const char *node_name, int64_t node_rank, const char *address,
                       unsigned n_host_devices, uint64_t memory_bytes, Topology **ret) {
        _cleanup_free_ Device *devices = NULL;
        _cleanup_free_ char *names = NULL;
        const size_t name_size = sizeof "host" + 10; /* "host" and a 32-bit index */

        if (isempty(node_name) || !ret)
                return -EINVAL;
        devices = reallocarray(NULL, MAX(n_host_devices, 1u), sizeof(Device));
        names = reallocarray(NULL, MAX(n_host_devices, 1u), name_size);
        if (!devices || !names)
                return -ENOMEM;
        for (unsigned i = 0; i < n_host_devices; i++) {
                char *name = names + (size_t) i * name_size;

                (void) snprintf(name, name_size, "host%u", i);
                devices[i] = (Device) {
                        .local_index = (int32_t) i,
                        .kind = (char *) "host",
                        .name = name,
                        .memory_bytes = memory_bytes,
                        .numa_node = -1,
                };
        }
        return topology_new_single(node_name, node_rank, address, devices, n_host_devices,
                                   ret);
}

Topology *topology_ref(Topology *t) {
        if (!t)
                return NULL;
        atomic_fetch_add_explicit(&t->n_ref, 1, memory_order_relaxed);
        return t;
}

Topology *topology_unref(Topology *t) {
        if (!t)
                return NULL;
        /* acq_rel: the last owner must see every write made through the other references. */
        if (atomic_fetch_sub_explicit(&t->n_ref, 1, memory_order_acq_rel) == 1)
                free(t); /* one block: nodes, devices and strings with it */
        return NULL;
}

int topology_new_single(const char *node_name, int64_t node_rank, const char *address,
                        const Device *devices, size_t n_devices, Topology **ret) {
        Node node = {
                .name = (char *) node_name,
                .address = (char *) address,
                .node_rank = node_rank,
                .devices = (Device *) devices,
                .n_devices = n_devices,
                .state = NODE_UP,
                .last_seen_unix_ms = now_unix_ms(),
        };

        if (isempty(node_name) || !ret)
                return -EINVAL;
        return topology_new_copy(&node, 1, node_name, 1, ret);
}

int topology_with_local_digest(const Topology *t, const char *digest, Topology **ret) {
        const Node *local = topology_local_node(t);
        _cleanup_free_ Node *nodes = reallocarray(NULL, MAX(t->n_nodes, (size_t) 1),
                                                  sizeof(Node));

        if (!nodes)
                return -ENOMEM;
        /* The copy borrows t's strings and devices until topology_new_copy() has copied them. */
        memcpy(nodes, t->nodes, t->n_nodes * sizeof(Node));
        if (local)
                (void) snprintf(nodes[t->local].registry_digest,
                                sizeof nodes[t->local].registry_digest, "%s", strempty(digest));
        return topology_new_copy(nodes, t->n_nodes, local ? local->name : NULL, t->version, ret);
}

const Node *topology_local_node(const Topology *t) {
        if (!t || t->local >= t->n_nodes)
                return NULL;
        return &t->nodes[t->local];
}

const Node *topology_node_of_rank(const Topology *t, int64_t rank, int32_t *ret_local_device) {
        if (!t || rank < 0 || rank >= t->world_size)
                return NULL;

        for (size_t i = 0; i < t->n_nodes; i++) {
                const Node *n = &t->nodes[i];

                if (rank >= n->first_rank && (uint64_t) (rank - n->first_rank) < n->n_devices) {
                        if (ret_local_device)
                                *ret_local_device = (int32_t) (rank - n->first_rank);
                        return n;
                }
        }
        return NULL;
}

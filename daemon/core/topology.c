/* topology.c: the global rank order over nodes, reference counting and rank lookups. */
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

static Topology *topology_free(Topology *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_nodes; i++)
                node_done(&t->nodes[i]);
        free(t->nodes);
        return mfree(t);
}

DEFINE_TRIVIAL_CLEANUP_FUNC(Topology *, topology_free);

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
        _cleanup_(topology_freep) Topology *t = NULL;

        if (isempty(node_name) || !ret)
                return -EINVAL;

        t = calloc(1, sizeof(Topology));
        if (!t)
                return -ENOMEM;
        atomic_init(&t->n_ref, 1);
        t->version = 1;
        t->world_size = n_host_devices;

        t->nodes = calloc(1, sizeof(Node));
        if (!t->nodes)
                return -ENOMEM;
        t->n_nodes = 1;
        t->local = 0;

        Node *n = &t->nodes[0];
        n->node_rank = node_rank;
        n->first_rank = 0;
        n->state = NODE_UP;
        n->local = true;
        n->last_seen_unix_ms = now_unix_ms();
        n->name = strdup(node_name);
        n->address = strdup(strempty(address));
        if (!n->name || !n->address)
                return -ENOMEM;

        if (n_host_devices > 0) {
                n->devices = calloc(n_host_devices, sizeof(Device));
                if (!n->devices)
                        return -ENOMEM;
        }
        for (unsigned i = 0; i < n_host_devices; i++) {
                Device *d = &n->devices[i];

                /* Counted before filling, so that a partial device is released too. */
                n->n_devices++;
                d->local_index = (int32_t) i;
                d->memory_bytes = memory_bytes;
                d->numa_node = -1;
                if (asprintf(&d->name, "host%u", i) < 0) {
                        d->name = NULL;
                        return -ENOMEM;
                }
                d->kind = strdup("host");
                d->uuid = strdup("");
                d->pci_bus_id = strdup("");
                if (!d->kind || !d->uuid || !d->pci_bus_id)
                        return -ENOMEM;
        }

        *ret = TAKE_PTR(t);
        return 0;
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
                topology_free(t);
        return NULL;
}

static int node_compare(const void *a, const void *b) {
        const Node *x = a, *y = b;

        /* Configured ranks first: an operator who numbers some nodes wants them in front. */
        if ((x->node_rank >= 0) != (y->node_rank >= 0))
                return x->node_rank >= 0 ? -1 : 1;
        if (x->node_rank != y->node_rank)
                return x->node_rank < y->node_rank ? -1 : 1;
        return strcmp(x->name, y->name);
}

int topology_new(Node *nodes, size_t n, const char *local_name, uint64_t version,
                 Topology **ret) {
        _cleanup_(topology_freep) Topology *t = calloc(1, sizeof(Topology));
        int64_t rank = 0;

        if (!t) {
                for (size_t i = 0; i < n; i++)
                        node_done(&nodes[i]);
                free(nodes);
                return -ENOMEM;
        }
        atomic_init(&t->n_ref, 1);
        t->nodes = nodes;
        t->n_nodes = n;
        t->version = version;
        t->local = n; /* none until found */

        if (n > 1)
                qsort(t->nodes, n, sizeof(Node), node_compare);
        for (size_t i = 0; i < n; i++) {
                Node *node = &t->nodes[i];

                node->first_rank = rank;
                rank += (int64_t) node->n_devices;
                node->local = streq_ptr(node->name, local_name);
                if (node->local)
                        t->local = i;
        }
        t->world_size = rank;

        *ret = TAKE_PTR(t);
        return 0;
}

int topology_new_single(const char *node_name, int64_t node_rank, const char *address,
                        const Device *devices, size_t n_devices, Topology **ret) {
        Node *node;
        int r = 0;

        if (isempty(node_name) || !ret)
                return -EINVAL;
        node = calloc(1, sizeof(Node));
        if (!node)
                return -ENOMEM;
        node->node_rank = node_rank;
        node->state = NODE_UP;
        node->last_seen_unix_ms = now_unix_ms();
        node->name = strdup(node_name);
        node->address = strdup(strempty(address));
        node->devices = calloc(n_devices ? n_devices : 1, sizeof(Device));
        if (!node->name || !node->address || !node->devices)
                r = -ENOMEM;
        for (size_t i = 0; i < n_devices && r >= 0; i++) {
                r = device_copy(&devices[i], &node->devices[i]);
                if (r >= 0)
                        node->n_devices++;
        }
        if (r < 0) {
                node_done(node);
                free(node);
                return r;
        }
        return topology_new(node, 1, node_name, 1, ret);
}

int topology_with_local_digest(const Topology *t, const char *digest, Topology **ret) {
        const Node *local = topology_local_node(t);
        Node *nodes = calloc(t->n_nodes ? t->n_nodes : 1, sizeof(Node));
        size_t n = 0;
        int r = 0;

        if (!nodes)
                return -ENOMEM;
        for (; n < t->n_nodes; n++) {
                r = node_copy(&t->nodes[n], &nodes[n]);
                if (r < 0)
                        break;
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        node_done(&nodes[i]);
                free(nodes);
                return r;
        }
        if (local)
                (void) snprintf(nodes[t->local].registry_digest,
                                sizeof nodes[t->local].registry_digest, "%s", strempty(digest));
        return topology_new(nodes, n, local ? local->name : NULL, t->version, ret);
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

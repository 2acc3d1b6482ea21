/* topology.h: the nodes and devices a daemon knows, and the global rank numbering over them. */
#pragma once

#include <stdatomic.h>
#include <stdint.h>

#include "common/macro.h"

/* A node's registry digest: lower-case hex SHA-256 of its registry's canonical form
 * (codec/codec-registry-digest.h); "" while not known. */
#define REGISTRY_DIGEST_LENGTH 64

typedef struct Device {
        int32_t local_index;
        char *kind; /* "host" | "cuda" */
        char *name;
        char *uuid;
        uint64_t memory_bytes;
        int32_t numa_node; /* -1: unknown */
        char *pci_bus_id;
} Device;

typedef enum NodeState {
        NODE_UP,
        NODE_SUSPECT,
        NODE_DOWN,
        _NODE_STATE_MAX,
        _NODE_STATE_INVALID = -EINVAL,
} NodeState;

typedef struct Node {
        char *name;
        char *address;
        int64_t node_rank; /* -1: not configured; ordering falls back to the name */
        int64_t first_rank;
        Device *devices;
        size_t n_devices;
        NodeState state;
        int64_t last_seen_unix_ms;
        bool local;
        char registry_digest[REGISTRY_DIGEST_LENGTH + 1]; /* "": not announced yet */
} Node;

/*
 * Immutable once built; replaced as a whole on change. The ownership rule: a topology is one
 * allocation holding the struct, its nodes, their devices and every string they point to
 * (topology.c), freed by the last topology_unref(). Its nodes' and devices' fields must never
 * be freed or replaced (no node_done() on them); copy a node out with node_copy().
 */
typedef struct Topology {
        atomic_uint n_ref;
        uint64_t version;
        int64_t world_size;
        Node *nodes; /* ordered by node rank, then name; ranks numbered in that order */
        size_t n_nodes;
        size_t local; /* index of this node */
} Topology;

const char *node_state_to_string(NodeState s); /* "up" | "suspect" | "down" */

void device_done(Device *d);
int device_copy(const Device *from, Device *ret);
void node_done(Node *n);
int node_copy(const Node *from, Node *ret);
/* True for "" and for exactly REGISTRY_DIGEST_LENGTH lower-case hex digits. */
bool node_registry_digest_valid(const char *digest);

/*
 * Orders nodes[0..n) (configured node ranks first, ascending; then the others by name), numbers
 * the global ranks in that order (devices by local index), and marks the node named local_name
 * as local. The nodes are borrowed: their strings and devices are copied into the topology's
 * block (NULL strings become ""), their first_rank and local are ignored. -EINVAL for devices
 * missing, -ENOMEM.
 */
int topology_new_copy(const Node *nodes, size_t n, const char *local_name, uint64_t version,
                      Topology **ret);
/* topology_new_copy() for nodes built with node_copy()/device_copy(): takes over the nodes
 * array and its contents (node_done() and free() them), also on failure. */
int topology_new(Node *nodes, size_t n, const char *local_name, uint64_t version,
                 Topology **ret);

/* A topology of this node alone, with n_host_devices host devices ("host0", ...). */
int topology_new_local(const char *node_name, int64_t node_rank, const char *address,
                       unsigned n_host_devices, uint64_t memory_bytes, Topology **ret);
/* This node alone, with copies of the devices an inventory found. */
int topology_new_single(const char *node_name, int64_t node_rank, const char *address,
                        const Device *devices, size_t n_devices, Topology **ret);
/* A copy of t (same version) whose local node has the given registry digest. */
int topology_with_local_digest(const Topology *t, const char *digest, Topology **ret);
Topology *topology_ref(Topology *t);
Topology *topology_unref(Topology *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(Topology *, topology_unref);

const Node *topology_local_node(const Topology *t);
/* The node holding a global rank, and the rank's local device index; NULL if out of range. */
const Node *topology_node_of_rank(const Topology *t, int64_t rank, int32_t *ret_local_device);

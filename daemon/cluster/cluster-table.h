/* cluster-table.h: the cluster's members as the etcd prefix holds them, and the topology they make. */
#pragma once

/*
 * DESIGN: the state of the prefix a daemon watches (docs/coordinator.md, "The keys"): per name,
 * the member record of `members/<name>` when one decoded, and whether `alive/<name>` exists.
 * Single-threaded: the owner (cluster-etcd.c) holds its lock around every call. Each record
 * is refused at most once per value with one log line: bytes that do not decode (coord layer),
 * a record of another cluster, a node rank an older record (lower create_revision) holds, a
 * record past max_nodes members (the local node and the oldest records are the members). The
 * version is the newest mod_revision seen under the prefix (an event's, or after a re-read the
 * newest key's), never lower than before.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "coord/coord-client.h"
#include "core/topology.h"

typedef struct ClusterTable ClusterTable;

/* prefix: "/familyd/<cluster>/"; local: this node as its own configuration says (copied);
 * max_nodes: the most members a topology takes, the local node included (--max-nodes; 0:
 * FAMILYD_MAX_PEERS). */
int cluster_table_new(const char *prefix, const char *cluster, const Node *local,
                      size_t max_nodes, ClusterTable **ret);
ClusterTable *cluster_table_free(ClusterTable *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(ClusterTable *, cluster_table_free);

/* One event of the watch (RESET, PUT, DELETE); now_ms: CLOCK_MONOTONIC. */
void cluster_table_apply(ClusterTable *t, const CoordEvent *e, int64_t now_ms,
                         int64_t now_unix_ms);
/* Whether the table changed since the last cluster_table_topology(). */
bool cluster_table_dirty(const ClusterTable *t);
/* The local node and every other member with a record this daemon takes, up when its alive key
 * exists; logs each newly refused duplicate rank once. */
int cluster_table_topology(ClusterTable *t, int64_t now_unix_ms, Topology **ret);

typedef enum ClusterNodeState {
        CLUSTER_NODE_ABSENT, /* no member record of that name */
        CLUSTER_NODE_UP,
        CLUSTER_NODE_DOWN,
        _CLUSTER_NODE_STATE_MAX,
        _CLUSTER_NODE_STATE_INVALID = -EINVAL,
} ClusterNodeState;

ClusterNodeState cluster_table_state(const ClusterTable *t, const char *name);
/* Whether this node's own member record is under the prefix (someone may delete it). */
bool cluster_table_has_own_record(const ClusterTable *t);

/*
 * The first name whose member has been down for at least after_ms (this daemon's view) and is
 * due to be forgotten by this daemon: the first of the nodes up in the topology's order
 * (configured node ranks, then names). NULL when none; malloc'ed. The node's clock restarts,
 * so a failed delete is tried again after_ms later.
 */
char *cluster_table_next_to_forget(ClusterTable *t, int64_t now_ms, uint64_t after_ms);

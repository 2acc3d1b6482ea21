/* cluster-etcd.h: the daemon's membership in etcd (--coordinator): its records, the topology from the watch. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/manager.h"

typedef struct ClusterEtcdParams {
        const char *endpoints; /* "HOST:PORT[,HOST:PORT...]" (--coordinator without etcd://) */
        const char *cluster;   /* --cluster: the prefix is /familyd/<cluster>/ */
        const char *tls_ca_path, *tls_cert_path, *tls_key_path; /* NULL: plaintext */
        uint64_t down_ms;         /* the lease's TTL, rounded up to whole seconds, at least 2 s */
        uint64_t forget_after_ms; /* 0: never */
        size_t max_nodes;         /* --max-nodes: members a topology takes, oldest records first */
        Manager *manager;         /* receives each new topology; this node from its config */
} ClusterEtcdParams;

typedef struct ClusterEtcd ClusterEtcd;

/* Grants the lease, takes `alive/<name>` (a live holder of the name refuses the start: -EEXIST),
 * writes `members/<name>`, and watches the prefix. Errors are logged. */
int cluster_etcd_new(const ClusterEtcdParams *p, ClusterEtcd **ret);
/* Revokes the lease (the alive key goes at once; the member record stays) and stops. */
ClusterEtcd *cluster_etcd_free(ClusterEtcd *c);
DEFINE_TRIVIAL_CLEANUP_FUNC(ClusterEtcd *, cluster_etcd_free);

/* ForgetNode: deletes `members/<node>` when its alive key is gone. 1: forgotten. */
int cluster_etcd_forget(ClusterEtcd *c, const char *node, FamilyError *ret_error);

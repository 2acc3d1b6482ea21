/* cluster-ucx.h: this node's UCX worker in etcd mode, whose address the member record publishes. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "common/macro.h"

typedef struct ClusterUcx ClusterUcx;

/* A UCX context and worker (active messages) kept for the daemon's life, so that the address
 * stays valid for the data paths that will dial it. Errors are logged. */
int cluster_ucx_new(ClusterUcx **ret);
ClusterUcx *cluster_ucx_free(ClusterUcx *u);
DEFINE_TRIVIAL_CLEANUP_FUNC(ClusterUcx *, cluster_ucx_free);

/* The worker's address (ucp_worker_get_address()), valid while u lives. */
const uint8_t *cluster_ucx_address(const ClusterUcx *u, size_t *ret_size);

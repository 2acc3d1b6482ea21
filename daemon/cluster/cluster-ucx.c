/* cluster-ucx.c: this node's UCX worker in etcd mode, whose address the member record publishes. */

/*
 * The main thread makes and frees the worker (cluster_etcd_new(), cluster_etcd_free()) and
 * nothing progresses it yet: only its address is read (cluster-etcd.c copies it into the
 * member record). It is UCS_THREAD_MODE_MULTI, so a data path may progress it from a thread
 * of its own later; a SINGLE worker belongs to the thread that made it (UCX 1.18 asserts it
 * on progress; peer-ucx.c).
 */

#include <stdlib.h>

#include <ucp/api/ucp.h>

#include "cluster-ucx.h"
#include "common/log.h"

struct ClusterUcx {
        ucp_context_h context;
        ucp_worker_h worker;
        ucp_address_t *address;
        size_t address_size;
};

int cluster_ucx_new(ClusterUcx **ret) {
        _cleanup_(cluster_ucx_freep) ClusterUcx *u = calloc(1, sizeof(ClusterUcx));
        ucp_config_t *config;
        ucs_status_t s;

        if (!u)
                return -ENOMEM;
        s = ucp_config_read(NULL, NULL, &config);
        if (s != UCS_OK)
                return log_error_errno(-EIO, "Failed to read the UCX configuration: %s",
                                       ucs_status_string(s));
        ucp_params_t params = {
                .field_mask = UCP_PARAM_FIELD_FEATURES,
                .features = UCP_FEATURE_AM,
        };
        s = ucp_init(&params, config, &u->context);
        ucp_config_release(config);
        if (s != UCS_OK)
                return log_error_errno(-EIO, "Failed to initialise UCX: %s", ucs_status_string(s));
        ucp_worker_params_t wp = {
                .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                .thread_mode = UCS_THREAD_MODE_MULTI,
        };
        s = ucp_worker_create(u->context, &wp, &u->worker);
        if (s != UCS_OK)
                return log_error_errno(-EIO, "Failed to create a UCX worker: %s",
                                       ucs_status_string(s));
        s = ucp_worker_get_address(u->worker, &u->address, &u->address_size);
        if (s != UCS_OK)
                return log_error_errno(-EIO, "Failed to get the UCX worker address: %s",
                                       ucs_status_string(s));
        *ret = TAKE_PTR(u);
        return 0;
}

ClusterUcx *cluster_ucx_free(ClusterUcx *u) {
        if (!u)
                return NULL;
        if (u->address)
                ucp_worker_release_address(u->worker, u->address);
        if (u->worker)
                ucp_worker_destroy(u->worker);
        if (u->context)
                ucp_cleanup(u->context);
        return mfree(u);
}

const uint8_t *cluster_ucx_address(const ClusterUcx *u, size_t *ret_size) {
        *ret_size = u->address_size;
        return (const uint8_t *) u->address;
}

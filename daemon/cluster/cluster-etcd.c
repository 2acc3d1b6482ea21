/* cluster-etcd.c: the daemon's membership in etcd (--coordinator): its records, the topology from the watch. */

/*
 * DESIGN
 *
 * Three threads meet here. The coord client's thread delivers the watch's events
 * (on_event) and keeps the lease alive; this file's own thread (the keeper) turns the table
 * into topologies for the manager, at most one per KEEPER_TICK_MS however many events came (a
 * re-read of 1,000 members is one topology, not 1,000), writes this node's record again when
 * the registry digest changed (a reload) or the record went missing, and forgets members down
 * longer than --forget-after-ms; gRPC workers call cluster_etcd_forget(). `lock` guards the
 * table and the keeper's flags, and is never held across a call to etcd: a call may wait its
 * whole deadline during an outage while the watch's thread wants the lock.
 *
 * During an outage nothing arrives, so the topology stays as last seen: no node is marked down
 * for etcd's own absence. The coord client re-creates a lost lease (and the alive key with it)
 * and resumes the watch where it stopped.
 */

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster-etcd.h"
#include "cluster-table.h"
#include "codec/codec-coord-member.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "coord/coord-client.h"
#include "core/coordinator-status.h"

#define KEEPER_TICK_MS 100
/* How often the keeper checks the record and the members to forget. */
#define KEEPER_CHORES_MS 500
/* How long a ForgetNode waits for the watch to show the deletion here. */
#define FORGET_SETTLE_MS 3000
/* A stale alive key of this name (a daemon SIGKILLed just before) outlives its holder by at most
 * its TTL and etcd's expiry check; past this much more, a live daemon keeps it. */
#define ALIVE_GRACE_MS 1500

struct ClusterEtcd {
        Manager *manager;
        char *prefix, *alive_key, *member_key;
        CoordClient *client;
        CoordMember self; /* what members/<name> holds, digest as last written */
        uint64_t forget_after_ms;

        pthread_mutex_t lock;
        pthread_cond_t wake;
        ClusterTable *table;
        bool stop;
        bool own_record_seen; /* the watch showed members/<name> once: its loss is a deletion */
        pthread_t keeper;
        bool keeper_started;
};

/* On the coord client's thread. */
static void on_event(const CoordEvent *e, void *userdata) {
        ClusterEtcd *c = userdata;

        (void) pthread_mutex_lock(&c->lock);
        /* The keeper publishes at its next tick: a burst of events is one topology. */
        cluster_table_apply(c->table, e, now_ms(), now_unix_ms());
        (void) pthread_mutex_unlock(&c->lock);
}

/* On whichever thread saw the edge; the coord layer logged it. */
static void on_reachable(bool reachable, const char *why, void *userdata) {
        coordinator_status_set_reachable(reachable, why);
}

/* With the lock held: the table's topology to the manager, when it changed. */
static void publish_locked(ClusterEtcd *c) {
        _cleanup_(topology_unrefp) Topology *t = NULL;
        int r;

        if (!cluster_table_dirty(c->table))
                return;
        r = cluster_table_topology(c->table, now_unix_ms(), &t);
        if (r < 0) {
                log_warning_errno(r, "Failed to build the topology from etcd, ignoring: %m");
                return;
        }
        manager_set_topology(c->manager, t);
}

static int self_encode(ClusterEtcd *c, uint8_t **ret, size_t *ret_size) {
        return codec_coord_member_encode(&c->self, ret, ret_size);
}

/* members/<name>, written again when the registry digest moved (a reload) or the record is not
 * under the prefix any more (deleted by hand after the watch showed it). */
static void keeper_check_record(ClusterEtcd *c, bool own_record_missing) {
        char digest[REGISTRY_DIGEST_LENGTH + 1];
        _cleanup_free_ uint8_t *value = NULL;
        size_t size;
        int r;

        manager_registry_digest(c->manager, digest);
        if (streq(digest, c->self.registry_digest) && !own_record_missing)
                return;
        memcpy(c->self.registry_digest, digest, sizeof digest);
        r = self_encode(c, &value, &size);
        if (r >= 0)
                r = coord_client_put(c->client, c->member_key, value, size, NULL);
        if (r < 0) {
                c->self.registry_digest[0] = '\0'; /* try again at the next chore */
                log_debug("Writing %s failed, trying again: %s", c->member_key, strerror(-r));
        }
}

/* --forget-after-ms: the first node up in the topology's order forgets, one member a chore. */
static void keeper_forget_due(ClusterEtcd *c, char *name) {
        _cleanup_free_ char *alive = NULL, *member = NULL;
        _cleanup_(etcd_kv_done) EtcdKv kv = {};
        int r;

        if (asprintf(&alive, "%salive/%s", c->prefix, name) < 0 ||
            asprintf(&member, "%smembers/%s", c->prefix, name) < 0)
                return;
        r = coord_client_get(c->client, alive, &kv);
        if (r != -ENOENT)
                return; /* back up, or etcd did not answer: not now */
        r = coord_client_delete(c->client, member, NULL);
        if (r < 0)
                return;
        log_info("Forgot node %s: down for %" PRIu64 " ms (--forget-after-ms), deleted %s.", name,
                 c->forget_after_ms, member);
}

static void *keeper_run(void *userdata) {
        ClusterEtcd *c = userdata;
        int64_t next_chores = 0;

        (void) pthread_mutex_lock(&c->lock);
        while (!c->stop) {
                struct timespec until;

                (void) clock_gettime(CLOCK_MONOTONIC, &until);
                until.tv_nsec += KEEPER_TICK_MS * 1000000L;
                if (until.tv_nsec >= 1000000000L) {
                        until.tv_sec++;
                        until.tv_nsec -= 1000000000L;
                }
                (void) pthread_cond_timedwait(&c->wake, &c->lock, &until);
                if (c->stop)
                        break;
                publish_locked(c);
                if (now_ms() < next_chores)
                        continue;
                next_chores = now_ms() + KEEPER_CHORES_MS;
                bool own_record = cluster_table_has_own_record(c->table);
                bool own_record_missing = c->own_record_seen && !own_record;
                c->own_record_seen = c->own_record_seen || own_record;
                _cleanup_free_ char *due = cluster_table_next_to_forget(c->table, now_ms(),
                                                                        c->forget_after_ms);
                (void) pthread_mutex_unlock(&c->lock);
                keeper_check_record(c, own_record_missing);
                if (due)
                        keeper_forget_due(c, due);
                (void) pthread_mutex_lock(&c->lock);
        }
        (void) pthread_mutex_unlock(&c->lock);
        return NULL;
}

/* This node's record: who it is as its configuration says, its devices, its registry. No
 * UCX worker address: in etcd mode nothing dials one (the record's field stays empty). */
static int self_init(ClusterEtcd *c, const ClusterEtcdParams *p, const Node *local) {
        int r;

        c->self = (CoordMember) {
                .node_rank = local->node_rank,
                .started_unix_ms = now_unix_ms(),
        };
        r = random_bytes(&c->self.boot_id, sizeof c->self.boot_id);
        if (r < 0)
                return r;
        c->self.name = strdup(local->name);
        if (!c->self.name)
                return -ENOMEM;
        if (local->n_devices > 0) {
                c->self.devices = calloc(local->n_devices, sizeof(Device));
                if (!c->self.devices)
                        return -ENOMEM;
        }
        for (size_t i = 0; i < local->n_devices; i++) {
                r = device_copy(&local->devices[i], &c->self.devices[i]);
                if (r < 0)
                        return r;
                c->self.n_devices++;
        }
        (void) snprintf(c->self.cluster, sizeof c->self.cluster, "%s", p->cluster);
        manager_registry_digest(c->manager, c->self.registry_digest);
        return 0;
}

/* alive/<name> under our lease, if no live daemon holds it. A daemon killed a moment ago
 * leaves its key until the lease runs out: wait that long, then refuse. */
static int take_name(ClusterEtcd *c, const char *name, const char *cluster) {
        int64_t deadline = now_ms() + coord_client_lease_ttl_s(c->client) * 1000 + ALIVE_GRACE_MS;
        bool said = false;
        int r;

        for (;;) {
                r = coord_client_create_leased(c->client, c->alive_key, (const uint8_t *) "1", 1);
                if (r != COORD_EXISTS)
                        break;
                if (now_ms() >= deadline)
                        return log_error_errno(-EEXIST, "Another familyd holds the node name '%s' "
                                               "in cluster '%s' (%s exists in etcd and is kept "
                                               "alive), refusing to start. Stop that daemon or "
                                               "give this one another --node-name.",
                                               name, cluster, c->alive_key);
                if (!said)
                        log_notice("%s exists in etcd: waiting up to %" PRId64 " ms for its "
                                   "lease to run out (a previous start of this node).",
                                   c->alive_key, deadline - now_ms());
                said = true;
                (void) nanosleep(&(struct timespec) { .tv_nsec = 250 * 1000000L }, NULL);
        }
        if (r < 0)
                return log_error_errno(r, "Failed to write %s in etcd: %m", c->alive_key);
        return 0;
}

static int cluster_etcd_connect(ClusterEtcd *c, const ClusterEtcdParams *p) {
        CoordOptions o = {
                .endpoints = p->endpoints,
                .watch_prefix = c->prefix,
                .on_event = on_event,
                .on_reachable = on_reachable,
                .userdata = c,
                .lease_ttl_ms = MAX(p->down_ms, (uint64_t) 1),
                .tls_ca_path = p->tls_ca_path,
                .tls_cert_path = p->tls_cert_path,
                .tls_key_path = p->tls_key_path,
        };
        int r;

        r = coord_client_new(&o, &c->client);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the etcd client for %s: %m",
                                       p->endpoints);
        r = coord_client_start(c->client);
        if (r < 0)
                return log_error_errno(r, "Failed to reach etcd at %s (a lease for the alive key "
                                       "was not granted): %m",
                                       p->endpoints);
        return 0;
}

int cluster_etcd_new(const ClusterEtcdParams *p, ClusterEtcd **ret) {
        _cleanup_(cluster_etcd_freep) ClusterEtcd *c = calloc(1, sizeof(ClusterEtcd));
        _cleanup_(topology_unrefp) Topology *start = manager_topology(p->manager);
        const Node *local = topology_local_node(start);
        _cleanup_free_ uint8_t *value = NULL;
        size_t size;
        int r;

        if (!c)
                return -ENOMEM;
        c->manager = p->manager;
        c->forget_after_ms = p->forget_after_ms;
        (void) pthread_mutex_init(&c->lock, NULL);
        pthread_condattr_t attr;
        (void) pthread_condattr_init(&attr);
        (void) pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        (void) pthread_cond_init(&c->wake, &attr);
        (void) pthread_condattr_destroy(&attr);
        if (asprintf(&c->prefix, "/familyd/%s/", p->cluster) < 0 ||
            asprintf(&c->alive_key, "%salive/%s", c->prefix, local->name) < 0 ||
            asprintf(&c->member_key, "%smembers/%s", c->prefix, local->name) < 0)
                return -ENOMEM;
        r = cluster_table_new(c->prefix, p->cluster, local, p->max_nodes, &c->table);
        if (r < 0)
                return r;
        r = self_init(c, p, local);
        if (r < 0)
                return log_error_errno(r, "Failed to make this node's member record: %m");
        coordinator_status_configure(p->endpoints, p->cluster);
        r = cluster_etcd_connect(c, p);
        if (r < 0)
                return r;
        r = take_name(c, local->name, p->cluster);
        if (r < 0)
                return r;
        r = self_encode(c, &value, &size);
        if (r >= 0)
                r = coord_client_put(c->client, c->member_key, value, size, NULL);
        if (r < 0)
                return log_error_errno(r, "Failed to write %s in etcd: %m", c->member_key);
        r = -pthread_create(&c->keeper, NULL, keeper_run, c);
        if (r < 0)
                return log_error_errno(r, "Failed to start the etcd membership thread: %m");
        c->keeper_started = true;
        log_info("Member of cluster '%s' in etcd at %s (%s, lease TTL %" PRId64 " s).",
                 p->cluster, p->endpoints, c->member_key, coord_client_lease_ttl_s(c->client));
        *ret = TAKE_PTR(c);
        return 0;
}

ClusterEtcd *cluster_etcd_free(ClusterEtcd *c) {
        if (!c)
                return NULL;
        if (c->keeper_started) {
                (void) pthread_mutex_lock(&c->lock);
                c->stop = true;
                (void) pthread_cond_signal(&c->wake);
                (void) pthread_mutex_unlock(&c->lock);
                (void) pthread_join(c->keeper, NULL);
        }
        if (c->client) {
                int r = coord_client_revoke(c->client);
                if (r < 0)
                        log_warning_errno(r, "Failed to revoke the etcd lease: %s goes when it "
                                          "expires, ignoring: %m",
                                          c->alive_key);
        }
        coord_client_free(c->client);
        coordinator_status_clear();
        cluster_table_free(c->table);
        coord_member_done(&c->self);
        free(c->prefix);
        free(c->alive_key);
        free(c->member_key);
        (void) pthread_cond_destroy(&c->wake);
        (void) pthread_mutex_destroy(&c->lock);
        return mfree(c);
}

static int forget_unreachable(FamilyError *ret_error) {
        return family_error_set(ret_error, FAMILY_STATUS_UNAVAILABLE, "COORDINATOR_UNAVAILABLE",
                                NULL, "etcd is unreachable; a node can be forgotten once it is "
                                "back");
}

/* Until the watch shows the deletion here (and the keeper published it), so that the caller's
 * next GetTopology does not list the node. */
static void forget_settle(ClusterEtcd *c, const char *node) {
        int64_t deadline = now_ms() + FORGET_SETTLE_MS;

        for (;;) {
                (void) pthread_mutex_lock(&c->lock);
                bool gone = cluster_table_state(c->table, node) == CLUSTER_NODE_ABSENT;
                if (gone)
                        publish_locked(c);
                (void) pthread_mutex_unlock(&c->lock);
                if (gone || now_ms() >= deadline)
                        return;
                (void) nanosleep(&(struct timespec) { .tv_nsec = 20 * 1000000L }, NULL);
        }
}

int cluster_etcd_forget(ClusterEtcd *c, const char *node, FamilyError *ret_error) {
        _cleanup_free_ char *alive = NULL, *member = NULL;
        _cleanup_(etcd_kv_done) EtcdKv kv = {};
        ClusterNodeState state;
        int r;

        if (streq(node, c->self.name))
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "NODE_IS_LOCAL", "node",
                                        "node '%s' is this daemon's own node", node);
        (void) pthread_mutex_lock(&c->lock);
        state = cluster_table_state(c->table, node);
        (void) pthread_mutex_unlock(&c->lock);
        if (state == CLUSTER_NODE_ABSENT)
                return family_error_set(ret_error, FAMILY_STATUS_NOT_FOUND, "NODE_NOT_FOUND",
                                        "node", "node '%s' is not in the topology", node);
        if (asprintf(&alive, "%salive/%s", c->prefix, node) < 0 ||
            asprintf(&member, "%smembers/%s", c->prefix, node) < 0)
                return -ENOMEM;
        /* etcd's word, not the watch's: the table may be a moment behind. */
        r = coord_client_get(c->client, alive, &kv);
        if (r == 0)
                return family_error_set(ret_error, FAMILY_STATUS_FAILED_PRECONDITION,
                                        "NODE_NOT_DOWN", "node",
                                        "node '%s' is %s; only a down node can be forgotten",
                                        node, "up");
        if (r == -ENOTCONN)
                return forget_unreachable(ret_error);
        if (r != -ENOENT)
                return r;
        r = coord_client_delete(c->client, member, NULL);
        if (r == -ENOTCONN)
                return forget_unreachable(ret_error);
        if (r < 0)
                return r;
        log_info("Forgot node %s on request: deleted %s.", node, member);
        forget_settle(c, node);
        return 1;
}

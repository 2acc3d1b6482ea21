/* daemon.c: wires manager, gRPC server and listener, and runs the signal and accept loop. */

/*
 * DESIGN: the main thread owns the loop (sd-event over the signals, the API socket and the
 * service manager's watchdog timer, sd/notify.c) and does nothing slow in it: accepting hands
 * a connection to gRPC, SIGHUP reloads the registry (the manager builds the new snapshot
 * without blocking calls), the timer pings the watchdog. gRPC's worker threads answer calls.
 * The API socket is watched level-triggered; when accepting fails in a way that leaves the
 * connection queued, the loop stops watching it for a moment instead of spinning.
 */

#include <grp.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <systemd/sd-event.h>

#include "build/build.h"
#include "cluster/cluster-etcd.h"
#include "codec/codec-registry-digest.h"
#include "shm/accel.h"
#include "daemon.h"
#include "rpc/executor.h"
#include "shm/huge-pages.h"
#include "sd/listen.h"
#include "rpc/listener.h"
#include "common/log.h"
#include "hw/inventory.h"
#include "metrics/metrics.h"
#include "metrics/metrics-server.h"
#include "sd/heap-trim.h"
#include "sd/journal.h"
#include "core/coordinator-status.h"
#include "core/manager.h"
#include "peer/peer.h"
#include "peer/peer-key.h"
#include "peer/peer-ucx.h"
#include "sd/notify.h"
#include "core/resource-limits.h"
#include "rpc/server.h"
#include "handout/shard-socket.h"
#include "handout/shard-table.h"
#include "state/state.h"
#include "common/random.h"
#include "handout/token.h"

struct Daemon {
        Manager *manager;
        Server *server;
        ShardTable *shards;
        ShardServer *shard_server;
        CheckpointDeposits *deposits; /* checkpoint files handed over on the shard socket */
        Executor *executor;
        Listener *listener;
        sd_event *event;                /* the main loop */
        sd_event_source *api_io;        /* the API socket: off while accepting pauses */
        sd_event_source *accept_resume; /* on while accepting pauses */
        HeapTrim *heap_trim;            /* returns freed heap to the system (sd/heap-trim.c) */
        bool accept_failing;            /* an accept failure episode is under way (logged once) */
        const Config *config;
        /* What the service manager passed (LISTEN_FDS): api and shard are taken at start; the
         * fd store's entries (shard-*, meta*) wait here for listen_fds_take(). */
        ListenFds *listen_fds;
        State *state; /* builds and meshes kept across restarts (daemon/state/) */
        Accel *accel; /* shard memory by device: host, and GPUs (daemon/shm/accel.h) */
        Builder builder; /* the Build use-case over the above (daemon/build/), for the server */
        Notifier *notifier;
        Peer *peer; /* NULL without --listen: this node alone */
        ClusterEtcd *cluster; /* with --coordinator instead: the membership in etcd */
        MetricsServer *metrics; /* NULL without --metrics-listen */
        PeerKeys keys; /* --cluster-key, read before anything is bound; wiped once peers run */
        char *socket_path;       /* where the API socket is: bound here, or inherited */
        char *shard_socket_path; /* the same for the shard socket; Build replies name it */
};

/* Descriptors kept free of API connections: registry files on reload, gRPC's own (epoll,
 * wakeup fds, timers), the main loop's (epoll, signalfd), log and lock files. */
#define DAEMON_FD_RESERVE 64u
/* Builds that materialise run here, off the gRPC workers. Their fills share the fill threads
 * (the cores), so more Builds at once cost no more CPU; a small Build does not wait behind a
 * large one, and a fill that waits for an equal one under way (shm/fill-share.h: the dp
 * replicas of a job's training handouts) does not keep the one it waits for queued. */
#define DAEMON_BUILD_THREADS 8u
#define DAEMON_BUILD_QUEUE 64u
/* How long the loop stops accepting after a failure that leaves the connection queued. */
#define DAEMON_ACCEPT_PAUSE_MS 100

/*
 * Raises the soft open-file limit to the hard one (familyd never uses select(), so a large
 * limit costs nothing) and returns how many connections fit under it.
 */
static unsigned daemon_setup_fd_limit(unsigned max_connections) {
        struct rlimit rl;

        if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
                log_warning_errno(-errno, "Failed to read RLIMIT_NOFILE, ignoring: %m");
                return max_connections;
        }
        if (rl.rlim_cur < rl.rlim_max) {
                struct rlimit raised = { .rlim_cur = rl.rlim_max, .rlim_max = rl.rlim_max };
                if (setrlimit(RLIMIT_NOFILE, &raised) < 0)
                        log_warning_errno(-errno, "Failed to raise RLIMIT_NOFILE to %llu, "
                                                  "ignoring: %m",
                                          (unsigned long long) rl.rlim_max);
                else
                        rl.rlim_cur = rl.rlim_max;
        }
        if (rl.rlim_cur == RLIM_INFINITY ||
            rl.rlim_cur >= (rlim_t) max_connections + DAEMON_FD_RESERVE)
                return max_connections;

        unsigned fit = 1;
        if (rl.rlim_cur > DAEMON_FD_RESERVE + 1)
                fit = (unsigned) rl.rlim_cur - DAEMON_FD_RESERVE;
        log_warning("--max-connections %u does not fit the open-file limit (RLIMIT_NOFILE %llu, "
                    "%u kept in reserve), using %u.",
                    max_connections, (unsigned long long) rl.rlim_cur, DAEMON_FD_RESERVE, fit);
        return fit;
}

/* Descriptors left for shard segments once connections, the shard socket's handouts and the
 * reserve are counted; --max-shards overrides. */
static size_t daemon_shard_budget(const Config *c, unsigned max_connections) {
        struct rlimit rl;
        uint64_t used = (uint64_t) DAEMON_FD_RESERVE + max_connections +
                        SHARD_SOCKET_MAX_CONNECTIONS + SHARD_SOCKET_MAX_TOKENS;

        if (c->max_shards > 0)
                return c->max_shards;
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY)
                return SHARD_TABLE_MAX_TOKENS;
        if (rl.rlim_cur <= used + 16) {
                log_warning("RLIMIT_NOFILE %llu leaves almost no descriptors for shards, "
                            "allowing 16.",
                            (unsigned long long) rl.rlim_cur);
                return 16;
        }
        return MIN((uint64_t) SHARD_TABLE_MAX_TOKENS, rl.rlim_cur - used);
}

static int daemon_load(Daemon *d, const Config *c) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(inventory_done) Inventory inv = {};
        int r;

        r = inventory_probe(c->host_devices, &inv);
        if (r < 0)
                return log_error_errno(r, "Failed to list this node's devices: %m");
        if (inv.n_devices > 0 && streq(inv.devices[0].kind, "cuda"))
                log_info("Devices: %zu CUDA GPU%s.", inv.n_devices, inv.n_devices == 1 ? "" : "s");
        else
                log_info("Devices: %zu host-memory device%s (%s).", inv.n_devices,
                         inv.n_devices == 1 ? "" : "s", inv.why_host);

        ManagerParams params = {
                .devices = inv.devices,
                .n_devices = inv.n_devices,
                .registry_path = c->registry_path,
                .node_name = c->node_name,
                .node_rank = c->node_rank,
                .address = c->listen_address ? c->listen_address : "",
                .host_devices = c->host_devices,
                .shm_budget_bytes = c->shm_budget_bytes,
                .max_builds = c->max_builds,
                .uid_limits = { .builds = c->max_builds_per_uid,
                                .pins = c->max_pins_per_uid,
                                .bytes = c->shm_budget_per_uid_bytes },
                .registry_digest = codec_registry_digest,
        };

        r = random_bytes(&params.boot_tag, sizeof params.boot_tag);
        if (r < 0)
                return log_error_errno(r, "Failed to get random bytes: %m");

        r = manager_new(&params, &d->manager, &diag);
        if (r < 0) /* the words of --check-config and --check-registry too */
                return config_log_registry_failure(c->registry_path, r, &diag);

        /* The same devices the topology lists for this node: a rank's shard goes to the
         * device the topology assigns to it. */
        char why[256];
        huge_pages_set_mode((HugePagesMode) c->huge_pages);
        r = huge_pages_check((HugePagesMode) c->huge_pages, why, sizeof why);
        if (r < 0)
                return log_error_errno(r, "%s", why);
        r = accel_new(inv.devices, inv.n_devices, &d->accel);
        if (r < 0)
                return log_error_errno(r, "Failed to set up shard memory: %m");
        return 0;
}

/* The API socket: the one the service manager passed (socket activation), else bound here. */
static int daemon_open_listener(Daemon *d, const Config *c, const ListenerLimits *limits) {
        int fd, r;

        r = listen_fds_take_socket(d->listen_fds, LISTEN_NAME_API, &fd);
        if (r == -ENOENT) {
                d->socket_path = strdup(c->socket_path);
                if (!d->socket_path)
                        return -ENOMEM;
                return listener_new(c->socket_path, limits, &d->listener);
        }
        if (r < 0)
                return r;
        if (socket_unix_path(fd, &d->socket_path) < 0)
                d->socket_path = strdup("(the inherited API socket)");
        if (!d->socket_path) {
                safe_close(fd);
                return -ENOMEM;
        }
        log_info("Serving the API on the inherited socket %s.", d->socket_path);
        return listener_adopt(fd, limits, &d->listener);
}

/* The shard socket, the same way. An inherited one must have a path: replies name it. */
static int daemon_open_shard_server(Daemon *d, const Config *c) {
        int fd, r;

        r = listen_fds_take_socket(d->listen_fds, LISTEN_NAME_SHARD, &fd);
        if (r == -ENOENT) {
                d->shard_socket_path = strdup(c->shard_socket_path);
                if (!d->shard_socket_path)
                        return -ENOMEM;
                r = shard_server_new(c->shard_socket_path, d->shards, &d->shard_server);
                if (r < 0)
                        return log_error_errno(r, "Failed to serve shards on %s: %m",
                                               c->shard_socket_path);
                return 0;
        }
        if (r < 0)
                return r;
        r = socket_unix_path(fd, &d->shard_socket_path);
        if (r < 0) {
                safe_close(fd);
                return log_error_errno(r, "The inherited shard socket has no path, which Build "
                                          "replies must name: %m");
        }
        log_info("Serving shards on the inherited socket %s.", d->shard_socket_path);
        return shard_server_adopt(fd, d->shards, &d->shard_server);
}

/* The fd store, for the state store: the service manager through sd/. */
static int daemon_fdstore_add(const char *name, int fd) {
        return notify_fdstore_add(name, &fd, 1);
}

static int daemon_fdstore_remove(const char *name) {
        return notify_fdstore_remove(name);
}

/* The fd store's descriptors of one prefix, now the state store's. */
static int daemon_take_fdstore(Daemon *d, const char *prefix, StateFds *into) {
        ListenFd *a = NULL;
        size_t n = 0;
        int r;

        r = listen_fds_take(d->listen_fds, prefix, &a, &n);
        for (size_t i = 0; r >= 0 && i < n; i++)
                r = state_fds_add(into, a[i].name, TAKE_FD(a[i].fd));
        listen_fd_array_free(a, n);
        return r;
}

/* What the previous run kept (the fd store's shard-* and meta* descriptors, or --state-dir)
 * comes back into the manager and the shard table before anything is served. */
static int daemon_setup_state(Daemon *d, const Config *c) {
        StateParams p = {
                .state_dir = c->state_dir,
                .fdstore_max = c->fdstore_max,
                .under_manager = !isempty(getenv("NOTIFY_SOCKET")),
                .fdstore_add = daemon_fdstore_add,
                .fdstore_remove = daemon_fdstore_remove,
        };
        int r;

        r = daemon_take_fdstore(d, LISTEN_PREFIX_FDSTORE_META, &p.records);
        if (r >= 0)
                r = daemon_take_fdstore(d, LISTEN_PREFIX_FDSTORE_SHARD, &p.segments);
        if (r < 0) {
                state_fds_done(&p.records);
                state_fds_done(&p.segments);
                return log_error_errno(r, "Failed to take the fd store's descriptors: %m");
        }
        r = state_new(&p, &d->state);
        if (r < 0)
                return r;
        d->builder = (Builder) {
                .manager = d->manager,
                .shards = d->shards,
                .accel = d->accel,
                .state = d->state,
                .deposits = d->deposits,
        };
        r = build_fill_start(&d->builder, c->fill_threads);
        if (r < 0)
                return log_error_errno(r, "Failed to start the fill threads: %m");
        /* Its hook is set once the server runs (daemon_hook_build_progress). */
        r = build_progress_table_new(NULL, NULL, &d->builder.progress);
        if (r < 0)
                return r;
        r = build_restore(&d->builder);
        if (r < 0)
                return r;
        /* After the restore: restored builds start their grace period now. */
        return build_sharing_start(&d->builder, c->build_grace_ms);
}

/* The manager's hooks: a new topology (on the peer thread) reaches the open watches; a
 * ForgetNode call (on a gRPC worker) goes to the peer thread. */
static void daemon_hook_topology_changed(void *userdata) {
        Daemon *d = userdata;
        server_notify_watches(d->server);
}

/* On a build thread or a fill helper: a build's progress reaches its WatchBuild streams. */
static void daemon_hook_build_progress(void *userdata) {
        Daemon *d = userdata;
        server_notify_watches_of(d->server, RPC_WATCH_BUILD_PATH);
}

/* On the etcd client's thread: the coordinator's reachability changed, which is
 * `familyd.cluster`'s serving status: the health watches push it. */
static void daemon_hook_coordinator_changed(void *userdata) {
        Daemon *d = userdata;
        if (d->server)
                server_notify_watches_of(d->server, RPC_WATCH_HEALTH_PATH);
}

static int daemon_hook_forget(void *userdata, const char *node, FamilyError *ret_error) {
        Daemon *d = userdata;
        if (d->cluster)
                return cluster_etcd_forget(d->cluster, node, ret_error);
        return peer_forget(d->peer, node, ret_error);
}

/* With --coordinator: the membership is etcd's (daemon/cluster/), no peer links. */
static int daemon_start_cluster(Daemon *d, const Config *c) {
        ClusterEtcdParams params = {
                .endpoints = config_coordinator_endpoints(c),
                .cluster = c->cluster,
                .tls_ca_path = c->coordinator_ca,
                .tls_cert_path = c->coordinator_cert,
                .tls_key_path = c->coordinator_key,
                .down_ms = c->down_ms,
                .forget_after_ms = c->forget_after_ms,
                .max_nodes = c->max_nodes,
                .manager = d->manager,
        };
        int r;

        manager_set_hooks(d->manager, &(ManagerHooks) {
                                              .topology_changed = daemon_hook_topology_changed,
                                              .topology_userdata = d,
                                              .forget_node = daemon_hook_forget,
                                              .forget_userdata = d,
                                      });
        r = cluster_etcd_new(&params, &d->cluster);
        if (r < 0) {
                manager_set_hooks(d->manager, NULL);
                return r;
        }
        coordinator_status_on_change(daemon_hook_coordinator_changed, d);
        return 0;
}

/* --cluster-key is read and checked, and --listen off loopback without it refused, before
 * anything is bound: a node that must not start binds nothing. Every start without a key says
 * that peers are not authenticated. */
static int daemon_check_peer_security(Daemon *d, const Config *c) {
        int r = config_check_peer_security(c, &d->keys);
        if (r < 0)
                return r;
        if (c->cluster_key_file && c->listen_address)
                log_info("Peers are authenticated with the cluster key%s of %s.",
                         d->keys.n == 1 ? "" : "s", c->cluster_key_file);
        else if (c->listen_address && !c->cluster_key_file)
                log_warning("Peers are not authenticated (no --cluster-key%s): anyone who "
                            "reaches %s can join the cluster.",
                            c->insecure_peers ? ", --insecure-peers" : "", c->listen_address);
        return 0;
}

/* --cluster-key read again (Reload, SIGHUP): new handshakes use its keys, links already
 * authenticated stay up. A file that fails its checks leaves the keys in use. */
static void daemon_reload_keys(Daemon *d) {
        PeerKeys keys = {};

        if (!d->peer || !d->config->cluster_key_file)
                return;
        if (peer_keys_load(d->config->cluster_key_file, &keys) < 0) {
                log_error("Cluster key file %s not reloaded: keeping the keys in use, ignoring.",
                          d->config->cluster_key_file);
                return;
        }
        peer_set_keys(d->peer, &keys);
        log_info("Cluster key file %s reloaded: %u key%s.", d->config->cluster_key_file, keys.n,
                 keys.n == 1 ? "" : "s");
        peer_keys_wipe(&keys);
}

/* With --listen, this node joins the cluster: its own devices are those of the local
 * topology the manager started with. */
static int daemon_start_peers(Daemon *d, const Config *c) {
        _cleanup_(topology_unrefp) Topology *t = manager_topology(d->manager);
        const Node *local = topology_local_node(t);
        int r;

        if (c->coordinator)
                return daemon_start_cluster(d, c);
        if (!c->listen_address) {
                if (c->peers)
                        return log_error_errno(-EINVAL, "--peers needs --listen: a node that "
                                                        "joins must be reachable itself.");
                /* Alone, the topology still changes: a reload changes this node's registry
                 * digest, which open watches must see. */
                manager_set_hooks(d->manager, &(ManagerHooks) {
                                                      .topology_changed = daemon_hook_topology_changed,
                                                      .topology_userdata = d,
                                              });
                return 0;
        }

        MemberInfo self = {
                .name = local->name,
                .node_rank = local->node_rank,
                .address = (char *) c->listen_address,
                .devices = local->devices,
                .n_devices = local->n_devices,
        };
        PeerParams params = {
                .listen_address = c->listen_address,
                .peers = c->peers,
                .self = &self,
                .heartbeat_ms = c->heartbeat_ms,
                .mode = (ProtocolMode) c->membership,
                .timeouts = {
                        .suspect_ms = c->suspect_ms,
                        .down_ms = c->down_ms,
                        .forget_after_ms = c->forget_after_ms,
                },
                .manager = d->manager,
                .keys = d->keys.n > 0 ? &d->keys : NULL,
                .max_nodes = c->max_nodes,
        };
        manager_set_hooks(d->manager, &(ManagerHooks) {
                                              .topology_changed = daemon_hook_topology_changed,
                                              .topology_userdata = d,
                                              .forget_node = daemon_hook_forget,
                                              .forget_userdata = d,
                                      });
        r = peer_new(&params, &d->peer);
        peer_keys_wipe(&d->keys);
        if (r < 0) {
                manager_set_hooks(d->manager, NULL);
                return log_error_errno(r, "Failed to start the peer layer on %s: %m",
                                       c->listen_address);
        }
        /* Every daemon of a cluster must run the same protocol: the log says which. */
        log_info("Membership: %s, heartbeat %u ms, suspect after %u ms, down after %u ms.",
                 protocol_mode_to_string(params.mode), c->heartbeat_ms, c->suspect_ms,
                 c->down_ms);
        return 0;
}

/* The rpc layer's hooks, on gRPC workers: the Reload RPC, told to the service manager. */
static void daemon_hook_reload_begin(void *userdata) {
        Daemon *d = userdata;
        notifier_reload_begin(d->notifier);
}

static void daemon_hook_reload_end(void *userdata, int result) {
        Daemon *d = userdata;
        daemon_reload_keys(d);
        notifier_reload_end(d->notifier, result);
        metrics_reload_done(result);
}

static void daemon_reload(Daemon *d) {
        _cleanup_(load_diagnostics_done) LoadDiagnostics diag = {};
        _cleanup_(registry_unrefp) Registry *reg = NULL;

        notifier_reload_begin(d->notifier);
        int r = manager_reload(d->manager, &reg, &diag);
        daemon_reload_keys(d);
        notifier_reload_end(d->notifier, r);
        metrics_reload_done(r);
        if (r < 0) {
                for (size_t i = 0; i < diag.n; i++)
                        log_error("%s", diag.lines[i]);
                log_error_errno(r, "Registry reload on SIGHUP failed, keeping generation "
                                   "%" PRIu64 ", ignoring.",
                                manager_registry_generation(d->manager));
                return;
        }
        char generation[32];
        (void) snprintf(generation, sizeof generation, "%" PRIu64, reg->generation);
        log_struct(LOG_INFO, 0, LOG_FIELDS(LOG_FIELD("REGISTRY_GENERATION", generation)),
                   "Registry reloaded on SIGHUP: generation %" PRIu64 ", %zu families.",
                   reg->generation, reg->n_families);
}

static int daemon_on_reload(sd_event_source *source, const struct signalfd_siginfo *si,
                            void *userdata) {
        daemon_reload(userdata);
        return 0;
}

static int daemon_on_stop(sd_event_source *source, const struct signalfd_siginfo *si,
                          void *userdata) {
        Daemon *d = userdata;

        log_info("Received %s, stopping.", si->ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
        notifier_stopping(d->notifier);
        return sd_event_exit(d->event, 0);
}

/* Stops (or resumes) watching the API socket; resuming is the pause timer's job. */
static void daemon_watch_listener(Daemon *d, bool watch) {
        int r = sd_event_source_set_enabled(d->api_io, watch ? SD_EVENT_ON : SD_EVENT_OFF);
        if (r >= 0 && !watch)
                r = sd_event_source_set_time_relative(d->accept_resume,
                                                      DAEMON_ACCEPT_PAUSE_MS * 1000ull);
        if (r >= 0 && !watch)
                r = sd_event_source_set_enabled(d->accept_resume, SD_EVENT_ONESHOT);
        if (r < 0) {
                log_warning_errno(r, "Failed to %s watching the API socket, ignoring: %m",
                                  watch ? "resume" : "pause");
                (void) sd_event_source_set_enabled(d->api_io, SD_EVENT_ON);
        }
}

static int daemon_on_accept_resume(sd_event_source *source, uint64_t usec, void *userdata) {
        daemon_watch_listener(userdata, true);
        return 0;
}

/* The loop and the signals it handles: they are blocked already (sd-event requires it). */
/* --admin-group's gid, or (gid_t) -1 without one. */
static int daemon_admin_gid(const Config *c, gid_t *ret) {
        struct group *g;

        *ret = (gid_t) -1;
        if (isempty(c->admin_group))
                return 0;
        errno = 0;
        g = getgrnam(c->admin_group);
        if (!g)
                return log_error_errno(errno > 0 ? -errno : -ENOENT,
                                       "Unknown group '%s' (--admin-group), refusing to start",
                                       c->admin_group);
        *ret = g->gr_gid;
        return 0;
}

static int daemon_setup_loop(Daemon *d) {
        int r;

        r = sd_event_new(&d->event);
        if (r >= 0)
                r = sd_event_add_signal(d->event, NULL, SIGHUP, daemon_on_reload, d);
        if (r >= 0)
                r = sd_event_add_signal(d->event, NULL, SIGTERM, daemon_on_stop, d);
        if (r >= 0)
                r = sd_event_add_signal(d->event, NULL, SIGINT, daemon_on_stop, d);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the main loop: %m");
        return 0;
}

static void daemon_accept(Daemon *d) {
        for (;;) {
                RpcRefusal refusal;
                int fd, r;

                r = listener_accept(d->listener, &fd, &refusal);
                if (r == -EAGAIN)
                        return;
                if (r == -EDQUOT)
                        continue;
                if (r < 0) {
                        /* The connection is still queued and would wake the loop at once. */
                        if (!d->accept_failing && r != -EMFILE && r != -ENFILE)
                                log_warning_errno(r, "Failed to accept a connection, pausing "
                                                     "for %d ms: %m",
                                                  DAEMON_ACCEPT_PAUSE_MS);
                        d->accept_failing = true;
                        daemon_watch_listener(d, false);
                        return;
                }
                d->accept_failing = false;
                server_add_connection(d->server, fd, &refusal);
        }
}

static int daemon_on_api_io(sd_event_source *source, int fd, uint32_t revents,
                            void *userdata) {
        daemon_accept(userdata);
        return 0;
}

/* The API socket, the watchdog's timer and the heap trim join the loop. */
static int daemon_watch(Daemon *d) {
        int r;

        r = sd_event_add_io(d->event, &d->api_io, listener_fd(d->listener), EPOLLIN,
                            daemon_on_api_io, d);
        if (r < 0)
                return log_error_errno(r, "Failed to watch the API socket: %m");
        r = sd_event_add_time_relative(d->event, &d->accept_resume, CLOCK_MONOTONIC,
                                       DAEMON_ACCEPT_PAUSE_MS * 1000ull, 0,
                                       daemon_on_accept_resume, d);
        if (r >= 0)
                r = sd_event_source_set_enabled(d->accept_resume, SD_EVENT_OFF);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the accept pause timer: %m");
        r = notifier_attach(d->notifier, d->event);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the watchdog timer: %m");
        r = heap_trim_attach(d->event, &d->heap_trim);
        if (r < 0)
                return log_error_errno(r, "Failed to set up the heap trim timer: %m");
        return 0;
}

int daemon_new(const Config *c, Daemon **ret) {
        _cleanup_(daemon_freep) Daemon *d = NULL;
        sigset_t mask;
        gid_t admin_gid;
        int r;

        d = calloc(1, sizeof *d);
        if (!d)
                return -ENOMEM;
        d->config = c;
        journal_log_install();

        /* First: a unit that passes what we do not understand fails before any work. */
        r = listen_fds_new(&d->listen_fds);
        if (r < 0)
                return r;
        r = daemon_check_peer_security(d, c);
        if (r < 0)
                return r;

        ListenerLimits limits = {
                .max_connections = daemon_setup_fd_limit(c->max_connections),
                .max_per_peer = c->max_connections_per_process,
                .max_per_uid = c->max_connections_per_uid,
        };

        r = daemon_admin_gid(c, &admin_gid);
        if (r < 0)
                return r;
        r = daemon_load(d, c);
        if (r < 0)
                return r;

        r = notifier_new(d->manager, &d->notifier);
        if (r < 0)
                return r;

        /* Block the signals before gRPC starts its threads, so they inherit the mask and the
         * signals reach only the main loop. */
        sigemptyset(&mask);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        sigaddset(&mask, SIGHUP);
        sigaddset(&mask, SIGPIPE);
        r = -pthread_sigmask(SIG_BLOCK, &mask, NULL);
        if (r < 0)
                return log_error_errno(r, "Failed to block signals: %m");
        r = daemon_setup_loop(d);
        if (r < 0)
                return r;

        r = daemon_open_listener(d, c, &limits);
        if (r < 0)
                return r;

        r = shard_table_new(daemon_shard_budget(c, limits.max_connections), &d->shards);
        if (r < 0)
                return log_error_errno(r, "Failed to create the shard table: %m");
        r = checkpoint_deposits_new(&d->deposits);
        if (r < 0)
                return log_error_errno(r, "Failed to create the checkpoint deposits: %m");
        r = daemon_setup_state(d, c);
        if (r < 0)
                return r;
        r = daemon_open_shard_server(d, c);
        if (r < 0)
                return r;
        shard_server_set_admin_gid(d->shard_server, admin_gid);
        shard_server_set_checkpoint_deposits(d->shard_server, d->deposits);

        r = executor_new(DAEMON_BUILD_THREADS, DAEMON_BUILD_QUEUE, &d->executor);
        if (r < 0)
                return log_error_errno(r, "Failed to start the build threads: %m");

        ServerParams sp = {
                .manager = d->manager,
                .executor = d->executor,
                .shards = d->shards,
                .shard_socket = d->shard_socket_path,
                .threads = c->threads,
                .max_request_bytes = FAMILYD_MAX_REQUEST_BYTES,
                .connection_idle_ms = c->connection_idle_ms,
                .max_watches = c->max_watches,
                .max_watches_per_process = c->max_watches_per_process,
                .queue_limits = { .per_connection = c->max_queued_bytes_per_connection,
                                  .total = c->max_queued_bytes },
                .admin_gid = admin_gid,
                .hooks = { .reload_begin = daemon_hook_reload_begin,
                           .reload_end = daemon_hook_reload_end,
                           .userdata = d,
                           .builder = &d->builder },
        };
        r = server_new(&sp, &d->server);
        if (r < 0)
                return log_error_errno(r, "Failed to start the gRPC server: %m");
        build_progress_table_set_changed(d->builder.progress, daemon_hook_build_progress, d);

        r = daemon_watch(d);
        if (r < 0)
                return r;

        r = daemon_start_peers(d, c);
        if (r < 0)
                return r;

        /* Last, with the signals blocked: its thread reads what the above set up. */
        if (c->metrics_listen) {
                MetricsSources src = { .manager = d->manager, .builder = &d->builder,
                                       .shard_server = d->shard_server };
                r = metrics_server_new(c->metrics_listen, &src, &d->metrics);
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(d);
        return 0;
}

Daemon *daemon_free(Daemon *d) {
        if (!d)
                return NULL;
        /* First: its thread reads the manager and the builds. */
        metrics_server_free(d->metrics);
        /* No more topology pushes into a server that is going away; forgetting stays until
         * the server has drained, since a ForgetNode call may still be running. */
        if (d->peer || d->cluster)
                manager_set_hooks(d->manager, &(ManagerHooks) {
                                                      .forget_node = daemon_hook_forget,
                                                      .forget_userdata = d,
                                              });
        else if (d->manager)
                manager_set_hooks(d->manager, NULL);
        /* Stop gRPC first: its workers may still be inside the manager. Pending Builds are
         * calls too: the executor, told to stop, answers them at once so the server drains;
         * then the shard server, before the builds whose segments it hands out go. */
        executor_stop(d->executor);
        /* Fills still under way tell nobody from here on, nor does etcd's reachability. */
        build_progress_table_set_changed(d->builder.progress, NULL, NULL);
        coordinator_status_on_change(NULL, NULL);
        server_free(d->server);
        if (d->manager) /* NULL when daemon_new failed before loading the registry */
                manager_set_hooks(d->manager, NULL);
        peer_free(d->peer);
        cluster_etcd_free(d->cluster);
        executor_free(d->executor);
        /* After the server and the executor: no Build is in flight; before the tables. */
        build_sharing_stop(&d->builder);
        build_progress_table_free(d->builder.progress);
        shard_server_free(d->shard_server);
        /* After the shard server and the Builds: nothing deposits or opens any more. */
        checkpoint_deposits_free(d->deposits);
        shard_table_unref(d->shards);
        listener_free(d->listener);
        /* After the server: its workers call the reload hooks; before the manager it reads. */
        notifier_free(d->notifier); /* with its timer on d->event */
        manager_free(d->manager);
        /* After the manager: its mesh table calls into the state until it is freed. */
        state_free(d->state);
        /* After the builds: their GPU shards go back through it. */
        accel_unref(d->accel);
        listen_fds_free(d->listen_fds);
        peer_keys_wipe(&d->keys);
        free(d->socket_path);
        free(d->shard_socket_path);
        sd_event_source_disable_unref(d->api_io);
        sd_event_source_disable_unref(d->accept_resume);
        heap_trim_free(d->heap_trim);
        sd_event_unref(d->event);
        return mfree(d);
}

int daemon_run(Daemon *d) {
        int r;

        log_info("familyd serving %s (node %s, registry %s).", d->socket_path,
                 d->config->node_name, d->config->registry_path);
        /* The registry is loaded, both sockets listen and the gRPC server runs: connections
         * made from now on are accepted by this loop. */
        notifier_ready(d->notifier);

        r = sd_event_loop(d->event);
        if (r < 0)
                return log_error_errno(r, "The main loop failed: %m");
        return 0;
}

/* cluster-table.c: the cluster's members as the etcd prefix holds them, and the topology they make. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster-table.h"
#include "common/log.h"
#include "coord/coord-member.h"
#include "core/resource-limits.h"

typedef struct ClusterEntry {
        char *name;
        bool has_record;
        CoordMember record;
        int64_t create_revision; /* of the record */
        bool alive;
        int64_t changed_ms;      /* CLOCK_MONOTONIC: when alive last changed here */
        int64_t changed_unix_ms;
        bool rank_refusal_logged; /* for this value of the record */
        bool full_refusal_logged; /* likewise: past max_nodes */
} ClusterEntry;

struct ClusterTable {
        char *prefix, *members_prefix, *alive_prefix;
        char *cluster;
        Node local;
        size_t max_nodes;
        ClusterEntry *entries;
        size_t n_entries, allocated;
        uint64_t version;
        bool dirty;
};

static bool startswith(const char *s, const char *prefix) {
        return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void entry_done(ClusterEntry *e) {
        free(e->name);
        coord_member_done(&e->record);
        *e = (ClusterEntry) {};
}

int cluster_table_new(const char *prefix, const char *cluster, const Node *local,
                      size_t max_nodes, ClusterTable **ret) {
        _cleanup_(cluster_table_freep) ClusterTable *t = calloc(1, sizeof(ClusterTable));
        int r;

        if (!t)
                return -ENOMEM;
        t->prefix = strdup(prefix);
        t->cluster = strdup(cluster);
        if (!t->prefix || !t->cluster || asprintf(&t->members_prefix, "%smembers/", prefix) < 0 ||
            asprintf(&t->alive_prefix, "%salive/", prefix) < 0)
                return -ENOMEM;
        r = node_copy(local, &t->local);
        if (r < 0)
                return r;
        t->local.state = NODE_UP;
        t->local.local = true;
        t->max_nodes = max_nodes > 0 ? max_nodes : FAMILYD_MAX_PEERS;
        t->dirty = true;
        *ret = TAKE_PTR(t);
        return 0;
}

ClusterTable *cluster_table_free(ClusterTable *t) {
        if (!t)
                return NULL;
        for (size_t i = 0; i < t->n_entries; i++)
                entry_done(&t->entries[i]);
        free(t->entries);
        node_done(&t->local);
        free(t->prefix);
        free(t->members_prefix);
        free(t->alive_prefix);
        free(t->cluster);
        return mfree(t);
}

static ClusterEntry *entry_find(const ClusterTable *t, const char *name) {
        for (size_t i = 0; i < t->n_entries; i++)
                if (streq(t->entries[i].name, name))
                        return &t->entries[i];
        return NULL;
}

static ClusterEntry *entry_get(ClusterTable *t, const char *name, int64_t now_ms,
                               int64_t now_unix_ms) {
        ClusterEntry *e = entry_find(t, name);

        if (e)
                return e;
        if (!GREEDY_REALLOC(t->entries, t->allocated, t->n_entries + 1))
                return NULL;
        e = &t->entries[t->n_entries];
        *e = (ClusterEntry) { .name = strdup(name), .changed_ms = now_ms,
                              .changed_unix_ms = now_unix_ms };
        if (!e->name)
                return NULL;
        t->n_entries++;
        return e;
}

/* An entry with neither a record nor an alive key is gone. */
static void entry_drop_if_empty(ClusterTable *t, ClusterEntry *e) {
        if (e->has_record || e->alive)
                return;
        entry_done(e);
        *e = t->entries[--t->n_entries];
}

/* `alive/<name>` came or went. */
static void apply_alive(ClusterTable *t, const CoordEvent *e, const char *name, int64_t now_ms,
                        int64_t now_unix_ms) {
        bool alive = e->type == COORD_EVENT_PUT;
        ClusterEntry *entry;

        if (isempty(name) || strchr(name, '/') || strlen(name) > FAMILYD_MAX_NAME_LENGTH)
                return; /* not a name a daemon could have: nothing to do with it */
        entry = alive ? entry_get(t, name, now_ms, now_unix_ms) : entry_find(t, name);
        if (!entry) {
                if (alive)
                        log_error("Out of memory noting %s, ignoring", e->key);
                return;
        }
        if (entry->alive != alive) {
                entry->alive = alive;
                entry->changed_ms = now_ms;
                entry->changed_unix_ms = now_unix_ms;
        }
        entry_drop_if_empty(t, entry);
}

/* `members/<name>` was put (decoded strictly, refused with one line) or deleted. */
static void apply_member(ClusterTable *t, const CoordEvent *e, const char *name, int64_t now_ms,
                         int64_t now_unix_ms) {
        _cleanup_(coord_member_done) CoordMember m = {};
        ClusterEntry *entry;
        bool ok = false;

        if (e->type == COORD_EVENT_PUT && coord_member_from_event(e, t->members_prefix, &m) >= 0) {
                ok = streq(m.cluster, t->cluster);
                if (!ok)
                        log_warning("Refusing the member record %s: it is of cluster '%s', "
                                    "not '%s', ignoring",
                                    e->key, m.cluster, t->cluster);
        }
        /* A record refused, or deleted, leaves no member behind. */
        entry = ok ? entry_get(t, name, now_ms, now_unix_ms) : entry_find(t, name);
        if (!entry) {
                if (ok)
                        log_error("Out of memory keeping %s, ignoring", e->key);
                return;
        }
        coord_member_done(&entry->record);
        entry->has_record = ok;
        entry->rank_refusal_logged = false;
        entry->full_refusal_logged = false;
        if (ok) {
                entry->record = m;
                m = (CoordMember) {};
                entry->create_revision = e->create_revision;
        }
        entry_drop_if_empty(t, entry);
}

void cluster_table_apply(ClusterTable *t, const CoordEvent *e, int64_t now_ms,
                         int64_t now_unix_ms) {
        if (e->type == COORD_EVENT_RESET) {
                for (size_t i = 0; i < t->n_entries; i++)
                        entry_done(&t->entries[i]);
                t->n_entries = 0;
                t->dirty = true;
                return;
        }
        if (!e->key || !startswith(e->key, t->prefix))
                return;
        if (e->mod_revision > 0 && (uint64_t) e->mod_revision > t->version)
                t->version = (uint64_t) e->mod_revision;
        t->dirty = true;
        if (startswith(e->key, t->alive_prefix))
                apply_alive(t, e, e->key + strlen(t->alive_prefix), now_ms, now_unix_ms);
        else if (startswith(e->key, t->members_prefix))
                apply_member(t, e, e->key + strlen(t->members_prefix), now_ms, now_unix_ms);
}

bool cluster_table_dirty(const ClusterTable *t) {
        return t->dirty;
}

static int compare_by_creation(const void *a, const void *b) {
        const ClusterEntry *const *x = a, *const *y = b;

        if ((*x)->create_revision != (*y)->create_revision)
                return (*x)->create_revision < (*y)->create_revision ? -1 : 1;
        return strcmp((*x)->name, (*y)->name);
}

/* The node of an entry whose record the table takes. */
static int node_of_entry(const ClusterEntry *e, int64_t now_unix_ms, Node *ret) {
        Node n = {
                .node_rank = e->record.node_rank,
                .state = e->alive ? NODE_UP : NODE_DOWN,
                .last_seen_unix_ms = e->alive ? now_unix_ms : e->changed_unix_ms,
        };
        int r;

        memcpy(n.registry_digest, e->record.registry_digest, sizeof n.registry_digest);
        n.name = strdup(e->name);
        n.address = strdup("");
        if (!n.name || !n.address) {
                node_done(&n);
                return -ENOMEM;
        }
        if (e->record.n_devices > 0) {
                n.devices = calloc(e->record.n_devices, sizeof(Device));
                if (!n.devices) {
                        node_done(&n);
                        return -ENOMEM;
                }
        }
        for (size_t d = 0; d < e->record.n_devices; d++) {
                r = device_copy(&e->record.devices[d], &n.devices[d]);
                if (r < 0) {
                        node_done(&n);
                        return r;
                }
                n.n_devices++;
        }
        *ret = n;
        return 0;
}

/* Who holds rank among nodes[0..n), or NULL. */
static const char *rank_holder(const Node *nodes, size_t n, int64_t rank) {
        for (size_t i = 0; i < n; i++)
                if (nodes[i].node_rank == rank)
                        return nodes[i].name;
        return NULL;
}

/* Oldest record first: of two holding one node rank, the older stays, and past max_nodes the
 * newer records wait. The local node holds its own rank and its place whatever its record's
 * age: it cannot leave its own topology. */
static int collect_nodes(ClusterTable *t, int64_t now_unix_ms, Node *nodes, size_t *n) {
        _cleanup_free_ ClusterEntry **order = calloc(MAX(t->n_entries, (size_t) 1),
                                                     sizeof(ClusterEntry *));
        size_t k = 0;
        int r;

        if (!order)
                return -ENOMEM;
        for (size_t i = 0; i < t->n_entries; i++)
                if (t->entries[i].has_record && !streq(t->entries[i].name, t->local.name))
                        order[k++] = &t->entries[i];
        qsort(order, k, sizeof(ClusterEntry *), compare_by_creation);
        for (size_t i = 0; i < k; i++) {
                ClusterEntry *e = order[i];
                const char *holder = e->record.node_rank < 0 ? NULL :
                                     rank_holder(nodes, *n, e->record.node_rank);

                if (holder) {
                        if (!e->rank_refusal_logged)
                                log_warning("Refusing the member record %s%s: node rank %lld "
                                            "is held by %s, whose record is older, ignoring",
                                            t->members_prefix, e->name,
                                            (long long) e->record.node_rank, holder);
                        e->rank_refusal_logged = true;
                        continue;
                }
                if (*n >= t->max_nodes) {
                        if (!e->full_refusal_logged)
                                log_warning("Refusing the member record %s%s: the cluster has "
                                            "--max-nodes %zu members with older records, ignoring",
                                            t->members_prefix, e->name, t->max_nodes);
                        e->full_refusal_logged = true;
                        continue;
                }
                e->full_refusal_logged = false; /* a member now: a later refusal is news */
                r = node_of_entry(e, now_unix_ms, &nodes[*n]);
                if (r < 0)
                        return r;
                (*n)++;
        }
        return 0;
}

int cluster_table_topology(ClusterTable *t, int64_t now_unix_ms, Topology **ret) {
        Node *nodes = calloc(t->n_entries + 1, sizeof(Node));
        size_t n = 0;
        int r;

        if (!nodes)
                return -ENOMEM;
        r = node_copy(&t->local, &nodes[n]);
        if (r >= 0) {
                nodes[n++].last_seen_unix_ms = now_unix_ms;
                r = collect_nodes(t, now_unix_ms, nodes, &n);
        }
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        node_done(&nodes[i]);
                free(nodes);
                return r;
        }
        t->dirty = false;
        return topology_new(nodes, n, t->local.name, t->version, ret);
}

ClusterNodeState cluster_table_state(const ClusterTable *t, const char *name) {
        const ClusterEntry *e = entry_find(t, name);

        if (!e || !e->has_record)
                return CLUSTER_NODE_ABSENT;
        return e->alive ? CLUSTER_NODE_UP : CLUSTER_NODE_DOWN;
}

bool cluster_table_has_own_record(const ClusterTable *t) {
        const ClusterEntry *e = entry_find(t, t->local.name);

        return e && e->has_record;
}

/* The topology's order: configured node ranks first, then names. */
static bool node_before(int64_t rank_a, const char *name_a, int64_t rank_b, const char *name_b) {
        if ((rank_a >= 0) != (rank_b >= 0))
                return rank_a >= 0;
        if (rank_a != rank_b)
                return rank_a < rank_b;
        return strcmp(name_a, name_b) < 0;
}

char *cluster_table_next_to_forget(ClusterTable *t, int64_t now_ms, uint64_t after_ms) {
        ClusterEntry *due = NULL;

        if (after_ms == 0)
                return NULL;
        for (size_t i = 0; i < t->n_entries; i++) {
                ClusterEntry *e = &t->entries[i];

                /* Someone up comes before this node: forgetting is theirs. */
                if (e->has_record && e->alive && !streq(e->name, t->local.name) &&
                    node_before(e->record.node_rank, e->name, t->local.node_rank, t->local.name))
                        return NULL;
                if (!due && e->has_record && !e->alive && !streq(e->name, t->local.name) &&
                    now_ms - e->changed_ms >= (int64_t) after_ms)
                        due = e;
        }
        if (!due)
                return NULL;
        due->changed_ms = now_ms;
        return strdup(due->name);
}

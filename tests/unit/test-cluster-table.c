/* test-cluster-table.c: etcd mode's table of the prefix: states, refusals, order, version, forgetting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cluster/cluster-table.h"
#include "codec/codec-coord-member.h"

#define PREFIX "/familyd/c1/"

static Device host = { .local_index = 0, .kind = "host", .name = "host0", .uuid = "",
                       .pci_bus_id = "", .numa_node = -1 };

static ClusterTable *table_new_max(const char *local, int64_t rank, size_t max_nodes) {
        Node n = { .name = (char *) local, .address = (char *) "", .node_rank = rank,
                   .devices = &host, .n_devices = 1 };
        ClusterTable *t = NULL;

        assert_int_equal(cluster_table_new(PREFIX, "c1", &n, max_nodes, &t), 0);
        return t;
}

static ClusterTable *table_new(const char *local, int64_t rank) {
        return table_new_max(local, rank, 0);
}

/* members/<name>: a record of cluster `cluster`, created at create_revision, put at rev. */
static void put_member(ClusterTable *t, const char *name, int64_t rank, const char *cluster,
                       int64_t create_revision, int64_t rev, int64_t now) {
        CoordMember m = { .name = (char *) name, .node_rank = rank, .devices = &host,
                          .n_devices = 1 };
        char key[128];
        uint8_t *buf = NULL;
        size_t size;

        (void) snprintf(m.cluster, sizeof m.cluster, "%s", cluster);
        assert_int_equal(codec_coord_member_encode(&m, &buf, &size), 0);
        (void) snprintf(key, sizeof key, PREFIX "members/%s", name);
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_PUT, .key = key, .value = buf,
                                               .value_size = size, .mod_revision = rev,
                                               .create_revision = create_revision },
                            now, 1000 * now);
        free(buf);
}

static void alive(ClusterTable *t, const char *name, bool up, int64_t rev, int64_t now) {
        char key[128];

        (void) snprintf(key, sizeof key, PREFIX "alive/%s", name);
        cluster_table_apply(t, &(CoordEvent) { .type = up ? COORD_EVENT_PUT : COORD_EVENT_DELETE,
                                               .key = key, .value = (const uint8_t *) "1",
                                               .value_size = up, .mod_revision = rev,
                                               .create_revision = up ? rev : 0 },
                            now, 1000 * now);
}

static Topology *topology(ClusterTable *t) {
        Topology *top = NULL;

        assert_int_equal(cluster_table_topology(t, 0, &top), 0);
        return top;
}

static void test_states_order_and_version(void **state) {
        _cleanup_(cluster_table_freep) ClusterTable *t = table_new("b", 1);
        _cleanup_(topology_unrefp) Topology *top = NULL;

        put_member(t, "c", -1, "c1", 5, 5, 0);
        put_member(t, "a", 0, "c1", 6, 6, 0);
        alive(t, "a", true, 7, 0);
        alive(t, "zombie", true, 8, 0); /* an alive key without a record: not a node */
        assert_true(cluster_table_dirty(t));
        top = topology(t);
        assert_false(cluster_table_dirty(t));
        assert_int_equal(top->version, 8);
        assert_int_equal(top->n_nodes, 3);
        assert_string_equal(top->nodes[0].name, "a");
        assert_int_equal(top->nodes[0].state, NODE_UP);
        assert_string_equal(top->nodes[1].name, "b");
        assert_true(top->nodes[1].local);
        assert_int_equal(top->nodes[1].state, NODE_UP);
        assert_string_equal(top->nodes[2].name, "c"); /* no rank: after the ranked ones */
        assert_int_equal(top->nodes[2].state, NODE_DOWN);
        assert_int_equal(top->world_size, 3);
        assert_int_equal(cluster_table_state(t, "a"), CLUSTER_NODE_UP);
        assert_int_equal(cluster_table_state(t, "c"), CLUSTER_NODE_DOWN);
        assert_int_equal(cluster_table_state(t, "zombie"), CLUSTER_NODE_ABSENT);
        assert_false(cluster_table_has_own_record(t));

        /* The version never goes back; a RESET empties the table. */
        alive(t, "a", false, 9, 0);
        assert_int_equal(cluster_table_state(t, "a"), CLUSTER_NODE_DOWN);
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_RESET, .mod_revision = 3 }, 0, 0);
        put_member(t, "b", 1, "c1", 4, 4, 0);
        topology_unref(top);
        top = topology(t);
        assert_int_equal(top->version, 9);
        assert_int_equal(top->n_nodes, 1);
        assert_true(cluster_table_has_own_record(t));
}

static void test_refusals(void **state) {
        _cleanup_(cluster_table_freep) ClusterTable *t = table_new("local", 0);
        _cleanup_(topology_unrefp) Topology *top = NULL;

        /* Rank 1: "late" arrives first but was created later; the older "early" keeps it. */
        put_member(t, "late", 1, "c1", 20, 20, 0);
        put_member(t, "early", 1, "c1", 10, 21, 0);
        put_member(t, "thief", 0, "c1", 5, 22, 0);   /* the local node's rank */
        put_member(t, "other", 2, "c2", 23, 23, 0);  /* another cluster's record */
        top = topology(t);
        assert_int_equal(top->n_nodes, 2);
        assert_string_equal(top->nodes[0].name, "local");
        assert_string_equal(top->nodes[1].name, "early");
        assert_int_equal(cluster_table_state(t, "other"), CLUSTER_NODE_ABSENT);

        /* "early" goes: "late" takes rank 1. A record overwritten with garbage is gone. */
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_DELETE,
                                               .key = PREFIX "members/early", .mod_revision = 24 },
                            0, 0);
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_PUT,
                                               .key = PREFIX "members/thief",
                                               .value = (const uint8_t *) "\xff\xff", .value_size = 2,
                                               .mod_revision = 25, .create_revision = 5 },
                            0, 0);
        topology_unref(top);
        top = topology(t);
        assert_int_equal(top->version, 25);
        assert_int_equal(top->n_nodes, 2);
        assert_string_equal(top->nodes[1].name, "late");
        assert_int_equal(cluster_table_state(t, "thief"), CLUSTER_NODE_ABSENT);

        /* Keys that are neither records nor alive keys, or outside the prefix: ignored. */
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_PUT, .key = PREFIX "other/x",
                                               .mod_revision = 26 }, 0, 0);
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_PUT, .key = "/elsewhere/x",
                                               .mod_revision = 27 }, 0, 0);
        alive(t, "a/b", true, 28, 0);
        topology_unref(top);
        top = topology(t);
        assert_int_equal(top->n_nodes, 2);
        assert_int_equal(top->version, 28);
}

/* --max-nodes 3: the local node and the two oldest records; a newer one waits for a place. */
static void test_max_nodes(void **state) {
        _cleanup_(cluster_table_freep) ClusterTable *t = table_new_max("local", -1, 3);
        _cleanup_(topology_unrefp) Topology *top = NULL;

        put_member(t, "local", -1, "c1", 1, 1, 0); /* its own record is the newest but stays */
        put_member(t, "d", -1, "c1", 40, 40, 0);
        put_member(t, "b", -1, "c1", 20, 41, 0);
        put_member(t, "c", -1, "c1", 30, 42, 0);
        put_member(t, "a", -1, "c1", 10, 43, 0);
        top = topology(t);
        assert_int_equal(top->n_nodes, 3);
        assert_string_equal(top->nodes[0].name, "a");
        assert_string_equal(top->nodes[1].name, "b");
        assert_string_equal(top->nodes[2].name, "local");

        /* "a" forgotten: "c", the oldest waiting, takes its place; "d" still waits. */
        cluster_table_apply(t, &(CoordEvent) { .type = COORD_EVENT_DELETE,
                                               .key = PREFIX "members/a", .mod_revision = 44 },
                            0, 0);
        topology_unref(top);
        top = topology(t);
        assert_int_equal(top->n_nodes, 3);
        assert_string_equal(top->nodes[0].name, "b");
        assert_string_equal(top->nodes[1].name, "c");
        assert_string_equal(top->nodes[2].name, "local");
}

static void test_forgetting_is_for_the_first_node_up(void **state) {
        _cleanup_(cluster_table_freep) ClusterTable *t = table_new("n1", 1);
        _cleanup_free_ char *due = NULL;

        put_member(t, "n0", 0, "c1", 1, 1, 0);
        put_member(t, "n2", 2, "c1", 2, 2, 0);
        alive(t, "n0", true, 3, 0);
        alive(t, "n2", true, 4, 0);
        alive(t, "n2", false, 5, 100);
        /* n0 is up and comes first: not ours. */
        assert_null(cluster_table_next_to_forget(t, 10000, 1000));
        alive(t, "n0", false, 6, 200);
        assert_null(cluster_table_next_to_forget(t, 10000, 0));      /* never */
        assert_null(cluster_table_next_to_forget(t, 1000, 1000));    /* not long enough */
        due = cluster_table_next_to_forget(t, 1100, 1000);
        assert_non_null(due);
        assert_string_equal(due, "n2");
        /* Its clock restarted: tried again only after_ms later. */
        free(TAKE_PTR(due));
        assert_null(cluster_table_next_to_forget(t, 1150, 1000));
        due = cluster_table_next_to_forget(t, 1250, 1000);
        assert_string_equal(due, "n0");
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_states_order_and_version),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_max_nodes),
                cmocka_unit_test(test_forgetting_is_for_the_first_node_up),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

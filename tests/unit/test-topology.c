/* test-topology.c: the local topology, rank lookups and reference counting. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <cmocka.h>

#include "common/macro.h"
#include "core/topology.h"

static void test_node_state_names(void **state) {
        assert_string_equal(node_state_to_string(NODE_UP), "up");
        assert_string_equal(node_state_to_string(NODE_SUSPECT), "suspect");
        assert_string_equal(node_state_to_string(NODE_DOWN), "down");
        assert_null(node_state_to_string(_NODE_STATE_MAX));
        assert_null(node_state_to_string(_NODE_STATE_INVALID));
}

static void test_local_topology(void **state) {
        _cleanup_(topology_unrefp) Topology *t = NULL;

        assert_int_equal(topology_new_local("node-a", 3, "10.0.0.1:7000", 8, UINT64_C(1) << 30, &t), 0);
        assert_non_null(t);
        assert_int_equal(t->version, 1);
        assert_int_equal(t->world_size, 8);
        assert_int_equal(t->n_nodes, 1);
        assert_int_equal(t->local, 0);

        const Node *n = topology_local_node(t);
        assert_ptr_equal(n, &t->nodes[0]);
        assert_string_equal(n->name, "node-a");
        assert_string_equal(n->address, "10.0.0.1:7000");
        assert_int_equal(n->node_rank, 3);
        assert_int_equal(n->first_rank, 0);
        assert_int_equal(n->state, NODE_UP);
        assert_true(n->local);
        assert_true(n->last_seen_unix_ms > 0);
        assert_int_equal(n->n_devices, 8);

        for (size_t i = 0; i < n->n_devices; i++) {
                const Device *d = &n->devices[i];
                char name[32];

                snprintf(name, sizeof name, "host%zu", i);
                assert_int_equal(d->local_index, (int32_t) i);
                assert_string_equal(d->kind, "host");
                assert_string_equal(d->name, name);
                assert_int_equal(d->numa_node, -1);
                assert_int_equal(d->memory_bytes, UINT64_C(1) << 30);
                assert_non_null(d->uuid);
                assert_non_null(d->pci_bus_id);
        }
}

static void test_rank_lookup(void **state) {
        _cleanup_(topology_unrefp) Topology *t = NULL;
        int32_t dev = -7;

        assert_int_equal(topology_new_local("n", -1, NULL, 4, 0, &t), 0);
        assert_string_equal(t->nodes[0].address, "");
        assert_int_equal(t->nodes[0].node_rank, -1);

        for (int64_t r = 0; r < 4; r++) {
                assert_ptr_equal(topology_node_of_rank(t, r, &dev), &t->nodes[0]);
                assert_int_equal(dev, r);
        }
        assert_non_null(topology_node_of_rank(t, 2, NULL));

        dev = -7;
        assert_null(topology_node_of_rank(t, 4, &dev));
        assert_null(topology_node_of_rank(t, -1, &dev));
        assert_null(topology_node_of_rank(t, INT64_MAX, &dev));
        assert_null(topology_node_of_rank(t, INT64_MIN, &dev));
        /* Written only on success. */
        assert_int_equal(dev, -7);
        assert_null(topology_node_of_rank(NULL, 0, &dev));
}

static void test_no_devices(void **state) {
        _cleanup_(topology_unrefp) Topology *t = NULL;

        assert_int_equal(topology_new_local("solo", 0, "", 0, 0, &t), 0);
        assert_int_equal(t->world_size, 0);
        assert_int_equal(topology_local_node(t)->n_devices, 0);
        assert_null(topology_node_of_rank(t, 0, NULL));
}

static void test_bad_arguments(void **state) {
        Topology *t = (Topology *) 0x1;

        assert_int_equal(topology_new_local(NULL, 0, NULL, 1, 0, &t), -EINVAL);
        assert_int_equal(topology_new_local("", 0, NULL, 1, 0, &t), -EINVAL);
        assert_ptr_equal(t, (Topology *) 0x1);
        assert_null(topology_local_node(NULL));
}

static void test_refcount(void **state) {
        Topology *t = NULL;

        assert_int_equal(topology_new_local("n", 0, NULL, 2, 0, &t), 0);
        assert_ptr_equal(topology_ref(t), t);
        assert_int_equal(atomic_load(&t->n_ref), 2);
        assert_null(topology_unref(t));
        assert_int_equal(atomic_load(&t->n_ref), 1);
        /* The last reference frees; ASan reports any leak or double free. */
        assert_null(topology_unref(t));
        assert_null(topology_unref(NULL));
        assert_null(topology_ref(NULL));
}

/* Digests: 64 lower-case hex digits or empty; a copy with another local digest changes only
 * that. */
static void test_registry_digest(void **state) {
        static const char *const d = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        _cleanup_(topology_unrefp) Topology *t = NULL, *copy = NULL;

        assert_true(node_registry_digest_valid(""));
        assert_true(node_registry_digest_valid(d));
        assert_false(node_registry_digest_valid(NULL));
        assert_false(node_registry_digest_valid("0123"));
        assert_false(node_registry_digest_valid("0123456789ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef"));
        assert_false(node_registry_digest_valid("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef0"));
        assert_false(node_registry_digest_valid("x123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"));

        assert_int_equal(topology_new_local("node-a", 3, "h:1", 2, 1024, &t), 0);
        assert_string_equal(t->nodes[0].registry_digest, "");
        assert_int_equal(topology_with_local_digest(t, d, &copy), 0);
        assert_ptr_not_equal(copy, t);
        assert_string_equal(t->nodes[0].registry_digest, "");
        assert_string_equal(copy->nodes[0].registry_digest, d);
        assert_int_equal(copy->version, t->version);
        assert_int_equal(copy->world_size, 2);
        assert_int_equal(copy->local, 0);
        assert_string_equal(copy->nodes[0].name, "node-a");
        assert_string_equal(copy->nodes[0].address, "h:1");
        assert_int_equal(copy->nodes[0].node_rank, 3);
        assert_int_equal(copy->nodes[0].n_devices, 2);
        assert_string_equal(copy->nodes[0].devices[1].name, "host1");
        assert_ptr_not_equal(copy->nodes[0].devices, t->nodes[0].devices);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_node_state_names),
                cmocka_unit_test(test_local_topology),
                cmocka_unit_test(test_rank_lookup),
                cmocka_unit_test(test_no_devices),
                cmocka_unit_test(test_bad_arguments),
                cmocka_unit_test(test_refcount),
                cmocka_unit_test(test_registry_digest),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

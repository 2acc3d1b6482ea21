/* test-numa.c: NUMA nodes from hwloc (synthetic topologies) and the node that fills a device. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "hw/numa.h"

/* Two packages of one node each: a device on node 1 is filled by node 1's CPUs, 2 and 3. */
static void test_two_nodes(void **state) {
        NumaLayout l = {};

        assert_int_equal(numa_layout_probe("pack:2 numa:1 core:2 pu:1", &l), 0);
        assert_int_equal(l.n_nodes, 2);
        for (size_t i = 0; i < 2; i++) {
                assert_int_equal(l.nodes[i].os_index, (int32_t) i);
                assert_int_equal(l.nodes[i].n_cpus, 2);
                assert_int_equal(l.nodes[i].cpus[0], (int) (2 * i));
                assert_int_equal(l.nodes[i].cpus[1], (int) (2 * i + 1));
        }
        assert_int_equal(numa_layout_choose(&l, 0), 0);
        assert_int_equal(numa_layout_choose(&l, 1), 1);
        /* Unknown or absent nodes: no choice, any thread fills. */
        assert_int_equal(numa_layout_choose(&l, -1), -1);
        assert_int_equal(numa_layout_choose(&l, 7), -1);
        assert_int_equal(numa_layout_choose(NULL, 0), -1);
        numa_layout_done(&l);
        assert_int_equal(l.n_nodes, 0);
}

/* Four nodes of two packages, hyperthreads: each node's CPUs are its own PUs. */
static void test_four_nodes(void **state) {
        NumaLayout l = {};

        assert_int_equal(numa_layout_probe("pack:2 numa:2 core:3 pu:2", &l), 0);
        assert_int_equal(l.n_nodes, 4);
        for (size_t i = 0; i < 4; i++) {
                assert_int_equal(l.nodes[i].n_cpus, 6);
                for (size_t c = 0; c < 6; c++)
                        assert_int_equal(l.nodes[i].cpus[c], (int) (6 * i + c));
                assert_int_equal(numa_layout_choose(&l, l.nodes[i].os_index), (int) i);
        }
        numa_layout_done(&l);
}

/* One node: nothing to choose, nothing changes. */
static void test_one_node(void **state) {
        NumaLayout l = {};

        assert_int_equal(numa_layout_probe("pack:1 numa:1 core:4 pu:1", &l), 0);
        assert_int_equal(l.n_nodes, 1);
        assert_int_equal(l.nodes[0].n_cpus, 4);
        assert_int_equal(numa_layout_choose(&l, 0), -1);
        numa_layout_done(&l);
}

static void test_refused_and_real(void **state) {
        NumaLayout l = {};

        assert_int_equal(numa_layout_probe("pack:banana", &l), -EINVAL);
        /* This machine: at least one node with CPUs when hwloc reads it. */
        assert_int_equal(numa_layout_probe(NULL, &l), 0);
        for (size_t i = 0; i < l.n_nodes; i++)
                assert_true(l.nodes[i].n_cpus > 0);
        numa_layout_done(&l);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_two_nodes),
                cmocka_unit_test(test_four_nodes),
                cmocka_unit_test(test_one_node),
                cmocka_unit_test(test_refused_and_real),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

/* numa.c: NUMA nodes with their CPUs from hwloc, and the node that fills a device's memory. */
#include <errno.h>
#include <hwloc.h>
#include <stdlib.h>

#include "common/macro.h"
#include "numa.h"

void numa_layout_done(NumaLayout *l) {
        if (!l)
                return;
        for (size_t i = 0; i < l->n_nodes; i++)
                free(l->nodes[i].cpus);
        free(l->nodes);
        *l = (NumaLayout) {};
}

/* The CPUs (PU os indexes) of a NUMA node's cpuset. */
static int node_cpus(hwloc_const_cpuset_t set, NumaNode *ret) {
        int n = hwloc_bitmap_weight(set), k = 0;
        unsigned id;

        if (n <= 0)
                return 0; /* memory without CPUs, or an infinite set: no threads to bind there */
        ret->cpus = calloc((size_t) n, sizeof(int));
        if (!ret->cpus)
                return -ENOMEM;
        hwloc_bitmap_foreach_begin(id, set) {
                if (k < n)
                        ret->cpus[k++] = (int) id;
        }
        hwloc_bitmap_foreach_end();
        ret->n_cpus = (size_t) k;
        return 0;
}

static int layout_read(hwloc_topology_t topo, NumaLayout *ret) {
        _cleanup_(numa_layout_done) NumaLayout l = {};
        int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);

        if (n <= 0) {
                *ret = (NumaLayout) {};
                return 0;
        }
        l.nodes = calloc((size_t) n, sizeof(NumaNode));
        if (!l.nodes)
                return -ENOMEM;
        for (int i = 0; i < n; i++) {
                hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned) i);
                NumaNode *node = &l.nodes[l.n_nodes];

                if (!o || !o->cpuset)
                        continue;
                *node = (NumaNode) { .os_index = (int32_t) o->os_index };
                int r = node_cpus(o->cpuset, node);
                if (r < 0)
                        return r;
                if (node->n_cpus > 0)
                        l.n_nodes++;
        }
        *ret = l;
        l = (NumaLayout) {};
        return 0;
}

int numa_layout_probe(const char *synthetic, NumaLayout *ret) {
        hwloc_topology_t topo = NULL;
        int r;

        if (hwloc_topology_init(&topo) < 0)
                return -ENOMEM;
        if (synthetic && hwloc_topology_set_synthetic(topo, synthetic) < 0) {
                hwloc_topology_destroy(topo);
                return -EINVAL;
        }
        if (hwloc_topology_load(topo) < 0) {
                hwloc_topology_destroy(topo);
                if (synthetic)
                        return -EINVAL;
                *ret = (NumaLayout) {}; /* unreadable: nothing to choose from */
                return 0;
        }
        r = layout_read(topo, ret);
        hwloc_topology_destroy(topo);
        return r;
}

int numa_layout_choose(const NumaLayout *l, int32_t numa_node) {
        if (!l || l->n_nodes < 2 || numa_node < 0)
                return -1;
        for (size_t i = 0; i < l->n_nodes; i++)
                if (l->nodes[i].os_index == numa_node)
                        return (int) i;
        return -1;
}

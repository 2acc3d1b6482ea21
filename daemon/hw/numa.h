/* numa.h: this node's NUMA nodes and their CPUs: which threads fill a device's memory. */
#pragma once

#include <stddef.h>
#include <stdint.h>

/* One NUMA node: its number (the kernel's, as Device.numa_node) and its CPUs (the kernel's). */
typedef struct NumaNode {
        int32_t os_index;
        int *cpus;
        size_t n_cpus;
} NumaNode;

/* The NUMA nodes that have CPUs, in hwloc's order. */
typedef struct NumaLayout {
        NumaNode *nodes;
        size_t n_nodes;
} NumaLayout;

/*
 * The NUMA nodes of this machine (synthetic NULL), or of a hwloc synthetic topology such as
 * "pack:2 numa:1 core:2 pu:1" (for tests). A machine hwloc cannot read has none (0 nodes, 0
 * returned). -EINVAL for a synthetic description hwloc refuses, -ENOMEM.
 */
int numa_layout_probe(const char *synthetic, NumaLayout *ret);
void numa_layout_done(NumaLayout *l);

/*
 * Which node's threads fill memory for a device on NUMA node numa_node (Device.numa_node; -1:
 * unknown): its index in l->nodes, or -1 for no choice: one node or none, an unknown node, or a
 * node without CPUs (memory-only). First touch by those threads places the pages there.
 */
int numa_layout_choose(const NumaLayout *l, int32_t numa_node);

/* inventory.h: this node's devices: CUDA GPUs when the driver has them, else host-memory devices. */
#pragma once

#include <stddef.h>

#include "core/topology.h"

typedef struct Inventory {
        Device *devices;
        size_t n_devices;
        char why_host[256]; /* why host devices: "--host-devices", or what CUDA said */
} Inventory;

/*
 * host_devices > 0: that many host devices (the operator's choice, for nodes without GPUs and
 * for tests). 0: the CUDA GPUs if the driver loads and reports any, else one host device.
 * hwloc supplies NUMA nodes (and, for GPUs, the NUMA node of their PCI bus id).
 */
int inventory_probe(unsigned host_devices, Inventory *ret);
void inventory_done(Inventory *inv);

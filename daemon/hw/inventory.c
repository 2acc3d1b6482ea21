/* inventory.c: finds this node's devices with hwloc and, when present, the CUDA driver. */
#include <hwloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cuda-driver.h"
#include "inventory.h"
#include "common/log.h"

void inventory_done(Inventory *inv) {
        if (!inv)
                return;
        for (size_t i = 0; i < inv->n_devices; i++)
                device_done(&inv->devices[i]);
        free(inv->devices);
        *inv = (Inventory) {};
}

static uint64_t physical_memory(void) {
        long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
        return pages > 0 && size > 0 ? (uint64_t) pages * (uint64_t) size : 0;
}

static int device_set(Device *d, int32_t index, const char *kind, const char *name,
                      const char *uuid, uint64_t memory, int32_t numa, const char *bus_id) {
        *d = (Device) {
                .local_index = index,
                .memory_bytes = memory,
                .numa_node = numa,
                .kind = strdup(kind),
                .name = strdup(name),
                .uuid = strdup(uuid),
                .pci_bus_id = strdup(bus_id),
        };
        if (!d->kind || !d->name || !d->uuid || !d->pci_bus_id) {
                device_done(d);
                return -ENOMEM;
        }
        return 0;
}

/* The NUMA node nearest a PCI device, or -1. */
static int32_t numa_of_pci(hwloc_topology_t topo, const char *bus_id) {
        hwloc_obj_t pci, parent;

        if (!topo)
                return -1;
        pci = hwloc_get_pcidev_by_busidstring(topo, bus_id);
        if (!pci)
                return -1;
        parent = hwloc_get_non_io_ancestor_obj(topo, pci);
        if (!parent || !parent->memory_first_child)
                return parent && parent->type == HWLOC_OBJ_MACHINE ? 0 : -1;
        return (int32_t) parent->memory_first_child->os_index;
}

/* GPUs from the CUDA driver; 0 devices (and *why) when there are none to use. */
static int probe_cuda(hwloc_topology_t topo, Inventory *inv) {
        CudaDriver cuda;
        int count = 0, r;

        r = cuda_driver_open(&cuda, inv->why_host, sizeof inv->why_host);
        if (r < 0)
                return 0;
        if (cuda.device_get_count(&count) != 0 || count <= 0) {
                (void) snprintf(inv->why_host, sizeof inv->why_host,
                                "the CUDA driver reports no GPUs");
                cuda_driver_close(&cuda);
                return 0;
        }
        count = MIN(count, 256);
        inv->devices = calloc((size_t) count, sizeof(Device));
        if (!inv->devices) {
                cuda_driver_close(&cuda);
                return -ENOMEM;
        }
        for (int i = 0; i < count; i++) {
                char name[256] = "", bus[64] = "", uuid[64] = "";
                CudaDevice dev;
                CudaUuid u = {};
                size_t mem = 0;

                if (cuda.device_get(&dev, i) != 0) {
                        cuda_driver_close(&cuda);
                        inventory_done(inv);
                        (void) snprintf(inv->why_host, sizeof inv->why_host,
                                        "the CUDA driver could not open GPU %d", i);
                        return 0;
                }
                (void) cuda.device_get_name(name, sizeof name - 1, dev);
                (void) cuda.device_get_pci_bus_id(bus, sizeof bus - 1, dev);
                (void) cuda.device_total_mem(&mem, dev);
                if (cuda.device_get_uuid(&u, dev) == 0) {
                        const unsigned char *b = u.bytes;
                        (void) snprintf(uuid, sizeof uuid,
                                        "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
                                        "%02x%02x%02x%02x%02x%02x",
                                        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9],
                                        b[10], b[11], b[12], b[13], b[14], b[15]);
                }
                r = device_set(&inv->devices[i], i, "cuda", name, uuid, mem, numa_of_pci(topo, bus),
                               bus);
                if (r < 0) {
                        cuda_driver_close(&cuda);
                        inventory_done(inv);
                        return r;
                }
                inv->n_devices++;
        }
        cuda_driver_close(&cuda);
        return 0;
}

/* n host devices spread over the NUMA nodes, each with its share of their memory. */
static int probe_host(hwloc_topology_t topo, unsigned n, Inventory *inv) {
        int n_numa = topo ? hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE) : 0;

        inv->devices = calloc(n, sizeof(Device));
        if (!inv->devices)
                return -ENOMEM;
        for (unsigned i = 0; i < n; i++) {
                int32_t numa = -1;
                uint64_t memory = physical_memory() / n;
                char name[32];

                if (n_numa > 0) {
                        unsigned k = (unsigned) ((uint64_t) i * (unsigned) n_numa / n);
                        hwloc_obj_t node = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, k);
                        /* Devices sharing this NUMA node share its memory. */
                        unsigned sharing = 0;
                        for (unsigned j = 0; j < n; j++)
                                sharing += (unsigned) ((uint64_t) j * (unsigned) n_numa / n) == k;
                        if (node) {
                                numa = (int32_t) node->os_index;
                                if (node->attr && node->attr->numanode.local_memory > 0)
                                        memory = node->attr->numanode.local_memory / MAX(sharing, 1u);
                        }
                }
                (void) snprintf(name, sizeof name, "host%u", i);
                int r = device_set(&inv->devices[i], (int32_t) i, "host", name, "", memory, numa,
                                   "");
                if (r < 0) {
                        inventory_done(inv);
                        return r;
                }
                inv->n_devices++;
        }
        return 0;
}

int inventory_probe(unsigned host_devices, Inventory *ret) {
        Inventory inv = {};
        hwloc_topology_t topo = NULL;
        int r;

        if (hwloc_topology_init(&topo) < 0 ||
            hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) < 0 ||
            hwloc_topology_load(topo) < 0) {
                log_warning("hwloc could not read this machine's topology; NUMA nodes unknown.");
                if (topo)
                        hwloc_topology_destroy(topo);
                topo = NULL;
        }

        if (host_devices > 0) {
                (void) snprintf(inv.why_host, sizeof inv.why_host, "--host-devices");
                r = probe_host(topo, host_devices, &inv);
        } else {
                r = probe_cuda(topo, &inv);
                if (r >= 0 && inv.n_devices == 0)
                        r = probe_host(topo, 1, &inv);
        }
        if (topo)
                hwloc_topology_destroy(topo);
        if (r < 0)
                return r;
        *ret = inv;
        return 0;
}

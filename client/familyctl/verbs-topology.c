/* verbs-topology.c: familyctl topology [--watch] [--devices], forget NODE. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

/* A node's ranks are first_rank .. first_rank + devices - 1. */
static int add_node_row(Table *t, const Familyd__V1__Node *node) {
        const char *kind = node->n_devices > 0 ? node->devices[0]->kind : NULL;
        bool mixed = false;

        for (size_t j = 1; j < node->n_devices; j++)
                if (!streq_ptr(node->devices[j]->kind, kind))
                        mixed = true;

        /* node_rank -1: not configured (the daemons order such nodes by name). */
        if (table_add_cell(t, node->name) < 0 ||
            (node->node_rank >= 0 ? table_add_cellf(t, "%" PRId64, node->node_rank) :
                                    table_add_cell(t, "-")) < 0 ||
            (node->n_devices > 0 ?
             table_add_cellf(t, "%" PRId64 "-%" PRId64, node->first_rank,
                             node->first_rank + (int64_t) node->n_devices - 1) :
             table_add_cell(t, "-")) < 0 ||
            table_add_cell(t, node->state) < 0 ||
            table_add_cell(t, node->address) < 0 ||
            table_add_cellf(t, "%zu %s", node->n_devices, mixed ? "mixed" : strempty(kind)) < 0 ||
            table_add_cell(t, node->local ? "yes" : "no") < 0 ||
            /* The registry digest's first 12 hex digits: enough to tell registries apart at a
             * glance (--json has it whole); empty: not announced yet. */
            table_add_cellf(t, "%.12s", isempty(node->registry_digest) ? "-" : node->registry_digest) < 0)
                return -ENOMEM;
        return 0;
}

static int add_device_row(Table *t, const Familyd__V1__Node *node, size_t j) {
        const Familyd__V1__Device *d = node->devices[j];

        if (table_add_cell(t, node->name) < 0 ||
            table_add_cellf(t, "%" PRId64, node->first_rank + (int64_t) j) < 0 ||
            table_add_cellf(t, "%" PRId32, d->local_index) < 0 ||
            table_add_cell(t, d->kind) < 0 ||
            table_add_cell(t, d->name) < 0 ||
            table_add_cell(t, d->uuid) < 0 ||
            table_add_cellf(t, "%" PRIu64, d->memory_bytes) < 0 ||
            (d->numa_node >= 0 ? table_add_cellf(t, "%" PRId32, d->numa_node) :
                                 table_add_cell(t, "-")) < 0 ||
            table_add_cell(t, d->pci_bus_id) < 0)
                return -ENOMEM;
        return 0;
}

static const char *const node_columns[] = {
        "NODE", "NODE_RANK", "RANKS", "STATE", "ADDRESS", "DEVICES", "LOCAL", "REGISTRY", NULL,
};
static const char *const device_columns[] = {
        "NODE", "RANK", "INDEX", "KIND", "NAME", "UUID", "MEMORY_BYTES", "NUMA", "PCI_BUS_ID", NULL,
};
static const char *const *const topology_tables[] = { node_columns, device_columns, NULL };

int print_topology(const TableOptions *o, const Familyd__V1__Topology *topo, bool devices) {
        _cleanup_(table_freep) Table *nodes = NULL, *devs = NULL;
        int r;

        nodes = table_new(o, node_columns);
        if (!nodes)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < topo->n_nodes; i++)
                if (add_node_row(nodes, topo->nodes[i]) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);

        if (devices) {
                devs = table_new(o, device_columns);
                if (!devs)
                        return ctl_fail("build table", -ENOMEM, NULL);
                for (size_t i = 0; i < topo->n_nodes; i++)
                        for (size_t j = 0; j < topo->nodes[i]->n_devices; j++)
                                if (add_device_row(devs, topo->nodes[i], j) < 0)
                                        return ctl_fail("build table", -ENOMEM, NULL);
        }

        ctl_print_field("version", "%" PRIu64, topo->version);
        ctl_print_field("world size", "%" PRId64, topo->world_size);
        ctl_print_field("local node", "%s", isempty(topo->local_node) ? "-" : topo->local_node);
        r = table_print(nodes, true);
        if (r == EXIT_OK && devs)
                r = table_print(devs, true);
        return r;
}

/* ---------------------------------------------------------------------------------------- */
/* topology */

typedef struct TopologyState {
        bool devices;
        bool watch;
        uint64_t count;
} TopologyState;

enum {
        ARG_DEVICES = 0x100,
};

static const struct option topology_options[] = {
        { "devices", no_argument,       NULL, ARG_DEVICES },
        { "watch",   no_argument,       NULL, 'w' },
        { "count",   required_argument, NULL, 'n' },
        {}
};

static int topology_option(VerbRun *v, int c, const char *arg) {
        TopologyState *s = v->state;
        int64_t n;

        switch (c) {
        case ARG_DEVICES:
                s->devices = true;
                return EXIT_OK;
        case 'w':
                s->watch = true;
                return EXIT_OK;
        case 'n':
                if (ctl_parse_int64(arg, &n) < 0 || n <= 0)
                        return ctl_usage_error("topology", "--count needs a positive integer, not '%s'", arg);
                s->count = (uint64_t) n;
                return EXIT_OK;
        }
        return -1;
}

static int topology_prepare(VerbRun *v) {
        TopologyState *s = v->state;

        if (s->count > 0 && !s->watch)
                return ctl_usage_error("topology", "--count needs --watch");
        if (!s->watch)
                return EXIT_OK;
        v->finished = true;
        return topology_watch(v->ctx, s->devices, s->count);
}

static int topology_call(VerbRun *v) {
        return familyd_get_topology(v->ctx->client, (Familyd__V1__Topology **) &v->response, &v->error);
}

static int topology_print(VerbRun *v) {
        TopologyState *s = v->state;

        return print_topology(&v->ctx->table, (const Familyd__V1__Topology *) v->response, s->devices);
}

static const VerbDef topology_verb = {
        .name = "topology",
        .help = "Usage: familyctl topology [OPTIONS]\n"
                "\n"
                "Shows the topology this daemon sees: version, world size, local node, then\n"
                "NODE NODE_RANK RANKS STATE ADDRESS DEVICES LOCAL REGISTRY (its registry digest,\n"
                "abridged) per node.\n"
                "\n"
                "      --devices       also list every device: NODE RANK INDEX KIND NAME UUID\n"
                "                      MEMORY_BYTES NUMA PCI_BUS_ID\n"
                "  -w, --watch         keep watching: print the topology, then the whole topology\n"
                "                      again after each change, each under a line with the local time\n"
                "                      and its version (with --json: one JSON object per line)\n"
                "  -n, --count N       with --watch: stop after N topologies\n"
                "\n"
                "A watch ends with exit 0 on SIGINT or SIGTERM (and when stdout's reader goes away),\n"
                "with exit 3 and a message when the daemon goes away. --timeout, when given, bounds\n"
                "the whole watch.\n"
                "\n",
        .options = topology_options,
        .short_options = "wn:",
        .option = topology_option,
        .tables = topology_tables,
        .state_size = sizeof(TopologyState),
        .prepare = topology_prepare,
        .call = topology_call,
        .what = "get topology",
        .print = topology_print,
};

int verb_topology(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &topology_verb, argc, argv);
}

/* ---------------------------------------------------------------------------------------- */
/* forget NODE */

static int forget_call(VerbRun *v) {
        return familyd_forget_node(v->ctx->client, v->args[0], (Familyd__V1__ForgetNodeResponse **) &v->response, &v->error);
}

static int forget_print(VerbRun *v) {
        const Familyd__V1__ForgetNodeResponse *resp = (const Familyd__V1__ForgetNodeResponse *) v->response;

        if (!resp->topology)
                return EXIT_OK;
        return print_topology(&v->ctx->table, resp->topology, false);
}

static const char *const *const forget_tables[] = { node_columns, NULL };

static const VerbDef forget_verb = {
        .name = "forget",
        .help = "Usage: familyctl forget [OPTIONS] NODE\n"
                "\n"
                "Drops a down node and its ranks from the topology, on every daemon of the\n"
                "cluster, and prints the new topology. A node that is up or suspect, or this\n"
                "daemon's own node, is refused (FAILED_PRECONDITION); an unknown one is\n"
                "NOT_FOUND.\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one node name",
        .args_extra = "expected exactly one node name",
        .tables = forget_tables,
        .call = forget_call,
        .what = "forget node",
        .print = forget_print,
};

int verb_forget(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &forget_verb, argc, argv);
}

/* verbs-admin.c: familyctl status, reload. */

#include <inttypes.h>
#include <stdio.h>

#include "familyctl.h"
#include "common/macro.h"

static int status_call(VerbRun *v) {
        return familyd_get_status(v->ctx->client, (Familyd__V1__GetStatusResponse **) &v->response, &v->error);
}

static int status_print(VerbRun *v) {
        const Familyd__V1__GetStatusResponse *st = (const Familyd__V1__GetStatusResponse *) v->response;

        ctl_print_field("node", "%s", isempty(st->node) ? "-" : st->node);
        ctl_print_field("version", "%s", strempty(st->version));
        ctl_print_field("uptime", "%" PRIu64 ".%03" PRIu64 " s", st->uptime_ms / 1000, st->uptime_ms % 1000);
        ctl_print_field("registry", "%s", isempty(st->registry_path) ? "-" : st->registry_path);
        ctl_print_field("registry generation", "%" PRIu64, st->registry_generation);
        ctl_print_field("families", "%" PRIu32, st->families);
        ctl_print_field("builds", "%" PRIu32 " (%" PRIu32 " in their grace period)", st->builds, st->builds_in_grace);
        ctl_print_field("meshes", "%" PRIu32, st->meshes);
        ctl_print_field("shm in use", "%" PRIu64 " of %" PRIu64 " bytes", st->shm_bytes_in_use, st->shm_budget_bytes);
        ctl_print_field("fills", "%" PRIu64 " started, %" PRIu64 " bytes", st->fills_started, st->bytes_filled);
        ctl_print_field("peers", "%" PRIu32 " up, %" PRIu32 " suspect, %" PRIu32 " down",
                        st->peers_up, st->peers_suspect, st->peers_down);
        ctl_print_field("peer traffic", "%" PRIu64 " messages, %" PRIu64 " bytes sent",
                        st->peer_messages_sent, st->peer_bytes_sent);
        ctl_print_field("topology version", "%" PRIu64, st->topology_version);
        return EXIT_OK;
}

static const VerbDef status_verb = {
        .name = "status",
        .help = "Usage: familyctl status [OPTIONS]\n"
                "\n"
                "Shows the daemon's version, uptime, registry, counts, shared-memory use,\n"
                "peers, the peer traffic it sent and its topology version.\n"
                "\n",
        .call = status_call,
        .what = "get status",
        .print = status_print,
};

int verb_status(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &status_verb, argc, argv);
}

static int reload_call(VerbRun *v) {
        return familyd_reload(v->ctx->client, (Familyd__V1__ReloadResponse **) &v->response, &v->error);
}

static int reload_print(VerbRun *v) {
        const Familyd__V1__ReloadResponse *resp = (const Familyd__V1__ReloadResponse *) v->response;

        ctl_print_field("registry generation", "%" PRIu64, resp->registry_generation);
        ctl_print_field("families", "%" PRIu32, resp->families);
        return EXIT_OK;
}

static const VerbDef reload_verb = {
        .name = "reload",
        .help = "Usage: familyctl reload [OPTIONS]\n"
                "\n"
                "Reloads the registry from its directory. On failure the daemon keeps the old\n"
                "registry and answers FAILED_PRECONDITION with one diagnostic per line\n"
                "(file:line:column: text); familyctl prints them and exits 1.\n"
                "\n",
        .call = reload_call,
        .what = "reload",
        .print = reload_print,
};

int verb_reload(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &reload_verb, argc, argv);
}

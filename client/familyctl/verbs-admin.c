/* verbs-admin.c: familyctl status, reload. */

#include <inttypes.h>
#include <stdio.h>

#include "familyctl.h"
#include "macro.h"

int verb_status(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__GetStatusResponse *st = NULL;
        int r;

        PARSE_SIMPLE_VERB("status",
                          "Usage: familyctl status [OPTIONS]\n"
                          "\n"
                          "Shows the daemon's version, uptime, registry, counts, shared-memory use,\n"
                          "peers, the peer traffic it sent and its topology version.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (optind < argc)
                return ctl_usage_error("status", "unexpected argument '%s'", argv[optind]);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_get_status(ctx->client, &st, &error);
        if (r < 0) {
                r = ctl_fail("get status", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json)
                r = ctl_print_json(&st->base);
        else {
                ctl_print_field("node", "%s", isempty(st->node) ? "-" : st->node);
                ctl_print_field("version", "%s", strempty(st->version));
                ctl_print_field("uptime", "%" PRIu64 ".%03" PRIu64 " s", st->uptime_ms / 1000, st->uptime_ms % 1000);
                ctl_print_field("registry", "%s", isempty(st->registry_path) ? "-" : st->registry_path);
                ctl_print_field("registry generation", "%" PRIu64, st->registry_generation);
                ctl_print_field("families", "%" PRIu32, st->families);
                ctl_print_field("builds", "%" PRIu32, st->builds);
                ctl_print_field("meshes", "%" PRIu32, st->meshes);
                ctl_print_field("shm in use", "%" PRIu64 " of %" PRIu64 " bytes", st->shm_bytes_in_use, st->shm_budget_bytes);
                ctl_print_field("peers", "%" PRIu32 " up, %" PRIu32 " suspect, %" PRIu32 " down",
                                st->peers_up, st->peers_suspect, st->peers_down);
                ctl_print_field("peer traffic", "%" PRIu64 " messages, %" PRIu64 " bytes sent",
                                st->peer_messages_sent, st->peer_bytes_sent);
                ctl_print_field("topology version", "%" PRIu64, st->topology_version);
                r = EXIT_OK;
        }
        familyd__v1__get_status_response__free_unpacked(st, NULL);
        return r;
}

int verb_reload(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__ReloadResponse *resp = NULL;
        int r;

        PARSE_SIMPLE_VERB("reload",
                          "Usage: familyctl reload [OPTIONS]\n"
                          "\n"
                          "Reloads the registry from its directory. On failure the daemon keeps the old\n"
                          "registry and answers FAILED_PRECONDITION with one diagnostic per line\n"
                          "(file:line:column: text); familyctl prints them and exits 1.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (optind < argc)
                return ctl_usage_error("reload", "unexpected argument '%s'", argv[optind]);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_reload(ctx->client, &resp, &error);
        if (r < 0) {
                r = ctl_fail("reload", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json)
                r = ctl_print_json(&resp->base);
        else {
                ctl_print_field("registry generation", "%" PRIu64, resp->registry_generation);
                ctl_print_field("families", "%" PRIu32, resp->families);
                r = EXIT_OK;
        }
        familyd__v1__reload_response__free_unpacked(resp, NULL);
        return r;
}

/* verbs-admin.c: familyctl status, version, reload, keygen. */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "build-config.h"
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
        ctl_print_field("shm released, held", "%" PRIu64 " bytes in %" PRIu32 " shards (outside the budget)",
                        st->shm_released_bytes_held, st->shm_released_segments_held);
        ctl_print_field("per-uid limits", "%" PRIu32 " builds, %" PRIu32 " pins, %" PRIu64 " bytes (admins exempt)",
                        st->max_builds_per_uid, st->max_pins_per_uid, st->shm_budget_per_uid_bytes);
        for (size_t i = 0; i < st->n_uid_use; i++) {
                const Familyd__V1__UidUse *u = st->uid_use[i];
                char name[32];
                (void) snprintf(name, sizeof name, "uid %" PRIu32, u->uid);
                ctl_print_field(name, "%" PRIu32 " builds, %" PRIu32 " pins, %" PRIu64 " bytes",
                                u->builds, u->pins, u->shm_bytes);
        }
        if (st->uid_use_truncated)
                ctl_print_field("uids", "more hold builds; the %zu holding the most are shown", st->n_uid_use);
        ctl_print_field("fills", "%" PRIu64 " started, %" PRIu64 " bytes", st->fills_started, st->bytes_filled);
        ctl_print_field("peers", "%" PRIu32 " up, %" PRIu32 " suspect, %" PRIu32 " down",
                        st->peers_up, st->peers_suspect, st->peers_down);
        ctl_print_field("peer traffic", "%" PRIu64 " messages, %" PRIu64 " bytes sent",
                        st->peer_messages_sent, st->peer_bytes_sent);
        ctl_print_field("topology version", "%" PRIu64, st->topology_version);
        if (st->coordinator)
                ctl_print_field("coordinator", "etcd %s, cluster %s, %s%s%s",
                                strempty(st->coordinator->endpoints),
                                strempty(st->coordinator->cluster),
                                st->coordinator->reachable ? "reachable" : "unreachable",
                                isempty(st->coordinator->last_error) ? "" : ": ",
                                strempty(st->coordinator->last_error));
        return EXIT_OK;
}

static const VerbDef status_verb = {
        .name = "status",
        .help = "Usage: familyctl status [OPTIONS]\n"
                "\n"
                "Shows the daemon's version, uptime, registry, counts, shared-memory use,\n"
                "peers, the peer traffic it sent and its topology version; in etcd mode\n"
                "(--coordinator) also the coordinator and whether it is reachable.\n"
                "\n",
        .call = status_call,
        .what = "get status",
        .print = status_print,
};

int verb_status(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &status_verb, argc, argv);
}

/* The API this familyctl speaks: the package and revision of the protos it was built with
 * (proto/familyd/v1/admin.proto, ApiRevision). */
#define CLIENT_API (familyd__v1__get_status_response__descriptor.package_name)
#define CLIENT_API_REVISION ((unsigned) FAMILYD__V1__API_REVISION__API_REVISION_CURRENT)

/* A daemon older than GetStatusResponse.api says nothing: it speaks revision 1. */
static unsigned daemon_api_revision(const Familyd__V1__GetStatusResponse *st) {
        return st->api_revision > 0 ? st->api_revision : 1;
}

static const char *daemon_api(const Familyd__V1__GetStatusResponse *st) {
        return isempty(st->api) ? CLIENT_API : st->api;
}

static int version_print(VerbRun *v) {
        const Familyd__V1__GetStatusResponse *st = (const Familyd__V1__GetStatusResponse *) v->response;
        unsigned theirs = daemon_api_revision(st);

        ctl_print_field("client", "familyctl %s, API %s revision %u", FAMILYD_VERSION, CLIENT_API,
                        CLIENT_API_REVISION);
        ctl_print_field("daemon", "familyd %s, API %s revision %u", strempty(st->version),
                        daemon_api(st), theirs);
        if (!streq(daemon_api(st), CLIENT_API))
                ctl_print_field("api", "different APIs: this familyctl cannot talk to the daemon");
        else if (theirs < CLIENT_API_REVISION)
                ctl_print_field("api", "the daemon is older: calls added after revision %u "
                                       "answer UNIMPLEMENTED", theirs);
        else if (theirs > CLIENT_API_REVISION)
                ctl_print_field("api", "the daemon is newer: everything this familyctl does works");
        else
                ctl_print_field("api", "the same");
        return EXIT_OK;
}

static void version_json_side(const char *name, const char *version, const char *api,
                              unsigned revision, bool last) {
        printf("  ");
        ctl_json_string(stdout, name);
        printf(": {\"version\": ");
        ctl_json_string(stdout, version);
        printf(", \"api\": ");
        ctl_json_string(stdout, api);
        printf(", \"apiRevision\": %u}%s\n", revision, last ? "" : ",");
}

static int version_print_json(VerbRun *v) {
        const Familyd__V1__GetStatusResponse *st = (const Familyd__V1__GetStatusResponse *) v->response;

        printf("{\n");
        version_json_side("client", FAMILYD_VERSION, CLIENT_API, CLIENT_API_REVISION, false);
        version_json_side("daemon", strempty(st->version), daemon_api(st),
                          daemon_api_revision(st), true);
        printf("}\n");
        return EXIT_OK;
}

static const VerbDef version_verb = {
        .name = "version",
        .help = "Usage: familyctl version [OPTIONS]\n"
                "\n"
                "Shows this familyctl's version and the daemon's, and the API each speaks: the\n"
                "protobuf package (familyd.v1) and its revision, which only grows as calls and\n"
                "fields are added (a daemon of an older revision answers newer calls\n"
                "UNIMPLEMENTED). With --json: {\"client\": {\"version\", \"api\", \"apiRevision\"},\n"
                "\"daemon\": {...}}. `familyctl --version` shows this familyctl's version alone\n"
                "and needs no daemon.\n"
                "\n",
        .call = status_call,
        .what = "get the daemon's version",
        .print = version_print,
        .print_json = version_print_json,
};

int verb_version(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &version_verb, argc, argv);
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

/* The cluster key file the daemon reads (--cluster-key, daemon/peer/peer-key.h): 32 bytes
 * from the kernel's generator (getrandom(2), what libsodium's randombytes uses on Linux), as
 * one line of hex after a comment line. */
#define KEYGEN_KEY_BYTES 32u

static const char keygen_help[] =
        "Usage: familyctl keygen FILE\n"
        "\n"
        "Writes a new cluster key to FILE (mode 0600; an existing FILE is never overwritten):\n"
        "32 random bytes as 64 hexadecimal characters. Copy it to every node, owned by\n"
        "familyd's user with mode 0600, and give it with --cluster-key (config key\n"
        "cluster-key). For a rotation, put the new key on the first line of the file and the\n"
        "old one on the second, reload every node, then remove the old line and reload again.\n"
        "Talks to no daemon.\n";

static int keygen_write(const char *path) {
        uint8_t key[KEYGEN_KEY_BYTES];
        char text[128];
        size_t at = 0;
        int fd, r = 0;

        for (size_t have = 0; have < sizeof key;) {
                ssize_t n = getrandom(key + have, sizeof key - have, 0);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return ctl_fail("read random bytes", -errno, NULL);
                have += (size_t) n;
        }
        at = (size_t) snprintf(text, sizeof text, "# familyd cluster key (familyctl keygen)\n");
        for (size_t i = 0; i < sizeof key; i++)
                at += (size_t) snprintf(text + at, sizeof text - at, "%02x", key[i]);
        text[at++] = '\n';
        explicit_bzero(key, sizeof key);

        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0 && errno == EEXIST) {
                explicit_bzero(text, sizeof text);
                fprintf(stderr, "familyctl: %s exists; not overwriting it (a cluster key is "
                                "replaced on purpose, by hand).\n",
                        path);
                return EXIT_USAGE;
        }
        if (fd < 0) {
                r = -errno;
                explicit_bzero(text, sizeof text);
                fprintf(stderr, "familyctl: cannot create %s: %s\n", path, strerror(-r));
                return EXIT_INTERNAL;
        }
        /* The umask may have taken bits away, never added them; make it exactly 0600. */
        if (fchmod(fd, 0600) < 0 || write(fd, text, at) != (ssize_t) at || fsync(fd) < 0)
                r = -errno;
        explicit_bzero(text, sizeof text);
        if (close(fd) < 0 && r == 0)
                r = -errno;
        if (r < 0) {
                (void) unlink(path);
                fprintf(stderr, "familyctl: cannot write %s: %s\n", path, strerror(-r));
                return EXIT_INTERNAL;
        }
        printf("Wrote a new cluster key to %s (mode 0600).\n", path);
        return EXIT_OK;
}

int verb_keygen(Context *ctx, int argc, char **argv) {
        if (argc == 2 && (streq(argv[1], "--help") || streq(argv[1], "-h"))) {
                fputs(keygen_help, stdout);
                return EXIT_OK;
        }
        if (argc != 2 || isempty(argv[1]) || argv[1][0] == '-')
                return ctl_usage_error("keygen", "expected one argument, the key file to write");
        return keygen_write(argv[1]);
}

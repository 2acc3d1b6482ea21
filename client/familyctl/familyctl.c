/* familyctl.c: the command line shell: global options, verb dispatch, errors and exit codes. */

#include <errno.h>
#include <langinfo.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "build-config.h"
#include "familyctl.h"
#include "common/macro.h"

typedef struct Verb {
        const char *name;
        int (*run)(Context *ctx, int argc, char **argv);
        const char *synopsis;
} Verb;

static const Verb verbs[] = {
        { "families", verb_families, "families                       list the registry's families" },
        { "family",   verb_family,   "family NAME                    show one family (by name or baseline)" },
        { "resolve",  verb_resolve,  "resolve FAMILY [KEY=VALUE...]  resolve a family for a job context" },
        { "mesh",     verb_mesh,     "mesh create|get|delete ...     create, show or delete a mesh" },
        { "meshes",   verb_meshes,   "meshes                         list meshes" },
        { "topology", verb_topology, "topology [--watch] [--devices] show nodes and devices, or watch them change" },
        { "forget",   verb_forget,   "forget NODE                    drop a down node from the topology of every daemon" },
        { "status",   verb_status,   "status                         show the daemon's status" },
        { "version",  verb_version,  "version                        show familyctl's and the daemon's versions and API" },
        { "reload",   verb_reload,   "reload                         reload the registry (and the cluster key)" },
        { "keygen",   verb_keygen,   "keygen FILE                    write a new cluster key (--cluster-key) to FILE" },
        { "build",    verb_build,    "build FAMILY [KEY=VALUE...]    build a family (--config, --mesh, --materialize)" },
        { "builds",   verb_builds,   "builds                         list builds" },
        { "build-info", verb_build_info, "build-info ID                  show one build" },
        { "release",  verb_release,  "release ID [--force]           drop this process's hold on a build (--force: free it)" },
        { "pin",      verb_pin,      "pin ID                         keep a build whatever processes hold it" },
        { "unpin",    verb_unpin,    "unpin ID                       undo pin: the build goes when nothing holds it" },
        { "publish",  verb_publish,  "publish ID                     seal a filled init: module build for the node" },
        { "shard",    verb_shard,    "shard ID RANK                  map a rank's shard and print its slices" },
        { "checkpoint", verb_checkpoint, "checkpoint inspect PATH        list a safetensors checkpoint's tensors (no daemon)" },
        { "validate", verb_validate, "validate MODEL.json            check a model's builds against the job (--mesh, --tp...)" },
};

static void help(void) {
        printf("Usage: familyctl [OPTIONS] VERB [ARGS...]\n"
               "\n"
               "Talks to the familyd daemon of this node over its API socket.\n"
               "\n"
               "Options (also accepted after the verb):\n"
               COMMON_OPTIONS_HELP
               "      --version       show the version\n"
               "\n"
               "Verbs (`familyctl VERB --help` for each):\n");
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                printf("  %s\n", verbs[i].synopsis);
        printf("\n"
               "Verbs that print tables also take -o/--output COLUMNS (which columns, in which\n"
               "order), --noheadings and --raw; --json prints the daemon's answer instead.\n"
               "\n"
               "The socket is --socket, else $FAMILYD_SOCKET, else %s.\n"
               "\n"
               "Exit status:\n"
               "  0  success\n"
               "  1  the daemon answered an error (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION,\n"
               "     UNIMPLEMENTED, RESOURCE_EXHAUSTED, ... : any status not listed under 3 and 4)\n"
               "  2  usage error: bad options or arguments, nothing was sent\n"
               "  3  the daemon cannot be reached: no socket at the path, UNAVAILABLE, or\n"
               "     DEADLINE_EXCEEDED (no answer within --timeout)\n"
               "  4  anything else: INTERNAL, UNKNOWN or DATA_LOSS from gRPC or the daemon, an\n"
               "     undecodable answer, out of memory\n"
               "\n"
               "Errors go to stderr as `familyctl: STATUS_NAME: message (REASON key=value...)`.\n",
               FAMILYD_DEFAULT_SOCKET);
}

int ctl_usage_error(const char *verb, const char *fmt, ...) {
        va_list ap;

        fputs("familyctl: ", stderr);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fprintf(stderr, "\nTry 'familyctl %s%s--help'.\n", strempty(verb), verb ? " " : "");
        return EXIT_USAGE;
}

int ctl_common_option(Context *ctx, int c, const char *arg) {
        int64_t v;

        switch (c) {
        case 's':
        case ARG_COMMON_SOCKET:
                if (isempty(arg))
                        return ctl_usage_error(NULL, "--socket needs a path");
                ctx->socket_path = arg;
                return EXIT_OK;
        case 'j':
        case ARG_COMMON_JSON:
                ctx->json = true;
                return EXIT_OK;
        case 't':
        case ARG_COMMON_TIMEOUT:
                if (ctl_parse_int64(arg, &v) < 0 || v < 0 || v > UINT32_MAX)
                        return ctl_usage_error(NULL, "--timeout needs milliseconds, not '%s'", arg);
                ctx->timeout_ms = (uint32_t) v;
                ctx->timeout_set = true;
                return EXIT_OK;
        }
        return -1;
}

int ctl_connect(Context *ctx) {
        FamilydClientParams params = {};
        const char *path;
        struct stat st;
        int r;

        if (ctx->client)
                return EXIT_OK;

        if (ctx->socket_path) {
                params.field_mask |= FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH;
                params.socket_path = ctx->socket_path;
        }
        if (ctx->timeout_set) {
                params.field_mask |= FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS;
                params.timeout_ms = ctx->timeout_ms;
        }
        r = familyd_client_new(&params, &ctx->client);
        if (r < 0)
                return ctl_fail("create the client", r, NULL);

        /* gRPC reports a missing socket as a long UNAVAILABLE text; say it plainly first. */
        path = familyd_client_get_socket_path(ctx->client);
        if (stat(path, &st) < 0) {
                fprintf(stderr, "familyctl: cannot reach familyd: %s: %s\n", path, strerror(errno));
                return EXIT_UNREACHABLE;
        }
        if (!S_ISSOCK(st.st_mode)) {
                fprintf(stderr, "familyctl: cannot reach familyd: %s is not a socket\n", path);
                return EXIT_UNREACHABLE;
        }
        return EXIT_OK;
}

int ctl_fail(const char *what, int r, const FamilydError *error) {
        if (r != -EPROTO || !error || error->code == 0) {
                fprintf(stderr, "familyctl: failed to %s: %s\n", what, strerror(-r));
                return EXIT_INTERNAL;
        }

        fprintf(stderr, "familyctl: %s: %s", familyd_status_name(error->code), strempty(error->message));
        if (error->reason) {
                fprintf(stderr, " (%s", error->reason);
                if (error->info)
                        for (size_t i = 0; i < error->info->n_metadata; i++)
                                fprintf(stderr, " %s=%s", strempty(error->info->metadata[i]->key),
                                        strempty(error->info->metadata[i]->value));
                fputc(')', stderr);
        }
        fputc('\n', stderr);

        switch (error->code) {
        case 14: /* UNAVAILABLE */
        case 4:  /* DEADLINE_EXCEEDED */
                return EXIT_UNREACHABLE;
        case 2:  /* UNKNOWN */
        case 13: /* INTERNAL */
        case 15: /* DATA_LOSS */
                return EXIT_INTERNAL;
        default:
                return EXIT_DAEMON;
        }
}

int ctl_print_json(const ProtobufCMessage *m) {
        _cleanup_free_ char *json = NULL;
        int r;

        r = familyd_json_encode(m, FAMILYD_JSON_PRETTY, &json);
        if (r < 0)
                return ctl_fail("encode JSON", r, NULL);
        puts(json);
        return EXIT_OK;
}

/* libsmartcols measures cells, and escapes what it cannot print, by the locale's character set;
 * the daemon's strings are UTF-8, so a locale that is not is replaced by C.UTF-8 (for the
 * character set only). */
static void setup_locale(void) {
        if (!setlocale(LC_CTYPE, "") || !streq(nl_langinfo(CODESET), "UTF-8"))
                (void) setlocale(LC_CTYPE, "C.UTF-8");
}

int main(int argc, char **argv) {
        static const struct option options[] = {
                COMMON_LONG_OPTIONS,
                { "version", no_argument, NULL, 'V' },
                {}
        };
        Context ctx = {};
        int c, r;

        setup_locale();

        /* '+': stop at the verb, whose options are its own. */
        while ((c = getopt_long(argc, argv, "+s:jt:h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        help();
                        return EXIT_OK;
                case 'V':
                        printf("familyctl %s\n", FAMILYD_VERSION);
                        return EXIT_OK;
                case '?':
                        return ctl_usage_error(NULL, "invalid option");
                default:
                        r = ctl_common_option(&ctx, c, optarg);
                        if (r != EXIT_OK)
                                return r == -1 ? EXIT_INTERNAL : r;
                }
        }

        if (optind >= argc)
                return ctl_usage_error(NULL, "missing verb");

        const char *name = argv[optind];
        const Verb *verb = NULL;
        for (size_t i = 0; i < ELEMENTSOF(verbs); i++)
                if (streq(verbs[i].name, name))
                        verb = &verbs[i];
        if (!verb)
                return ctl_usage_error(NULL, "unknown verb '%s'", name);

        /* optind = 0 makes glibc's getopt start over (and re-read its settings) in the verb. */
        argc -= optind;
        argv += optind;
        optind = 0;
        r = verb->run(&ctx, argc, argv);

        ctx.client = familyd_client_free(ctx.client);
        return r;
}

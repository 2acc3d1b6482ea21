/* verbs-build.c: familyctl build, builds, build-info, release. */

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

static char *placements_to_string(Familyd__V1__Placement *const *p, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;

        if (n == 0)
                return strdup("-");
        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < n; i++) {
                fprintf(f, "%s%s:", i > 0 ? "," : "", strempty(p[i]->axis));
                if (streq_ptr(p[i]->kind, "shard"))
                        fprintf(f, "shard(%" PRId64 ")", p[i]->dim);
                else
                        fputs(strempty(p[i]->kind), f);
        }
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static char *config_to_string(const Familyd__V1__Config *c) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        for (size_t i = 0; c && i < c->n_fields; i++) {
                _cleanup_free_ char *v = ctl_value_to_string(c->fields[i]->value);

                fprintf(f, "%s%s=%s", i > 0 ? " " : "", strempty(c->fields[i]->key), strempty(v));
        }
        if (!c || c->n_fields == 0)
                fputc('-', f);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

static size_t shards_materialized(const Familyd__V1__Build *b, uint64_t *ret_bytes) {
        size_t n = 0;
        uint64_t bytes = 0;

        for (size_t i = 0; i < b->n_shards; i++)
                if (!isempty(b->shards[i]->token)) {
                        n++;
                        bytes += b->shards[i]->size_bytes;
                }
        if (ret_bytes)
                *ret_bytes = bytes;
        return n;
}

/* ---------------------------------------------------------------------------------------- */
/* One build: build, build-info */

static const char *const parameter_columns[] = {
        "PARAMETER", "SHAPE", "DTYPE", "PLACEMENTS", "VIEW", NULL,
};
static const char *const shard_columns[] = {
        "RANK", "NODE", "DEVICE", "BYTES", "SLICES", "MATERIALIZED", NULL,
};
static const char *const *const build_tables[] = { parameter_columns, shard_columns, NULL };

/* Who holds the build: pinned, the processes, the grace deadline; and how it was made. */
static void print_build_holders(const Familyd__V1__Build *b) {
        ctl_print_field("pinned", "%s", b->pinned ? "yes" : "no");
        if (b->n_references == 0)
                ctl_print_field("references", "none");
        for (size_t i = 0; i < b->n_references; i++) {
                _cleanup_free_ char *since = ctl_time_to_string(b->references[i]->since_unix_ms);
                ctl_print_field(i == 0 ? "references" : "", "pid %" PRId32 " (uid %" PRIu32 ") since %s",
                                b->references[i]->pid, b->references[i]->uid, strempty(since));
        }
        if (b->grace_deadline_unix_ms > 0) {
                _cleanup_free_ char *at = ctl_time_to_string(b->grace_deadline_unix_ms);
                ctl_print_field("freed at", "%s, unless a process takes it again", strempty(at));
        }
        ctl_print_field("writable", "%s", b->writable ? "yes (shared mappings)" : "no");
        ctl_print_field("private", "%s", b->private_build ? "yes (never shared)" : "no");
}

static void print_build_fields(const Familyd__V1__Build *b) {
        const Familyd__V1__FamilyBuildInfo *info = b->info;
        const Familyd__V1__ResolvedFamily *rf = info ? info->resolved : NULL;
        const Familyd__V1__Layout *l = info ? info->layout : NULL;
        _cleanup_free_ char *cfg = config_to_string(info ? info->config_snapshot : NULL);
        uint64_t bytes;
        size_t n_mat = shards_materialized(b, &bytes);

        ctl_print_field("build id", "%s", strempty(b->build_id));
        ctl_print_field("family", "%s", rf && !isempty(rf->family) ? rf->family : "-");
        ctl_print_field("variant", "%s", rf && !isempty(rf->variant) ? rf->variant : "-");
        ctl_print_field("constructor", "%s", rf && !isempty(rf->constructor) ? rf->constructor : "-");
        ctl_print_field("origin", "%s", info && !isempty(info->origin) ? info->origin : "-");
        ctl_print_field("mesh", "%s", l && !isempty(l->mesh_id) ? l->mesh_id : "-");
        ctl_print_field("config", "%s", strempty(cfg));
        ctl_print_field("reset after init", "%s", info && info->reset_after_materialization ? "yes" : "no");
        ctl_print_field("shard socket", "%s", isempty(b->shard_socket) ? "-" : b->shard_socket);
        ctl_print_field("materialized", "%zu of %zu ranks, %" PRIu64 " bytes", n_mat, b->n_shards, bytes);
        print_build_holders(b);
}

static int add_parameter_row(Table *t, const Familyd__V1__ParameterLayout *p) {
        _cleanup_free_ char *shape = ctl_shape_to_string(p->shape, p->n_shape);
        _cleanup_free_ char *pl = placements_to_string(p->placements, p->n_placements);

        if (!shape || !pl ||
            table_add_cell(t, p->name) < 0 ||
            table_add_cell(t, shape) < 0 ||
            table_add_cell(t, p->dtype) < 0 ||
            table_add_cell(t, pl) < 0 ||
            table_add_cell(t, p->mesh_view) < 0)
                return -ENOMEM;
        return 0;
}

static int add_shard_row(Table *t, const Familyd__V1__RankShard *s) {
        if (table_add_cellf(t, "%" PRId64, s->rank) < 0 ||
            table_add_cell(t, s->node) < 0 ||
            table_add_cellf(t, "%s:%d", isempty(s->device_kind) ? "-" : s->device_kind, s->local_device) < 0 ||
            table_add_cellf(t, "%" PRIu64, s->size_bytes) < 0 ||
            table_add_cellf(t, "%zu", s->n_slices) < 0 ||
            table_add_cell(t, isempty(s->token) ? "no" : "yes") < 0)
                return -ENOMEM;
        return 0;
}

/* The fields, the layout per parameter, every rank's shard. */
static int print_build(const TableOptions *o, const Familyd__V1__Build *b) {
        const Familyd__V1__Layout *l = b->info ? b->info->layout : NULL;
        _cleanup_(table_freep) Table *params = table_new(o, parameter_columns);
        _cleanup_(table_freep) Table *shards = table_new(o, shard_columns);
        int r;

        if (!params || !shards)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; l && i < l->n_parameters; i++)
                if (add_parameter_row(params, l->parameters[i]) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < b->n_shards; i++)
                if (add_shard_row(shards, b->shards[i]) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);

        print_build_fields(b);
        r = table_print(params, true);
        if (r == EXIT_OK)
                r = table_print(shards, true);
        return r;
}

/* ---------------------------------------------------------------------------------------- */
/* build FAMILY [KEY=VALUE...] */

typedef struct BuildState {
        Familyd__V1__BuildRequest *req;
        const char *config_path, *module_path, *module_fqn, *mesh, *dtype;
        const char *checkpoint, *prefix, *names, *shard_socket;
        bool materialize, seed_set;
        bool transient; /* not pinned: held by this process only, freed after the grace */
        uint64_t seed;
        int64_t *ranks;
        size_t n_ranks;
} BuildState;

enum {
        ARG_CONFIG = 0x100, ARG_ARG, ARG_MODULE, ARG_MODULE_FQN, ARG_MESH, ARG_MATERIALIZE,
        ARG_DTYPE, ARG_SEED, ARG_RANKS, ARG_TRANSIENT, ARG_PRIVATE, ARG_WRITABLE, ARG_DTYPE_OF,
        ARG_SHARE, ARG_CHECKPOINT, ARG_PREFIX, ARG_CHECKPOINT_NAMES, ARG_SHARD_SOCKET,
};

static const struct option build_options[] = {
        { "config",      required_argument, NULL, ARG_CONFIG },
        { "arg",         required_argument, NULL, ARG_ARG },
        { "module",      required_argument, NULL, ARG_MODULE },
        { "module-fqn",  required_argument, NULL, ARG_MODULE_FQN },
        { "mesh",        required_argument, NULL, ARG_MESH },
        { "materialize", no_argument,       NULL, ARG_MATERIALIZE },
        { "dtype",       required_argument, NULL, ARG_DTYPE },
        { "seed",        required_argument, NULL, ARG_SEED },
        { "ranks",       required_argument, NULL, ARG_RANKS },
        { "transient",   no_argument,       NULL, ARG_TRANSIENT },
        { "private",     no_argument,       NULL, ARG_PRIVATE },
        { "writable",    no_argument,       NULL, ARG_WRITABLE },
        { "dtype-of",    required_argument, NULL, ARG_DTYPE_OF },
        { "share",       required_argument, NULL, ARG_SHARE },
        { "checkpoint",  required_argument, NULL, ARG_CHECKPOINT },
        { "prefix",      required_argument, NULL, ARG_PREFIX },
        { "checkpoint-names", required_argument, NULL, ARG_CHECKPOINT_NAMES },
        { "shard-socket", required_argument, NULL, ARG_SHARD_SOCKET },
        {}
};

/* The request is made on the first option that adds to it (--arg), or before the positional
 * arguments are read. */
static int build_request(BuildState *s) {
        if (s->req)
                return EXIT_OK;
        s->req = malloc(sizeof(*s->req));
        if (!s->req)
                return ctl_fail("build the request", -ENOMEM, NULL);
        familyd__v1__build_request__init(s->req);
        return EXIT_OK;
}

static int build_seed(BuildState *s, const char *arg) {
        char *end;

        errno = 0;
        if (isempty(arg) || arg[0] == '-')
                return ctl_usage_error("build", "--seed needs an unsigned integer, not '%s'", arg);
        s->seed = strtoull(arg, &end, 10);
        if (errno != 0 || *end != 0)
                return ctl_usage_error("build", "--seed needs an unsigned integer, not '%s'", arg);
        s->seed_set = true;
        return EXIT_OK;
}

static int build_option(VerbRun *v, int c, const char *arg) {
        BuildState *s = v->state;
        int r;

        switch (c) {
        case ARG_CONFIG:
                s->config_path = arg;
                return EXIT_OK;
        case ARG_ARG:
                r = build_request(s);
                return r != EXIT_OK ? r : build_request_argument(s->req, arg);
        case ARG_MODULE:
                s->module_path = arg;
                return EXIT_OK;
        case ARG_MODULE_FQN:
                s->module_fqn = arg;
                return EXIT_OK;
        case ARG_MESH:
                if (isempty(arg))
                        return ctl_usage_error("build", "--mesh needs a mesh id");
                s->mesh = arg;
                return EXIT_OK;
        case ARG_MATERIALIZE:
                s->materialize = true;
                return EXIT_OK;
        case ARG_DTYPE:
                if (isempty(arg))
                        return ctl_usage_error("build", "--dtype needs a dtype");
                s->dtype = arg;
                return EXIT_OK;
        case ARG_SEED:
                return build_seed(s, arg);
        case ARG_TRANSIENT:
                s->transient = true;
                return EXIT_OK;
        case ARG_PRIVATE:
        case ARG_WRITABLE:
                r = build_request(s);
                if (r != EXIT_OK)
                        return r;
                if (c == ARG_PRIVATE)
                        s->req->private_build = true;
                else
                        s->req->writable = true;
                return EXIT_OK;
        case ARG_DTYPE_OF:
                r = build_request(s);
                return r != EXIT_OK ? r : build_request_parameter_dtype(s->req, arg);
        case ARG_SHARE:
                if (!streq_ptr(arg, "owner") && !streq_ptr(arg, "group"))
                        return ctl_usage_error("build", "--share needs owner or group, not '%s'", arg);
                r = build_request(s);
                if (r != EXIT_OK)
                        return r;
                /* Freed with the request (free_unpacked): a copy of its own. */
                free(s->req->share != protobuf_c_empty_string ? s->req->share : NULL);
                s->req->share = strdup(arg);
                if (!s->req->share) {
                        s->req->share = (char *) protobuf_c_empty_string;
                        return ctl_fail("build the request", -ENOMEM, NULL);
                }
                return EXIT_OK;
        case ARG_CHECKPOINT:
                if (isempty(arg))
                        return ctl_usage_error("build", "--checkpoint needs a file or directory");
                s->checkpoint = arg;
                return EXIT_OK;
        case ARG_PREFIX:
                s->prefix = arg;
                return EXIT_OK;
        case ARG_CHECKPOINT_NAMES:
                if (!streq_ptr(arg, "registry") && !streq_ptr(arg, "parameters"))
                        return ctl_usage_error("build", "--checkpoint-names needs registry or parameters, not '%s'",
                                               arg);
                s->names = arg;
                return EXIT_OK;
        case ARG_SHARD_SOCKET:
                if (isempty(arg))
                        return ctl_usage_error("build", "--shard-socket needs a path");
                s->shard_socket = arg;
                return EXIT_OK;
        case ARG_RANKS:
                s->ranks = mfree(s->ranks);
                r = ctl_parse_ranks(arg, &s->ranks, &s->n_ranks);
                if (r == -ENOMEM)
                        return ctl_fail("parse --ranks", r, NULL);
                if (r < 0)
                        return ctl_usage_error("build", "--ranks needs a list like 0,1 or 0-3, not '%s'", arg);
                return EXIT_OK;
        }
        return -1;
}

static int build_materialize(BuildState *s) {
        Familyd__V1__MaterializeOptions *m = malloc(sizeof(*m));

        if (!m)
                return ctl_fail("build the request", -ENOMEM, NULL);
        familyd__v1__materialize_options__init(m);
        s->req->materialize = m;
        m->enabled = true;
        if (s->dtype && !(m->dtype = strdup(s->dtype)))
                return ctl_fail("build the request", -ENOMEM, NULL);
        if (s->seed_set) {
                m->_seed_case = FAMILYD__V1__MATERIALIZE_OPTIONS___SEED_SEED;
                m->seed = s->seed;
        }
        m->ranks = TAKE_PTR(s->ranks);
        m->n_ranks = s->n_ranks;
        return EXIT_OK;
}

/* --checkpoint PATH: deposited on the shard socket (the files opened here, with this user's
 * rights), and its token named in the request. Nothing is sent when the checkpoint is refused
 * here: a usage error, as for `checkpoint inspect`. */
static int build_checkpoint(VerbRun *v) {
        BuildState *s = v->state;
        Familyd__V1__CheckpointRef *ref;
        char token[FAMILYD_CHECKPOINT_TOKEN_LEN + 1];
        int r;

        r = ctl_connect(v->ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_checkpoint_deposit(v->ctx->client, s->shard_socket, s->checkpoint, token, &v->error);
        if (r == -EPROTO)
                return ctl_fail("deposit the checkpoint", r, &v->error);
        if (r < 0 && v->error.code != 0) {
                fprintf(stderr, "familyctl: %s\n", strempty(v->error.message));
                return EXIT_USAGE;
        }
        if (r == -ENOENT || r == -ECONNREFUSED || r == -ETIMEDOUT) {
                fprintf(stderr, "familyctl: cannot reach the shard socket %s: %s\n",
                        s->shard_socket ? s->shard_socket : "(beside the API socket)", strerror(-r));
                return EXIT_UNREACHABLE;
        }
        if (r == -EBADMSG) {
                fprintf(stderr, "familyctl: the shard socket answered the deposit without a checkpoint token "
                        "(a familyd older than checkpoint builds?)\n");
                return EXIT_INTERNAL;
        }
        if (r < 0)
                return ctl_fail("deposit the checkpoint", r, NULL);

        ref = malloc(sizeof(*ref));
        if (!ref)
                return ctl_fail("build the request", -ENOMEM, NULL);
        familyd__v1__checkpoint_ref__init(ref);
        s->req->checkpoint = ref;
        ref->token = strdup(token);
        if (!ref->token) {
                ref->token = (char *) protobuf_c_empty_string;
                return ctl_fail("build the request", -ENOMEM, NULL);
        }
        if (!isempty(s->prefix) && !(ref->prefix = strdup(s->prefix))) {
                ref->prefix = (char *) protobuf_c_empty_string;
                return ctl_fail("build the request", -ENOMEM, NULL);
        }
        if (s->names && !(ref->names = strdup(s->names))) {
                ref->names = (char *) protobuf_c_empty_string;
                return ctl_fail("build the request", -ENOMEM, NULL);
        }
        return EXIT_OK;
}

static int build_prepare(VerbRun *v) {
        BuildState *s = v->state;
        Familyd__V1__BuildRequest *req;
        int r;

        if (!s->materialize && (s->dtype || s->seed_set || s->ranks))
                return ctl_usage_error("build", "--dtype, --seed and --ranks need --materialize");
        if (!s->materialize && s->transient)
                return ctl_usage_error("build", "--transient needs --materialize: only materialised builds are held");
        if (!s->materialize && s->checkpoint)
                return ctl_usage_error("build", "--checkpoint needs --materialize: a checkpoint fills this node's shards");
        if (!s->checkpoint && (s->prefix || s->names || s->shard_socket))
                return ctl_usage_error("build", "--prefix, --checkpoint-names and --shard-socket need --checkpoint");
        r = build_request(s);
        if (r != EXIT_OK)
                return r;
        req = s->req;
        req->family = strdup(v->args[0]);
        if (!req->family)
                return ctl_fail("build the request", -ENOMEM, NULL);

        if (s->config_path && (r = build_request_config_file(req, s->config_path)) != EXIT_OK)
                return r;
        for (size_t i = 1; i < v->n_args; i++)
                if ((r = build_request_config_field(req, v->args[i])) != EXIT_OK)
                        return r;
        if (s->module_path && (r = build_request_module_file(req, s->module_path)) != EXIT_OK)
                return r;
        /* Exactly one of config and module is the daemon's rule (and its message); not checked
         * here, so that the documented error shows. */
        if (s->module_fqn && !(req->module_fqn = strdup(s->module_fqn)))
                return ctl_fail("build the request", -ENOMEM, NULL);
        if (s->mesh && !(req->mesh_id = strdup(s->mesh)))
                return ctl_fail("build the request", -ENOMEM, NULL);
        if (s->materialize && (r = build_materialize(s)) != EXIT_OK)
                return r;
        return s->checkpoint ? build_checkpoint(v) : EXIT_OK;
}

/* A materialised build is pinned unless --transient: familyctl exits at once, and its
 * reference with it, so without the pin the build would be freed after the grace period. */
static int build_call(VerbRun *v) {
        BuildState *s = v->state;
        Familyd__V1__BuildResponse *resp;
        Familyd__V1__Build *pinned = NULL;
        ProgressBar *bar = NULL;
        int r;

        /* Without a bar (no terminal, --json, no memory) the Build goes on all the same. */
        if (s->materialize && progress_bar_start(v->ctx, &bar) >= 0 && bar &&
            !(s->req->progress_tag = strdup(progress_bar_tag(bar))))
                bar = progress_bar_stop(bar);
        r = familyd_build(v->ctx->client, s->req, (Familyd__V1__BuildResponse **) &v->response, &v->error);
        bar = progress_bar_stop(bar);
        if (r < 0 || !s->materialize || s->transient)
                return r;
        resp = (Familyd__V1__BuildResponse *) v->response;
        if (!resp->build)
                return -EBADMSG;
        r = familyd_pin_build(v->ctx->client, resp->build->build_id, &pinned, &v->error);
        if (r < 0)
                return r;
        familyd__v1__build__free_unpacked(resp->build, NULL);
        resp->build = pinned;
        return 0;
}

static int build_print(VerbRun *v) {
        const Familyd__V1__BuildResponse *resp = (const Familyd__V1__BuildResponse *) v->response;

        if (!resp->build)
                return ctl_fail("build", -EBADMSG, NULL);
        return print_build(&v->ctx->table, resp->build);
}

static void build_done(VerbRun *v) {
        BuildState *s = v->state;

        if (s->req)
                familyd__v1__build_request__free_unpacked(s->req, NULL);
        free(s->ranks);
}

static const VerbDef build_verb = {
        .name = "build",
        .help = "Usage: familyctl build [OPTIONS] FAMILY [KEY=VALUE...]\n"
                "\n"
                "Builds FAMILY (name or baseline) and prints the build: id, resolved member, layout per\n"
                "parameter, and every rank's shard (node, device, bytes, materialised here or not).\n"
                "\n"
                "The model configuration (BuildRequest.config) comes from --config FILE.json, a JSON object\n"
                "of field names to numbers, strings, bools (or lists of them), and from KEY=VALUE\n"
                "arguments, which override the file's fields. VALUE is read as: true/false -> bool; an\n"
                "integer -> int; a number with '.', 'e' or 'E' -> float; anything else -> string.\n"
                "\n"
                "      --config FILE.json    config fields from a JSON object\n"
                "      --arg KEY=VALUE       a selector or argument of the family (repeatable),\n"
                "                            e.g. --arg use_mxfp8=true --arg activation=gelu\n"
                "      --module FILE.json    replace a source module instead of a config:\n"
                "                            {\"fqn\": \"layers.0.mlp\", \"parameters\": [{\"name\": \"w\",\n"
                "                            \"shape\": [8, 16], \"dtype\": \"float32\"}]}\n"
                "      --module-fqn FQN      BuildRequest.module_fqn (default: the module's fqn)\n"
                "      --mesh ID             lay the parameters out over a mesh of `familyctl mesh create`\n"
                "      --materialize         fill this node's shards in shared memory\n"
                "        --dtype DTYPE       float32 (default), bfloat16, float16 (or f32, bf16, f16...)\n"
                "        --seed N            the seed of the initial values (default 0)\n"
                "        --ranks LIST        only these local ranks, e.g. 0,1 or 0-3\n"
                "        --dtype-of NAME=DTYPE\n"
                "                            this parameter's dtype (repeatable; over the registry's\n"
                "                            dtype and --dtype)\n"
                "        --transient         do not pin the build: it is freed after the daemon's\n"
                "                            grace period (--build-grace-ms), since familyctl exits\n"
                "        --private           a build of its own, never shared with another Build\n"
                "        --writable          writable shards, for shared mappings (`shard --mode shared`)\n"
                "        --share WHO         who may map the shards: owner (default: this user's\n"
                "                            processes and admins) or group (the shard socket's group)\n"
                "        --checkpoint PATH   fill the parameters from a safetensors checkpoint instead\n"
                "                            of their inits: a .safetensors file, or a directory (its\n"
                "                            *.index.json and every *.safetensors in it), opened\n"
                "                            here with your rights and handed to the daemon\n"
                "          --prefix P        the member's place in the checkpoint, for the registry's\n"
                "                            {prefix}, e.g. model.layers.0.mlp\n"
                "          --checkpoint-names registry|parameters\n"
                "                            how its tensors are named: by the registry's checkpoint\n"
                "                            names (default), or as the member's parameters after\n"
                "                            the prefix (P.gate_proj: what familyd.torch's\n"
                "                            save_checkpoint writes)\n"
                "          --shard-socket PATH\n"
                "                            the daemon's shard socket, where the files are handed\n"
                "                            over (default: shard.sock beside the API socket)\n"
                "\n"
                "A JSON file with a duplicate object key, or that is not JSON, is refused with its\n"
                "line and column. A checkpoint that cannot be handed over (missing, not readable by\n"
                "you, a directory without *.safetensors files or with two *.index.json, more than\n"
                "253 files) is refused before anything is sent, naming the file (exit 2).\n"
                "\n"
                "A materialised build is pinned (`familyctl unpin BUILD_ID` lets it go when no process\n"
                "holds it); a live build with the same request, mesh, seed, dtypes, ranks and\n"
                "writability (and checkpoint: the same files, unchanged, and prefix), made by the\n"
                "same user, is answered instead of a new one.\n"
                "`familyctl shard BUILD_ID RANK` shows a materialised shard; `familyctl release\n"
                "BUILD_ID --force` frees a build whatever holds it.\n"
                "\n",
        .options = build_options,
        .option = build_option,
        .min_args = 1,
        .max_args = UINT_MAX,
        .args_missing = "missing family name",
        .tables = build_tables,
        .state_size = sizeof(BuildState),
        .prepare = build_prepare,
        .call = build_call,
        .what = "build",
        .print = build_print,
        .done = build_done,
};

int verb_build(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &build_verb, argc, argv);
}

/* ---------------------------------------------------------------------------------------- */
/* build-info ID */

static int build_info_call(VerbRun *v) {
        return familyd_get_build(v->ctx->client, v->args[0], (Familyd__V1__Build **) &v->response, &v->error);
}

static int build_info_print(VerbRun *v) {
        return print_build(&v->ctx->table, (const Familyd__V1__Build *) v->response);
}

static const VerbDef build_info_verb = {
        .name = "build-info",
        .help = "Usage: familyctl build-info [OPTIONS] BUILD_ID\n"
                "\n"
                "Shows one build as `familyctl build` printed it: provenance, config\n"
                "snapshot, layout per parameter, and every rank's shard. --json prints\n"
                "the familyd.v1.Build (with the shard tokens).\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one build id",
        .args_extra = "expected exactly one build id",
        .tables = build_tables,
        .call = build_info_call,
        .what = "get build",
        .print = build_info_print,
};

int verb_build_info(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &build_info_verb, argc, argv);
}

/* ---------------------------------------------------------------------------------------- */
/* builds */

static const char *const builds_columns[] = {
        "BUILD_ID", "FAMILY", "VARIANT", "ORIGIN", "MESH", "RANKS", "MATERIALIZED", "BYTES",
        "PINNED", "REFS", "GRACE", NULL,
};
static const char *const *const builds_tables[] = { builds_columns, NULL };

/* The seconds left of a build's grace period, or "-" while something holds it. */
static int add_grace_cell(Table *t, const Familyd__V1__Build *b) {
        int64_t left = b->grace_deadline_unix_ms - ctl_now_unix_ms();

        if (b->grace_deadline_unix_ms <= 0)
                return table_add_cell(t, NULL);
        return table_add_cellf(t, "%" PRId64 "s", left > 0 ? (left + 999) / 1000 : 0);
}

static int add_builds_row(Table *t, const Familyd__V1__Build *b) {
        const Familyd__V1__FamilyBuildInfo *info = b->info;
        const Familyd__V1__ResolvedFamily *rf = info ? info->resolved : NULL;
        const Familyd__V1__Layout *l = info ? info->layout : NULL;
        uint64_t bytes;
        size_t n_mat = shards_materialized(b, &bytes);

        if (table_add_cell(t, b->build_id) < 0 ||
            table_add_cell(t, rf ? rf->family : NULL) < 0 ||
            table_add_cell(t, rf ? rf->variant : NULL) < 0 ||
            table_add_cell(t, info ? info->origin : NULL) < 0 ||
            table_add_cell(t, l ? l->mesh_id : NULL) < 0 ||
            table_add_cellf(t, "%zu", b->n_shards) < 0 ||
            table_add_cellf(t, "%zu", n_mat) < 0 ||
            table_add_cellf(t, "%" PRIu64, bytes) < 0 ||
            table_add_cell(t, b->pinned ? "yes" : "no") < 0 ||
            table_add_cellf(t, "%zu", b->n_references) < 0 ||
            add_grace_cell(t, b) < 0)
                return -ENOMEM;
        return 0;
}

static int builds_call(VerbRun *v) {
        return familyd_list_builds(v->ctx->client, (Familyd__V1__ListBuildsResponse **) &v->response, &v->error);
}

static int builds_print(VerbRun *v) {
        const Familyd__V1__ListBuildsResponse *resp = (const Familyd__V1__ListBuildsResponse *) v->response;
        _cleanup_(table_freep) Table *t = table_new(&v->ctx->table, builds_columns);

        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < resp->n_builds; i++)
                if (add_builds_row(t, resp->builds[i]) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        return table_print(t, false);
}

static const VerbDef builds_verb = {
        .name = "builds",
        .help = "Usage: familyctl builds [OPTIONS]\n"
                "\n"
                "Lists the daemon's builds: BUILD_ID FAMILY VARIANT ORIGIN MESH RANKS\n"
                "MATERIALIZED (ranks materialised on this node) BYTES (their shared memory)\n"
                "PINNED REFS (processes holding it) GRACE (time left before a build nothing\n"
                "holds is freed).\n"
                "\n",
        .tables = builds_tables,
        .call = builds_call,
        .what = "list builds",
        .print = builds_print,
};

int verb_builds(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &builds_verb, argc, argv);
}

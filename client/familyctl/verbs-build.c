/* verbs-build.c: familyctl build, builds, build-info, release, shard. */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "familyctl.h"
#include "macro.h"

/* How many leading values of each slice `familyctl shard` prints. */
#define SHARD_FIRST_VALUES 4

/* The request is assembled on the heap, every string and array malloc()ed, so that protobuf-c's
 * free_unpacked (which frees with the default allocator) releases all of it. */
static void build_request_freep(Familyd__V1__BuildRequest **p) {
        if (*p)
                familyd__v1__build_request__free_unpacked(*p, NULL);
}

static char *shape_to_string(const int64_t *dims, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);

        if (!f)
                return NULL;
        fputc('[', f);
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%" PRId64, i > 0 ? "," : "", dims[i]);
        fputc(']', f);
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

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

/* ---------------------------------------------------------------------------------------- */
/* Building the request */

static int value_from_json(const JsonValue *j, Familyd__V1__Value **ret, const char **ret_why) {
        Familyd__V1__Value *v = malloc(sizeof(*v));

        if (!v)
                return -ENOMEM;
        familyd__v1__value__init(v);
        switch (j->type) {
        case JSON_BOOL:
                v->kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
                v->bool_value = j->boolean;
                break;
        case JSON_NUMBER:
                if (j->is_int) {
                        v->kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
                        v->int_value = j->integer;
                } else {
                        v->kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                        v->double_value = j->number;
                }
                break;
        case JSON_STRING:
                v->kind_case = FAMILYD__V1__VALUE__KIND_STRING_VALUE;
                v->string_value = strdup(j->string);
                if (!v->string_value) {
                        free(v);
                        return -ENOMEM;
                }
                break;
        case JSON_ARRAY: {
                Familyd__V1__ValueList *l = malloc(sizeof(*l));

                if (!l) {
                        free(v);
                        return -ENOMEM;
                }
                familyd__v1__value_list__init(l);
                v->kind_case = FAMILYD__V1__VALUE__KIND_LIST_VALUE;
                v->list_value = l;
                if (j->n > 0) {
                        l->values = calloc(j->n, sizeof(*l->values));
                        if (!l->values) {
                                familyd__v1__value__free_unpacked(v, NULL);
                                return -ENOMEM;
                        }
                }
                for (size_t i = 0; i < j->n; i++) {
                        int r = value_from_json(j->items[i], &l->values[i], ret_why);

                        if (r < 0) {
                                familyd__v1__value__free_unpacked(v, NULL);
                                return r;
                        }
                        l->n_values++;
                }
                break;
        }
        default:
                free(v);
                *ret_why = j->type == JSON_NULL ? "null is not a value" : "objects are not values";
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

/* Sets key to v in config (replacing an earlier value of that key); takes v. */
static int config_set(Familyd__V1__Config *config, const char *key, Familyd__V1__Value *v) {
        Familyd__V1__Config__FieldsEntry *e, **grown;

        for (size_t i = 0; i < config->n_fields; i++)
                if (streq_ptr(config->fields[i]->key, key)) {
                        familyd__v1__value__free_unpacked(config->fields[i]->value, NULL);
                        config->fields[i]->value = v;
                        return 0;
                }
        grown = realloc(config->fields, (config->n_fields + 1) * sizeof(*grown));
        if (!grown)
                goto fail;
        config->fields = grown;
        e = malloc(sizeof(*e));
        if (!e)
                goto fail;
        familyd__v1__config__fields_entry__init(e);
        e->key = strdup(key);
        if (!e->key) {
                free(e);
                goto fail;
        }
        e->value = v;
        config->fields[config->n_fields++] = e;
        return 0;
fail:
        familyd__v1__value__free_unpacked(v, NULL);
        return -ENOMEM;
}

/* A value of KEY=VALUE text, heap-allocated (the string copied). */
static int value_from_text(const char *text, Familyd__V1__Value **ret) {
        Familyd__V1__Value tmp, *v;

        (void) ctl_parse_value(text, &tmp);
        v = malloc(sizeof(*v));
        if (!v)
                return -ENOMEM;
        *v = tmp;
        if (v->kind_case == FAMILYD__V1__VALUE__KIND_STRING_VALUE) {
                v->string_value = strdup(text);
                if (!v->string_value) {
                        free(v);
                        return -ENOMEM;
                }
        }
        *ret = v;
        return 0;
}

static int argument_add(Familyd__V1__BuildRequest *req, const char *key, Familyd__V1__Value *v) {
        Familyd__V1__BuildRequest__ArgumentsEntry *e, **grown;

        for (size_t i = 0; i < req->n_arguments; i++)
                if (streq_ptr(req->arguments[i]->key, key)) {
                        familyd__v1__value__free_unpacked(req->arguments[i]->value, NULL);
                        req->arguments[i]->value = v;
                        return 0;
                }
        grown = realloc(req->arguments, (req->n_arguments + 1) * sizeof(*grown));
        if (!grown)
                goto fail;
        req->arguments = grown;
        e = malloc(sizeof(*e));
        if (!e)
                goto fail;
        familyd__v1__build_request__arguments_entry__init(e);
        e->key = strdup(key);
        if (!e->key) {
                free(e);
                goto fail;
        }
        e->value = v;
        req->arguments[req->n_arguments++] = e;
        return 0;
fail:
        familyd__v1__value__free_unpacked(v, NULL);
        return -ENOMEM;
}

static int ensure_config(Familyd__V1__BuildRequest *req) {
        if (req->config)
                return 0;
        req->config = malloc(sizeof(*req->config));
        if (!req->config)
                return -ENOMEM;
        familyd__v1__config__init(req->config);
        return 0;
}

/* --config FILE: a JSON object of names to numbers, strings, bools (or lists of them). */
static int load_config(Familyd__V1__BuildRequest *req, const char *path) {
        _cleanup_(json_value_freep) JsonValue *doc = NULL;
        _cleanup_free_ char *why = NULL;
        int r;

        r = json_parse_file(path, &doc, &why);
        if (r == -ENOMEM)
                return ctl_fail("read --config", r, NULL);
        if (r == -EINVAL)
                return ctl_usage_error("build", "--config %s: not JSON: %s", path, strempty(why));
        if (r < 0)
                return ctl_usage_error("build", "--config %s: %s", path, strerror(-r));
        if (doc->type != JSON_OBJECT)
                return ctl_usage_error("build", "--config %s: expected a JSON object of field names to values", path);

        r = ensure_config(req);
        if (r < 0)
                return ctl_fail("read --config", r, NULL);
        for (size_t i = 0; i < doc->n; i++) {
                Familyd__V1__Value *v = NULL;
                const char *bad = NULL;

                r = value_from_json(doc->items[i], &v, &bad);
                if (r == -EINVAL)
                        return ctl_usage_error("build", "--config %s: field '%s': %s", path, doc->keys[i], bad);
                if (r >= 0)
                        r = config_set(req->config, doc->keys[i], v);
                if (r < 0)
                        return ctl_fail("read --config", r, NULL);
        }
        return EXIT_OK;
}

/* --module FILE: {"fqn": "layers.0.mlp", "parameters": [{"name": "w", "shape": [8, 16], "dtype":
 * "float32"}, ...]}, the JSON form of SourceModule. */
static int load_module(Familyd__V1__BuildRequest *req, const char *path) {
        _cleanup_(json_value_freep) JsonValue *doc = NULL;
        _cleanup_free_ char *why = NULL;
        const JsonValue *fqn, *params;
        Familyd__V1__SourceModule *m;
        int r;

        r = json_parse_file(path, &doc, &why);
        if (r == -ENOMEM)
                return ctl_fail("read --module", r, NULL);
        if (r == -EINVAL)
                return ctl_usage_error("build", "--module %s: not JSON: %s", path, strempty(why));
        if (r < 0)
                return ctl_usage_error("build", "--module %s: %s", path, strerror(-r));
        if (doc->type != JSON_OBJECT)
                return ctl_usage_error("build", "--module %s: expected an object {\"fqn\": ..., \"parameters\": [...]}", path);
        for (size_t i = 0; i < doc->n; i++)
                if (!streq(doc->keys[i], "fqn") && !streq(doc->keys[i], "parameters"))
                        return ctl_usage_error("build", "--module %s: unknown key '%s' (fqn, parameters)", path, doc->keys[i]);
        fqn = json_object_get(doc, "fqn");
        params = json_object_get(doc, "parameters");
        if (fqn && fqn->type != JSON_STRING)
                return ctl_usage_error("build", "--module %s: fqn must be a string", path);
        if (params && params->type != JSON_ARRAY)
                return ctl_usage_error("build", "--module %s: parameters must be a list", path);

        m = malloc(sizeof(*m));
        if (!m)
                return ctl_fail("read --module", -ENOMEM, NULL);
        familyd__v1__source_module__init(m);
        if (req->module)
                familyd__v1__source_module__free_unpacked(req->module, NULL);
        req->module = m;
        if (fqn) {
                m->fqn = strdup(fqn->string);
                if (!m->fqn)
                        return ctl_fail("read --module", -ENOMEM, NULL);
        }
        if (!params || params->n == 0)
                return EXIT_OK;
        m->parameters = calloc(params->n, sizeof(*m->parameters));
        if (!m->parameters)
                return ctl_fail("read --module", -ENOMEM, NULL);
        for (size_t i = 0; i < params->n; i++) {
                const JsonValue *p = params->items[i], *name, *shape, *dtype;
                Familyd__V1__SourceParameter *sp;

                if (p->type != JSON_OBJECT)
                        return ctl_usage_error("build", "--module %s: parameters[%zu] must be an object", path, i);
                for (size_t k = 0; k < p->n; k++)
                        if (!streq(p->keys[k], "name") && !streq(p->keys[k], "shape") && !streq(p->keys[k], "dtype"))
                                return ctl_usage_error("build", "--module %s: parameters[%zu]: unknown key '%s' (name, shape, dtype)",
                                                       path, i, p->keys[k]);
                name = json_object_get(p, "name");
                shape = json_object_get(p, "shape");
                dtype = json_object_get(p, "dtype");
                if (!name || name->type != JSON_STRING)
                        return ctl_usage_error("build", "--module %s: parameters[%zu] needs a string name", path, i);
                if (shape && shape->type != JSON_ARRAY)
                        return ctl_usage_error("build", "--module %s: parameters[%zu].shape must be a list of integers", path, i);
                if (dtype && dtype->type != JSON_STRING)
                        return ctl_usage_error("build", "--module %s: parameters[%zu].dtype must be a string", path, i);

                sp = malloc(sizeof(*sp));
                if (!sp)
                        return ctl_fail("read --module", -ENOMEM, NULL);
                familyd__v1__source_parameter__init(sp);
                m->parameters[m->n_parameters++] = sp;
                sp->name = strdup(name->string);
                if (!sp->name)
                        return ctl_fail("read --module", -ENOMEM, NULL);
                if (dtype) {
                        sp->dtype = strdup(dtype->string);
                        if (!sp->dtype)
                                return ctl_fail("read --module", -ENOMEM, NULL);
                }
                if (shape && shape->n > 0) {
                        sp->shape = calloc(shape->n, sizeof(*sp->shape));
                        if (!sp->shape)
                                return ctl_fail("read --module", -ENOMEM, NULL);
                        for (size_t k = 0; k < shape->n; k++) {
                                if (shape->items[k]->type != JSON_NUMBER || !shape->items[k]->is_int)
                                        return ctl_usage_error("build", "--module %s: parameters[%zu].shape must be a list of integers",
                                                               path, i);
                                sp->shape[sp->n_shape++] = shape->items[k]->integer;
                        }
                }
        }
        return EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Printing builds */

static const Familyd__V1__ParameterLayout *layout_parameter(const Familyd__V1__Build *b, const char *name) {
        const Familyd__V1__Layout *l = b->info ? b->info->layout : NULL;

        for (size_t i = 0; l && i < l->n_parameters; i++)
                if (streq_ptr(l->parameters[i]->name, name))
                        return l->parameters[i];
        return NULL;
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

static void print_build(const Familyd__V1__Build *b) {
        const Familyd__V1__FamilyBuildInfo *info = b->info;
        const Familyd__V1__ResolvedFamily *rf = info ? info->resolved : NULL;
        const Familyd__V1__Layout *l = info ? info->layout : NULL;
        _cleanup_(table_freep) Table *params = NULL, *shards = NULL;
        uint64_t bytes;
        size_t n_mat = shards_materialized(b, &bytes);
        char *cfg = NULL;
        size_t cfg_size = 0;
        FILE *f;

        ctl_print_field("build id", "%s", strempty(b->build_id));
        ctl_print_field("family", "%s", rf && !isempty(rf->family) ? rf->family : "-");
        ctl_print_field("variant", "%s", rf && !isempty(rf->variant) ? rf->variant : "-");
        ctl_print_field("constructor", "%s", rf && !isempty(rf->constructor) ? rf->constructor : "-");
        ctl_print_field("origin", "%s", info && !isempty(info->origin) ? info->origin : "-");
        ctl_print_field("mesh", "%s", l && !isempty(l->mesh_id) ? l->mesh_id : "-");
        f = open_memstream(&cfg, &cfg_size);
        if (f) {
                const Familyd__V1__Config *c = info ? info->config_snapshot : NULL;

                for (size_t i = 0; c && i < c->n_fields; i++) {
                        _cleanup_free_ char *v = ctl_value_to_string(c->fields[i]->value);

                        fprintf(f, "%s%s=%s", i > 0 ? " " : "", strempty(c->fields[i]->key), strempty(v));
                }
                if (!c || c->n_fields == 0)
                        fputc('-', f);
                if (fclose(f) != 0)
                        cfg = mfree(cfg);
        }
        ctl_print_field("config", "%s", strempty(cfg));
        free(cfg);
        ctl_print_field("reset after init", "%s", info && info->reset_after_materialization ? "yes" : "no");
        ctl_print_field("shard socket", "%s", isempty(b->shard_socket) ? "-" : b->shard_socket);
        ctl_print_field("materialized", "%zu of %zu ranks, %" PRIu64 " bytes", n_mat, b->n_shards, bytes);

        putchar('\n');
        params = table_new(5, "PARAMETER", "SHAPE", "DTYPE", "PLACEMENTS", "VIEW");
        if (params && l)
                for (size_t i = 0; i < l->n_parameters; i++) {
                        const Familyd__V1__ParameterLayout *p = l->parameters[i];
                        _cleanup_free_ char *shape = shape_to_string(p->shape, p->n_shape);
                        _cleanup_free_ char *pl = placements_to_string(p->placements, p->n_placements);

                        (void) table_add_cell(params, p->name);
                        (void) table_add_cell(params, shape);
                        (void) table_add_cell(params, p->dtype);
                        (void) table_add_cell(params, pl);
                        (void) table_add_cell(params, p->mesh_view);
                }
        if (params)
                (void) table_print(params, stdout);

        putchar('\n');
        shards = table_new(6, "RANK", "NODE", "DEVICE", "BYTES", "SLICES", "MATERIALIZED");
        if (shards)
                for (size_t i = 0; i < b->n_shards; i++) {
                        const Familyd__V1__RankShard *s = b->shards[i];

                        (void) table_add_cellf(shards, "%" PRId64, s->rank);
                        (void) table_add_cell(shards, s->node);
                        (void) table_add_cellf(shards, "%s:%d", isempty(s->device_kind) ? "-" : s->device_kind, s->local_device);
                        (void) table_add_cellf(shards, "%" PRIu64, s->size_bytes);
                        (void) table_add_cellf(shards, "%zu", s->n_slices);
                        (void) table_add_cell(shards, isempty(s->token) ? "no" : "yes");
                }
        if (shards)
                (void) table_print(shards, stdout);
}

/* ---------------------------------------------------------------------------------------- */
/* build */

static const char build_help[] =
        "Usage: familyctl build [OPTIONS] FAMILY [KEY=VALUE...]\n"
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
        "\n"
        "`familyctl shard BUILD_ID RANK` shows a materialised shard; `familyctl release BUILD_ID`\n"
        "drops the daemon's hold on the build's memory.\n"
        "\n"
        COMMON_OPTIONS_HELP;

int verb_build(Context *ctx, int argc, char **argv) {
        enum {
                ARG_CONFIG = 0x100, ARG_ARG, ARG_MODULE, ARG_MODULE_FQN, ARG_MESH, ARG_MATERIALIZE,
                ARG_DTYPE, ARG_SEED, ARG_RANKS,
        };
        static const struct option options[] = {
                COMMON_LONG_OPTIONS,
                { "config",      required_argument, NULL, ARG_CONFIG },
                { "arg",         required_argument, NULL, ARG_ARG },
                { "module",      required_argument, NULL, ARG_MODULE },
                { "module-fqn",  required_argument, NULL, ARG_MODULE_FQN },
                { "mesh",        required_argument, NULL, ARG_MESH },
                { "materialize", no_argument,       NULL, ARG_MATERIALIZE },
                { "dtype",       required_argument, NULL, ARG_DTYPE },
                { "seed",        required_argument, NULL, ARG_SEED },
                { "ranks",       required_argument, NULL, ARG_RANKS },
                {}
        };
        _cleanup_(build_request_freep) Familyd__V1__BuildRequest *req = NULL;
        _cleanup_free_ int64_t *ranks = NULL;
        const char *config_path = NULL, *module_path = NULL, *module_fqn = NULL, *mesh = NULL, *dtype = NULL;
        bool materialize = false, seed_set = false;
        uint64_t seed = 0;
        size_t n_ranks = 0;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__BuildResponse *resp = NULL;
        int c, r;

        req = malloc(sizeof(*req));
        if (!req)
                return ctl_fail("build the request", -ENOMEM, NULL);
        familyd__v1__build_request__init(req);

        while ((c = getopt_long(argc, argv, "s:jt:h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        fputs(build_help, stdout);
                        return EXIT_OK;
                case '?':
                        return ctl_usage_error("build", "invalid option");
                case ARG_CONFIG:
                        config_path = optarg;
                        break;
                case ARG_ARG: {
                        _cleanup_free_ char *kv = strdup(optarg);
                        Familyd__V1__Value *v = NULL;
                        char *eq;

                        if (!kv)
                                return ctl_fail("parse --arg", -ENOMEM, NULL);
                        eq = strchr(kv, '=');
                        if (!eq || eq == kv)
                                return ctl_usage_error("build", "--arg needs KEY=VALUE, not '%s'", optarg);
                        *eq = 0;
                        r = value_from_text(eq + 1, &v);
                        if (r >= 0)
                                r = argument_add(req, kv, v);
                        if (r < 0)
                                return ctl_fail("parse --arg", r, NULL);
                        break;
                }
                case ARG_MODULE:
                        module_path = optarg;
                        break;
                case ARG_MODULE_FQN:
                        module_fqn = optarg;
                        break;
                case ARG_MESH:
                        if (isempty(optarg))
                                return ctl_usage_error("build", "--mesh needs a mesh id");
                        mesh = optarg;
                        break;
                case ARG_MATERIALIZE:
                        materialize = true;
                        break;
                case ARG_DTYPE:
                        if (isempty(optarg))
                                return ctl_usage_error("build", "--dtype needs a dtype");
                        dtype = optarg;
                        break;
                case ARG_SEED: {
                        char *end;

                        errno = 0;
                        if (isempty(optarg) || optarg[0] == '-')
                                return ctl_usage_error("build", "--seed needs an unsigned integer, not '%s'", optarg);
                        seed = strtoull(optarg, &end, 10);
                        if (errno != 0 || *end != 0)
                                return ctl_usage_error("build", "--seed needs an unsigned integer, not '%s'", optarg);
                        seed_set = true;
                        break;
                }
                case ARG_RANKS:
                        ranks = mfree(ranks);
                        r = ctl_parse_ranks(optarg, &ranks, &n_ranks);
                        if (r == -ENOMEM)
                                return ctl_fail("parse --ranks", r, NULL);
                        if (r < 0)
                                return ctl_usage_error("build", "--ranks needs a list like 0,1 or 0-3, not '%s'", optarg);
                        break;
                default:
                        r = ctl_common_option(ctx, c, optarg);
                        if (r != EXIT_OK)
                                return r < 0 ? EXIT_INTERNAL : r;
                }
        }

        if (optind >= argc)
                return ctl_usage_error("build", "missing family name");
        if (!materialize && (dtype || seed_set || ranks))
                return ctl_usage_error("build", "--dtype, --seed and --ranks need --materialize");
        req->family = strdup(argv[optind++]);
        if (!req->family)
                return ctl_fail("build the request", -ENOMEM, NULL);

        if (config_path) {
                r = load_config(req, config_path);
                if (r != EXIT_OK)
                        return r;
        }
        for (; optind < argc; optind++) {
                const char *kv = argv[optind], *eq = strchr(kv, '=');
                _cleanup_free_ char *key = NULL;
                Familyd__V1__Value *v = NULL;

                if (!eq || eq == kv)
                        return ctl_usage_error("build", "expected KEY=VALUE, not '%s'", kv);
                key = strndup(kv, (size_t) (eq - kv));
                r = key ? ensure_config(req) : -ENOMEM;
                if (r >= 0)
                        r = value_from_text(eq + 1, &v);
                if (r >= 0)
                        r = config_set(req->config, key, v);
                if (r < 0)
                        return ctl_fail("parse KEY=VALUE", r, NULL);
        }
        if (module_path) {
                r = load_module(req, module_path);
                if (r != EXIT_OK)
                        return r;
        }
        /* Exactly one of config and module is the daemon's rule (and its message); not checked
         * here, so that the documented error shows. */
        if (module_fqn) {
                req->module_fqn = strdup(module_fqn);
                if (!req->module_fqn)
                        return ctl_fail("build the request", -ENOMEM, NULL);
        }
        if (mesh) {
                req->mesh_id = strdup(mesh);
                if (!req->mesh_id)
                        return ctl_fail("build the request", -ENOMEM, NULL);
        }
        if (materialize) {
                Familyd__V1__MaterializeOptions *m = malloc(sizeof(*m));

                if (!m)
                        return ctl_fail("build the request", -ENOMEM, NULL);
                familyd__v1__materialize_options__init(m);
                req->materialize = m;
                m->enabled = true;
                if (dtype) {
                        m->dtype = strdup(dtype);
                        if (!m->dtype)
                                return ctl_fail("build the request", -ENOMEM, NULL);
                }
                if (seed_set) {
                        m->_seed_case = FAMILYD__V1__MATERIALIZE_OPTIONS___SEED_SEED;
                        m->seed = seed;
                }
                m->ranks = TAKE_PTR(ranks);
                m->n_ranks = n_ranks;
        }

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_build(ctx->client, req, &resp, &error);
        if (r < 0) {
                r = ctl_fail("build", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        if (ctx->json)
                r = ctl_print_json(&resp->base);
        else if (!resp->build)
                r = ctl_fail("build", -EBADMSG, NULL);
        else {
                print_build(resp->build);
                r = EXIT_OK;
        }
        familyd__v1__build_response__free_unpacked(resp, NULL);
        return r;
}

/* ---------------------------------------------------------------------------------------- */
/* builds, build-info, release */

int verb_builds(Context *ctx, int argc, char **argv) {
        _cleanup_(table_freep) Table *t = NULL;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__ListBuildsResponse *resp = NULL;
        int r;

        PARSE_SIMPLE_VERB("builds",
                          "Usage: familyctl builds [OPTIONS]\n"
                          "\n"
                          "Lists the daemon's builds: BUILD_ID FAMILY VARIANT ORIGIN MESH RANKS\n"
                          "MATERIALIZED (ranks materialised on this node) BYTES (their shared memory).\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (optind < argc)
                return ctl_usage_error("builds", "unexpected argument '%s'", argv[optind]);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_list_builds(ctx->client, &resp, &error);
        if (r < 0) {
                r = ctl_fail("list builds", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json) {
                r = ctl_print_json(&resp->base);
                goto finish;
        }

        t = table_new(8, "BUILD_ID", "FAMILY", "VARIANT", "ORIGIN", "MESH", "RANKS", "MATERIALIZED", "BYTES");
        if (!t) {
                r = ctl_fail("build table", -ENOMEM, NULL);
                goto finish;
        }
        for (size_t i = 0; i < resp->n_builds; i++) {
                const Familyd__V1__Build *b = resp->builds[i];
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
                    table_add_cellf(t, "%" PRIu64, bytes) < 0) {
                        r = ctl_fail("build table", -ENOMEM, NULL);
                        goto finish;
                }
        }
        (void) table_print(t, stdout);
        r = EXIT_OK;
finish:
        familyd__v1__list_builds_response__free_unpacked(resp, NULL);
        return r;
}

int verb_build_info(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__Build *b = NULL;
        int r;

        PARSE_SIMPLE_VERB("build-info",
                          "Usage: familyctl build-info [OPTIONS] BUILD_ID\n"
                          "\n"
                          "Shows one build as `familyctl build` printed it: provenance, config\n"
                          "snapshot, layout per parameter, and every rank's shard. --json prints\n"
                          "the familyd.v1.Build (with the shard tokens).\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (argc - optind != 1)
                return ctl_usage_error("build-info", "expected exactly one build id");

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_get_build(ctx->client, argv[optind], &b, &error);
        if (r < 0) {
                r = ctl_fail("get build", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json)
                r = ctl_print_json(&b->base);
        else {
                print_build(b);
                r = EXIT_OK;
        }
        familyd__v1__build__free_unpacked(b, NULL);
        return r;
}

int verb_release(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        int r;

        PARSE_SIMPLE_VERB("release",
                          "Usage: familyctl release [OPTIONS] BUILD_ID\n"
                          "\n"
                          "Releases a build: the daemon drops its hold on the build's shared memory\n"
                          "(mappings and descriptors that trainers hold stay valid). Prints nothing.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (argc - optind != 1)
                return ctl_usage_error("release", "expected exactly one build id");

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_release_build(ctx->client, argv[optind], &error);
        if (r < 0) {
                r = ctl_fail("release build", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json)
                puts("{}");
        return EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* shard */

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
        uint64_t h = UINT64_C(0xcbf29ce484222325);

        for (size_t i = 0; i < n; i++) {
                h ^= p[i];
                h *= UINT64_C(0x100000001b3);
        }
        return h;
}

static float half_to_float(uint16_t h) {
        unsigned sign = h >> 15, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
        float v;

        if (exp == 0)
                v = ldexpf((float) frac, -24);
        else if (exp == 31)
                v = frac ? NAN : INFINITY;
        else
                v = ldexpf((float) (frac | 0x400), (int) exp - 25);
        return sign ? -v : v;
}

/* Element size of a layout dtype (the daemon's names), 0 when unknown. */
static size_t dtype_size(const char *dtype) {
        if (isempty(dtype) || streq(dtype, "float32"))
                return 4;
        if (streq(dtype, "bfloat16") || streq(dtype, "float16"))
                return 2;
        return 0;
}

static float element_at(const uint8_t *p, const char *dtype) {
        if (isempty(dtype) || streq(dtype, "float32")) {
                float f;

                memcpy(&f, p, sizeof(f));
                return f;
        }
        uint16_t h;

        memcpy(&h, p, sizeof(h));
        if (streq(dtype, "bfloat16")) {
                uint32_t bits = (uint32_t) h << 16;
                float f;

                memcpy(&f, &bits, sizeof(f));
                return f;
        }
        return half_to_float(h);
}

static void json_string(FILE *f, const char *s) {
        fputc('"', f);
        for (const unsigned char *p = (const unsigned char *) strempty(s); *p; p++) {
                if (*p == '"' || *p == '\\')
                        fprintf(f, "\\%c", *p);
                else if (*p < 0x20)
                        fprintf(f, "\\u%04x", *p);
                else
                        fputc(*p, f);
        }
        fputc('"', f);
}

static void json_int_list(FILE *f, const int64_t *v, size_t n) {
        fputc('[', f);
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%" PRId64, i > 0 ? ", " : "", v[i]);
        fputc(']', f);
}

/* A float for JSON: finite values with enough digits to read back; others as null. */
static void json_float(FILE *f, float v) {
        if (isfinite(v))
                fprintf(f, "%.9g", (double) v);
        else
                fputs("null", f);
}

static const char shard_help[] =
        "Usage: familyctl shard [OPTIONS] BUILD_ID RANK\n"
        "\n"
        "Fetches the descriptor of RANK's shard of a materialised build over the build's shard\n"
        "socket, maps it, and prints each slice: PARAMETER, LOCAL_SHAPE, GLOBAL_OFFSET, OFFSET and\n"
        "LENGTH (its byte range in the shard), FNV1A64 (64-bit FNV-1a of those bytes, hex) and\n"
        "FIRST (its first values, decoded per the layout's dtype: float32, bfloat16, float16).\n"
        "--json prints the same as an object with a \"slices\" list.\n"
        "\n"
        "      --writable            ask for (and map) a writable descriptor; nothing is written\n"
        "\n"
        "A rank that is not in the build, or not materialised on this node, exits 1.\n"
        "\n"
        COMMON_OPTIONS_HELP;

int verb_shard(Context *ctx, int argc, char **argv) {
        enum {
                ARG_WRITABLE = 0x100,
        };
        static const struct option options[] = {
                COMMON_LONG_OPTIONS,
                { "writable", no_argument, NULL, ARG_WRITABLE },
                {}
        };
        _cleanup_(table_freep) Table *t = NULL;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__Build *b = NULL;
        const Familyd__V1__RankShard *s = NULL;
        const char *token;
        bool writable = false;
        int64_t rank;
        int fd = -1, c, r;
        uint64_t size = 0;
        uint8_t *mem = NULL;

        while ((c = getopt_long(argc, argv, "s:jt:h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        fputs(shard_help, stdout);
                        return EXIT_OK;
                case '?':
                        return ctl_usage_error("shard", "invalid option");
                case ARG_WRITABLE:
                        writable = true;
                        break;
                default:
                        r = ctl_common_option(ctx, c, optarg);
                        if (r != EXIT_OK)
                                return r < 0 ? EXIT_INTERNAL : r;
                }
        }
        if (argc - optind != 2)
                return ctl_usage_error("shard", "expected a build id and a rank");
        if (ctl_parse_int64(argv[optind + 1], &rank) < 0)
                return ctl_usage_error("shard", "RANK must be an integer, not '%s'", argv[optind + 1]);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_get_build(ctx->client, argv[optind], &b, &error);
        if (r < 0) {
                r = ctl_fail("get build", r, &error);
                familyd_error_clear(&error);
                return r;
        }

        for (size_t i = 0; i < b->n_shards; i++)
                if (b->shards[i]->rank == rank)
                        s = b->shards[i];
        if (!s) {
                fprintf(stderr, "familyctl: rank %" PRId64 " is not a rank of build '%s'\n", rank, strempty(b->build_id));
                r = EXIT_DAEMON;
                goto finish;
        }
        if (isempty(s->token)) {
                fprintf(stderr, "familyctl: rank %" PRId64 " of build '%s' is not materialised on this node\n",
                        rank, strempty(b->build_id));
                r = EXIT_DAEMON;
                goto finish;
        }

        token = s->token;
        r = familyd_shard_fetch(ctx->client, b->shard_socket, &token, 1, writable, &fd, &size, &error);
        if (r == -EPROTO) {
                r = ctl_fail("fetch the shard", r, &error);
                familyd_error_clear(&error);
                goto finish;
        }
        if (r == -ENOENT || r == -ECONNREFUSED || r == -ETIMEDOUT) {
                fprintf(stderr, "familyctl: cannot reach the shard socket %s: %s\n",
                        isempty(b->shard_socket) ? "(default)" : b->shard_socket, strerror(-r));
                r = EXIT_UNREACHABLE;
                goto finish;
        }
        if (r < 0) {
                r = ctl_fail("fetch the shard", r, NULL);
                goto finish;
        }
        if (size > 0) {
                void *p = NULL;

                r = familyd_shard_map(fd, size, writable, &p);
                if (r < 0) {
                        r = ctl_fail("map the shard", r, NULL);
                        goto finish;
                }
                mem = p;
        }

        if (ctx->json) {
                printf("{\n  \"buildId\": ");
                json_string(stdout, b->build_id);
                printf(",\n  \"rank\": %" PRId64 ",\n  \"node\": ", s->rank);
                json_string(stdout, s->node);
                printf(",\n  \"deviceKind\": ");
                json_string(stdout, s->device_kind);
                printf(",\n  \"localDevice\": %d,\n  \"sizeBytes\": %" PRIu64 ",\n  \"writable\": %s,\n  \"slices\": [",
                       s->local_device, size, writable ? "true" : "false");
        } else {
                ctl_print_field("build id", "%s", strempty(b->build_id));
                ctl_print_field("rank", "%" PRId64, s->rank);
                ctl_print_field("node", "%s", isempty(s->node) ? "-" : s->node);
                ctl_print_field("device", "%s:%d", isempty(s->device_kind) ? "-" : s->device_kind, s->local_device);
                ctl_print_field("size", "%" PRIu64 " bytes", size);
                ctl_print_field("writable", "%s", writable ? "yes" : "no");
                putchar('\n');
                t = table_new(7, "PARAMETER", "LOCAL_SHAPE", "GLOBAL_OFFSET", "OFFSET", "LENGTH", "FNV1A64", "FIRST");
                if (!t) {
                        r = ctl_fail("build table", -ENOMEM, NULL);
                        goto finish;
                }
        }

        for (size_t i = 0; i < s->n_slices; i++) {
                const Familyd__V1__ShardSlice *sl = s->slices[i];
                const Familyd__V1__ParameterLayout *pl = layout_parameter(b, sl->parameter);
                const char *dtype = pl && !isempty(pl->dtype) ? pl->dtype : "float32";
                size_t esize = dtype_size(dtype);
                _cleanup_free_ char *shape = shape_to_string(sl->local_shape, sl->n_local_shape);
                _cleanup_free_ char *offset = shape_to_string(sl->global_offset, sl->n_global_offset);
                uint64_t hash;
                size_t n_first;

                if (sl->byte_offset > size || sl->byte_length > size - sl->byte_offset) {
                        if (ctx->json)
                                printf("\n  ]\n}\n");
                        fprintf(stderr, "familyctl: slice %s [%" PRIu64 ", +%" PRIu64 ") lies outside the shard of %" PRIu64 " bytes\n",
                                strempty(sl->parameter), sl->byte_offset, sl->byte_length, size);
                        r = EXIT_INTERNAL;
                        goto finish;
                }
                hash = fnv1a64(mem ? mem + sl->byte_offset : NULL, (size_t) sl->byte_length);
                n_first = esize ? (size_t) (sl->byte_length / esize) : 0;
                if (n_first > SHARD_FIRST_VALUES)
                        n_first = SHARD_FIRST_VALUES;

                if (ctx->json) {
                        printf("%s\n    {\"parameter\": ", i > 0 ? "," : "");
                        json_string(stdout, sl->parameter);
                        printf(", \"dtype\": ");
                        json_string(stdout, dtype);
                        printf(", \"localShape\": ");
                        json_int_list(stdout, sl->local_shape, sl->n_local_shape);
                        printf(", \"globalOffset\": ");
                        json_int_list(stdout, sl->global_offset, sl->n_global_offset);
                        printf(", \"byteOffset\": %" PRIu64 ", \"byteLength\": %" PRIu64
                               ", \"fnv1a64\": \"%016" PRIx64 "\", \"first\": [",
                               sl->byte_offset, sl->byte_length, hash);
                        for (size_t k = 0; k < n_first; k++) {
                                if (k > 0)
                                        fputs(", ", stdout);
                                json_float(stdout, element_at(mem + sl->byte_offset + k * esize, dtype));
                        }
                        printf("]}");
                } else {
                        char *first = NULL;
                        size_t first_size = 0;
                        FILE *f = open_memstream(&first, &first_size);

                        if (f) {
                                for (size_t k = 0; k < n_first; k++)
                                        fprintf(f, "%s%.6g", k > 0 ? "," : "",
                                                (double) element_at(mem + sl->byte_offset + k * esize, dtype));
                                if (n_first == 0)
                                        fputc('-', f);
                                if (fclose(f) != 0)
                                        first = mfree(first);
                        }
                        (void) table_add_cell(t, sl->parameter);
                        (void) table_add_cell(t, shape);
                        (void) table_add_cell(t, offset);
                        (void) table_add_cellf(t, "%" PRIu64, sl->byte_offset);
                        (void) table_add_cellf(t, "%" PRIu64, sl->byte_length);
                        (void) table_add_cellf(t, "%016" PRIx64, hash);
                        (void) table_add_cell(t, first);
                        free(first);
                }
        }
        if (ctx->json)
                printf("%s]\n}\n", s->n_slices > 0 ? "\n  " : "");
        else
                (void) table_print(t, stdout);
        r = EXIT_OK;
finish:
        if (mem)
                (void) familyd_shard_unmap(mem, size);
        (void) safe_close(fd);
        familyd__v1__build__free_unpacked(b, NULL);
        return r;
}

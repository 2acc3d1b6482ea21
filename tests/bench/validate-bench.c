/* validate-bench: Validate of 1,000 to 10,000 boundaries, time per boundary. */

/*
 * DESIGN
 *
 * The bench starts nothing: it talks to a running familyd (run-validate-bench.sh starts one
 * with the conformance registry and 8 host devices) through libfamilyd, as a trainer's C code
 * would. It makes one Build of grouped_experts with a small config (8 experts, hidden 16,
 * moe_intermediate 8), on a dp=2,ep=4 mesh (--no-mesh: none), then for each size N sends
 * ValidateRequests of N boundaries: boundary i has the fqns "layers.i.moe" and
 * "model.layers.i.moe", the build's id, and an applied layout equal to the build's (mesh id,
 * and per parameter its name, shape and placements), with the job context naming the mesh.
 * Every boundary names the same build, so the daemon's shared-parameter check sees one build
 * reached through N boundaries: the case where a quadratic check would show.
 *
 * Each size gets one warm-up call, then --rounds timed calls; a call is timed from the start of
 * familyd_validate() to its return (packing, the round trip, the daemon's work, unpacking the
 * answer). Every answer must be ok with no violations (--no-layout leaves the applied layouts
 * out). Printed per size: the request's bytes,
 * submessages and fields (counted on the packed bytes as the daemon counts them, against its
 * limits of 4 MiB, 65,536 and 131,072), the best and median call, and the median per boundary.
 * Goal: the largest size's median per boundary within 1.5x of the smallest's.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "familyd.h"

/* The daemon's limits on a request (daemon/core/resource-limits.h). */
/* The daemon's own limits (daemon/core/resource-limits.h), so the check cannot drift. */
#include "core/resource-limits.h"

#define LIMIT_REQUEST_BYTES    FAMILYD_MAX_REQUEST_BYTES
#define LIMIT_REQUEST_MESSAGES FAMILYD_MAX_REQUEST_MESSAGES
#define LIMIT_REQUEST_FIELDS   FAMILYD_MAX_REQUEST_FIELDS

#define MAX_SIZES 16
#define GOAL_RATIO 1.5

enum {
        EXIT_BENCH_OK = 0,
        EXIT_BENCH_GOALS = 1,
        EXIT_BENCH_USAGE = 2,
        EXIT_BENCH_CALLS = 3,
};

typedef struct Options {
        const char *socket_path;
        size_t sizes[MAX_SIZES];
        size_t n_sizes;
        unsigned rounds;
        bool quick;
        bool no_mesh;
        bool no_layout;
        bool check_goals;
        bool probe;
} Options;

static double now_ms(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;

        return x < y ? -1 : x > y;
}

static int fail_call(const char *what, int r, FamilydError *error) {
        if (r == -EPROTO)
                fprintf(stderr, "validate-bench: %s: %s: %s%s%s%s\n", what,
                        familyd_status_name(error->code), error->message ? error->message : "",
                        error->reason ? " (" : "", error->reason ? error->reason : "",
                        error->reason ? ")" : "");
        else
                fprintf(stderr, "validate-bench: %s: %s\n", what, strerror(-r));
        familyd_error_clear(error);
        return EXIT_BENCH_CALLS;
}

/* ---- counting a request as the daemon does (daemon/rpc/codec-wire.c) ------------------------ */

static bool read_varint(const uint8_t *p, size_t end, size_t *pos, uint64_t *ret) {
        uint64_t v = 0;

        for (unsigned i = 0; i < 10 && *pos + i < end; i++) {
                v |= (uint64_t) (p[*pos + i] & 0x7f) << (7 * i);
                if (!(p[*pos + i] & 0x80)) {
                        *pos += i + 1;
                        *ret = v;
                        return true;
                }
        }
        return false;
}

/* Fields (every tag) and submessages of the message in p[pos, end), recursively. */
static bool wire_count(const ProtobufCMessageDescriptor *desc, const uint8_t *p, size_t pos, size_t end,
                       size_t *fields, size_t *messages) {
        while (pos < end) {
                const ProtobufCFieldDescriptor *f;
                uint64_t key, v;

                if (!read_varint(p, end, &pos, &key))
                        return false;
                (*fields)++;
                switch (key & 7) {
                case 0:
                        if (!read_varint(p, end, &pos, &v))
                                return false;
                        break;
                case 1:
                        pos += 8;
                        break;
                case 5:
                        pos += 4;
                        break;
                case 2:
                        if (!read_varint(p, end, &pos, &v) || v > end - pos)
                                return false;
                        f = protobuf_c_message_descriptor_get_field(desc, (unsigned) (key >> 3));
                        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                                (*messages)++;
                                if (!wire_count(f->descriptor, p, pos, pos + (size_t) v, fields, messages))
                                        return false;
                        }
                        pos += (size_t) v;
                        break;
                default:
                        return false;
                }
        }
        return pos == end;
}

/* ---- the model ------------------------------------------------------------------------------ */

typedef struct Model {
        Familyd__V1__ValidateRequest req;
        Familyd__V1__JobContext context;
        Familyd__V1__Layout layout;             /* the applied layout every boundary shares */
        Familyd__V1__ParameterLayout *params;
        Familyd__V1__ParameterLayout **param_ptrs;
        Familyd__V1__ModelBoundary *boundaries;
        Familyd__V1__ModelBoundary **boundary_ptrs;
        char **fqn_text;                        /* 2 per boundary */
        size_t max;
} Model;

static void model_free(Model *m) {
        if (m->fqn_text)
                for (size_t i = 0; i < 2 * m->max; i++)
                        free(m->fqn_text[i]);
        free(m->fqn_text);
        free(m->boundaries);
        free(m->boundary_ptrs);
        free(m->params);
        free(m->param_ptrs);
}

/* The applied layout: the build's, less what a trainer does not apply (dtype, mesh view). The
 * strings and arrays point into build, which outlives the model. */
static int model_init(Model *m, const Familyd__V1__Build *build, size_t max, bool with_layout) {
        const Familyd__V1__Layout *bl = build->info ? build->info->layout : NULL;

        *m = (Model) { .max = max };
        familyd__v1__validate_request__init(&m->req);
        familyd__v1__job_context__init(&m->context);
        familyd__v1__layout__init(&m->layout);
        if (!bl || bl->n_parameters == 0) {
                fprintf(stderr, "validate-bench: the build has no layout\n");
                return -EBADMSG;
        }
        m->layout.mesh_id = bl->mesh_id;
        m->params = calloc(bl->n_parameters, sizeof(*m->params));
        m->param_ptrs = calloc(bl->n_parameters, sizeof(*m->param_ptrs));
        m->boundaries = calloc(max, sizeof(*m->boundaries));
        m->boundary_ptrs = calloc(max, sizeof(*m->boundary_ptrs));
        m->fqn_text = calloc(2 * max, sizeof(*m->fqn_text));
        if (!m->params || !m->param_ptrs || !m->boundaries || !m->boundary_ptrs || !m->fqn_text)
                return -ENOMEM;
        for (size_t i = 0; i < bl->n_parameters; i++) {
                const Familyd__V1__ParameterLayout *src = bl->parameters[i];
                Familyd__V1__ParameterLayout *p = &m->params[i];

                familyd__v1__parameter_layout__init(p);
                p->name = src->name;
                p->shape = src->shape;
                p->n_shape = src->n_shape;
                p->placements = src->placements;
                p->n_placements = src->n_placements;
                m->param_ptrs[i] = p;
        }
        m->layout.parameters = m->param_ptrs;
        m->layout.n_parameters = bl->n_parameters;

        for (size_t i = 0; i < max; i++) {
                Familyd__V1__ModelBoundary *b = &m->boundaries[i];

                if (asprintf(&m->fqn_text[2 * i], "layers.%zu.moe", i) < 0 ||
                    asprintf(&m->fqn_text[2 * i + 1], "model.layers.%zu.moe", i) < 0) {
                        m->fqn_text[2 * i] = m->fqn_text[2 * i + 1] = NULL;
                        return -ENOMEM;
                }
                familyd__v1__model_boundary__init(b);
                b->fqns = &m->fqn_text[2 * i];
                b->n_fqns = 2;
                b->build_id = build->build_id;
                b->applied_layout = with_layout ? &m->layout : NULL;
                m->boundary_ptrs[i] = b;
        }
        m->req.boundaries = m->boundary_ptrs;
        if (bl->mesh_id && bl->mesh_id[0]) {
                m->context.mesh_id = bl->mesh_id;
                m->req.context = &m->context;
        }
        return 0;
}

/* The request's wire size and counts for n boundaries. */
static int model_measure(Model *m, size_t n, size_t *ret_bytes, size_t *ret_messages, size_t *ret_fields) {
        size_t size, fields = 0, messages = 0;
        uint8_t *buf;
        bool ok;

        m->req.n_boundaries = n;
        size = protobuf_c_message_get_packed_size(&m->req.base);
        buf = malloc(size ? size : 1);
        if (!buf)
                return -ENOMEM;
        protobuf_c_message_pack(&m->req.base, buf);
        ok = wire_count(m->req.base.descriptor, buf, 0, size, &fields, &messages);
        free(buf);
        if (!ok)
                return -EBADMSG;
        *ret_bytes = size;
        *ret_messages = messages;
        *ret_fields = fields;
        return 0;
}

/* ---- setup ---------------------------------------------------------------------------------- */

static int config_field(Familyd__V1__Config__FieldsEntry *e, Familyd__V1__Value *v, const char *key,
                        bool is_int, int64_t i, double d) {
        familyd__v1__config__fields_entry__init(e);
        familyd__v1__value__init(v);
        e->key = (char *) key;
        e->value = v;
        if (is_int) {
                v->kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
                v->int_value = i;
        } else {
                v->kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                v->double_value = d;
        }
        return 0;
}

static int make_build(FamilydClient *client, bool no_mesh, Familyd__V1__Mesh **ret_mesh,
                      Familyd__V1__BuildResponse **ret_build) {
        Familyd__V1__BuildRequest req = FAMILYD__V1__BUILD_REQUEST__INIT;
        Familyd__V1__Config config = FAMILYD__V1__CONFIG__INIT;
        Familyd__V1__Config__FieldsEntry entries[4], *entry_ptrs[4];
        Familyd__V1__Value values[4];
        FamilydError error = FAMILYD_ERROR_NULL;
        int r;

        if (!no_mesh) {
                Familyd__V1__Mesh mesh = FAMILYD__V1__MESH__INIT;
                Familyd__V1__MeshDim dp = FAMILYD__V1__MESH_DIM__INIT, ep = FAMILYD__V1__MESH_DIM__INIT;
                Familyd__V1__MeshDim *dims[2] = { &dp, &ep };
                int64_t ranks[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };

                dp.name = (char *) "dp";
                dp.size = 2;
                ep.name = (char *) "ep";
                ep.size = 4;
                mesh.device_mesh = dims;
                mesh.n_device_mesh = 2;
                mesh.ranks = ranks;
                mesh.n_ranks = 8;
                r = familyd_create_mesh(client, &mesh, ret_mesh, &error);
                if (r < 0)
                        return fail_call("CreateMesh dp=2,ep=4", r, &error);
                req.mesh_id = (*ret_mesh)->mesh_id;
        }

        config_field(&entries[0], &values[0], "num_experts", true, 8, 0);
        config_field(&entries[1], &values[1], "hidden_size", true, 16, 0);
        config_field(&entries[2], &values[2], "moe_intermediate_size", true, 8, 0);
        config_field(&entries[3], &values[3], "initializer_range", false, 0, 0.02);
        for (size_t i = 0; i < 4; i++)
                entry_ptrs[i] = &entries[i];
        config.fields = entry_ptrs;
        config.n_fields = 4;
        req.family = (char *) "grouped_experts";
        req.config = &config;
        r = familyd_build(client, &req, ret_build, &error);
        if (r < 0)
                return fail_call("Build grouped_experts", r, &error);
        if (!(*ret_build)->build) {
                fprintf(stderr, "validate-bench: Build answered no build\n");
                return EXIT_BENCH_CALLS;
        }
        return EXIT_BENCH_OK;
}

/* ---- main ----------------------------------------------------------------------------------- */

static void help(void) {
        printf("Usage: validate-bench --socket PATH [OPTIONS]\n"
               "\n"
               "Times familyd's Validate of 1,000, 2,000, 5,000 and 10,000 boundaries of one build\n"
               "(grouped_experts on a dp=2,ep=4 mesh) and prints the time per boundary; the goal is\n"
               "the largest size's time per boundary within %.1fx of the smallest's. Starts nothing:\n"
               "tests/bench/run-validate-bench.sh starts the daemon.\n"
               "\n"
               "  --socket PATH          the daemon's API socket (default: $FAMILYD_SOCKET)\n"
               "  --sizes N,N,...        boundaries per request (default 1000,2000,5000,10000)\n"
               "  --rounds N             timed calls per size after one warm-up (default 7; 3 quick)\n"
               "  --quick                a smoke run: sizes 1000,2000, 3 rounds\n"
               "  --no-mesh              build without a mesh (no mesh id in the layouts or context)\n"
               "  --no-layout            boundaries without an applied layout (fqns and build id only)\n"
               "  --check-goals          exit 1 when the goal is not met\n"
               "  --probe                one GetStatus: exit 0 when the daemon answers, 3 otherwise\n"
               "  -h, --help             show this help\n"
               "\n"
               "Exit: 0 done, 1 goal not met (with --check-goals), 2 usage, 3 a call failed, a\n"
               "request over the daemon's limits, or an answer that was not ok.\n",
               GOAL_RATIO);
}

static int parse_sizes(const char *s, Options *opt) {
        char *copy = strdup(s), *save = NULL;

        if (!copy)
                return -ENOMEM;
        opt->n_sizes = 0;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                char *end;
                unsigned long long v;

                errno = 0;
                v = strtoull(t, &end, 10);
                if (errno != 0 || *end != 0 || v == 0 || v > 1000000 || opt->n_sizes >= MAX_SIZES) {
                        free(copy);
                        return -EINVAL;
                }
                opt->sizes[opt->n_sizes++] = (size_t) v;
        }
        free(copy);
        return opt->n_sizes > 0 ? 0 : -EINVAL;
}

static int parse_args(int argc, char **argv, Options *opt) {
        enum { ARG_SOCKET = 0x100, ARG_SIZES, ARG_ROUNDS, ARG_QUICK, ARG_NO_MESH, ARG_NO_LAYOUT, ARG_CHECK, ARG_PROBE };
        static const struct option options[] = {
                { "socket",      required_argument, NULL, ARG_SOCKET },
                { "sizes",       required_argument, NULL, ARG_SIZES },
                { "rounds",      required_argument, NULL, ARG_ROUNDS },
                { "quick",       no_argument,       NULL, ARG_QUICK },
                { "no-mesh",     no_argument,       NULL, ARG_NO_MESH },
                { "no-layout",   no_argument,       NULL, ARG_NO_LAYOUT },
                { "check-goals", no_argument,       NULL, ARG_CHECK },
                { "probe",       no_argument,       NULL, ARG_PROBE },
                { "help",        no_argument,       NULL, 'h' },
                {}
        };
        bool sizes_set = false;
        int c;

        *opt = (Options) { .socket_path = getenv("FAMILYD_SOCKET") };
        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case 'h':
                        help();
                        exit(EXIT_BENCH_OK);
                case ARG_SOCKET:
                        opt->socket_path = optarg;
                        break;
                case ARG_SIZES:
                        if (parse_sizes(optarg, opt) < 0) {
                                fprintf(stderr, "validate-bench: --sizes needs a list like 1000,2000 (1..1000000)\n");
                                return -EINVAL;
                        }
                        sizes_set = true;
                        break;
                case ARG_ROUNDS: {
                        char *end;
                        unsigned long v;

                        errno = 0;
                        v = strtoul(optarg, &end, 10);
                        if (errno != 0 || *end != 0 || v == 0 || v > 1000) {
                                fprintf(stderr, "validate-bench: --rounds needs 1..1000\n");
                                return -EINVAL;
                        }
                        opt->rounds = (unsigned) v;
                        break;
                }
                case ARG_QUICK:
                        opt->quick = true;
                        break;
                case ARG_NO_MESH:
                        opt->no_mesh = true;
                        break;
                case ARG_NO_LAYOUT:
                        opt->no_layout = true;
                        break;
                case ARG_CHECK:
                        opt->check_goals = true;
                        break;
                case ARG_PROBE:
                        opt->probe = true;
                        break;
                default:
                        fprintf(stderr, "validate-bench: bad option (--help)\n");
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "validate-bench: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!opt->socket_path || !opt->socket_path[0]) {
                fprintf(stderr, "validate-bench: --socket PATH is required\n");
                return -EINVAL;
        }
        if (!sizes_set) {
                static const size_t full[] = { 1000, 2000, 5000, 10000 }, quick[] = { 1000, 2000 };
                const size_t *s = opt->quick ? quick : full;
                size_t n = opt->quick ? 2 : 4;

                memcpy(opt->sizes, s, n * sizeof(*s));
                opt->n_sizes = n;
        }
        if (opt->rounds == 0)
                opt->rounds = opt->quick ? 3 : 7;
        return 0;
}

/* --probe: whether the daemon answers GetStatus; frees client. */
static int probe(FamilydClient *client) {
        Familyd__V1__GetStatusResponse *st = NULL;
        FamilydError error = FAMILYD_ERROR_NULL;
        int r = familyd_get_status(client, &st, &error);

        familyd_error_clear(&error);
        if (st)
                familyd__v1__get_status_response__free_unpacked(st, NULL);
        familyd_client_free(client);
        return r < 0 ? EXIT_BENCH_CALLS : EXIT_BENCH_OK;
}

/* Every size's request fits the daemon's limits: EXIT_BENCH_OK, else EXIT_BENCH_CALLS (said). */
static int check_sizes_fit(Model *model, const Options *opt) {
        for (size_t i = 0; i < opt->n_sizes; i++) {
                size_t bytes = 0, messages = 0, fields = 0;
                int r = model_measure(model, opt->sizes[i], &bytes, &messages, &fields);

                if (r < 0) {
                        fprintf(stderr, "validate-bench: packing %zu boundaries: %s\n",
                                opt->sizes[i], strerror(-r));
                        return EXIT_BENCH_CALLS;
                }
                if (bytes > LIMIT_REQUEST_BYTES || messages > LIMIT_REQUEST_MESSAGES ||
                    fields > LIMIT_REQUEST_FIELDS) {
                        fprintf(stderr,
                                "validate-bench: %zu boundaries do not fit the daemon's request limits: "
                                "%zu bytes (limit %u), %zu messages (limit %u), %zu fields (limit %u); "
                                "per boundary %.1f messages, %.1f fields\n",
                                opt->sizes[i], bytes, LIMIT_REQUEST_BYTES, messages,
                                LIMIT_REQUEST_MESSAGES, fields, LIMIT_REQUEST_FIELDS,
                                (double) messages / (double) opt->sizes[i],
                                (double) fields / (double) opt->sizes[i]);
                        return EXIT_BENCH_CALLS;
                }
        }
        return EXIT_BENCH_OK;
}

/* rounds + 1 Validate calls of the model's first n boundaries (call 0 warms up): the others'
 * times in times[]. EXIT_BENCH_OK, or the failure's exit status (said). */
static int time_rounds(FamilydClient *client, Model *model, size_t n, unsigned rounds,
                       double *times) {
        FamilydError error = FAMILYD_ERROR_NULL;

        for (unsigned k = 0; k <= rounds; k++) {
                Familyd__V1__ValidateResponse *resp = NULL;
                double t0 = now_ms(), t1;
                int r = familyd_validate(client, &model->req, &resp, &error);

                t1 = now_ms();
                if (r < 0) {
                        char what[64];

                        snprintf(what, sizeof(what), "Validate of %zu boundaries", n);
                        return fail_call(what, r, &error);
                }
                if (!resp->ok || resp->n_violations > 0) {
                        fprintf(stderr, "validate-bench: Validate of %zu boundaries: not ok, %zu violations%s%s%s%s\n",
                                n, resp->n_violations,
                                resp->n_violations > 0 ? ", first: " : "",
                                resp->n_violations > 0 ? resp->violations[0]->reason : "",
                                resp->n_violations > 0 ? ": " : "",
                                resp->n_violations > 0 ? resp->violations[0]->message : "");
                        familyd__v1__validate_response__free_unpacked(resp, NULL);
                        return EXIT_BENCH_CALLS;
                }
                familyd__v1__validate_response__free_unpacked(resp, NULL);
                if (k > 0)
                        times[k - 1] = t1 - t0;
        }
        return EXIT_BENCH_OK;
}

int main(int argc, char **argv) {
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH | FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS,
                .timeout_ms = 120000,
        };
        FamilydError error = FAMILYD_ERROR_NULL;
        FamilydClient *client = NULL;
        Familyd__V1__Mesh *mesh = NULL;
        Familyd__V1__BuildResponse *built = NULL;
        Model model = {};
        Options opt;
        double per_boundary[MAX_SIZES] = {};
        size_t max = 0, smallest = 0, largest = 0;
        double *times = NULL;
        int r, status = EXIT_BENCH_OK;

        if (parse_args(argc, argv, &opt) < 0)
                return EXIT_BENCH_USAGE;
        params.socket_path = opt.socket_path;
        if (opt.probe)
                params.timeout_ms = 2000;
        r = familyd_client_new(&params, &client);
        if (r < 0) {
                fprintf(stderr, "validate-bench: client: %s\n", strerror(-r));
                return EXIT_BENCH_CALLS;
        }
        if (opt.probe)
                return probe(client);

        for (size_t i = 0; i < opt.n_sizes; i++) {
                if (opt.sizes[i] > max)
                        max = opt.sizes[i];
                if (opt.sizes[i] < opt.sizes[smallest])
                        smallest = i;
                if (opt.sizes[i] > opt.sizes[largest])
                        largest = i;
        }

        status = make_build(client, opt.no_mesh, &mesh, &built);
        if (status != EXIT_BENCH_OK)
                goto finish;
        r = model_init(&model, built->build, max, !opt.no_layout);
        if (r < 0) {
                fprintf(stderr, "validate-bench: model: %s\n", strerror(-r));
                status = EXIT_BENCH_CALLS;
                goto finish;
        }
        times = calloc(opt.rounds, sizeof(*times));
        if (!times) {
                status = EXIT_BENCH_CALLS;
                goto finish;
        }

        printf("validate-bench: build %s (grouped_experts, %zu parameters), mesh %s, %u rounds per size\n",
               built->build->build_id, model.layout.n_parameters,
               mesh ? mesh->mesh_id : "none", opt.rounds);
        printf("each boundary: 2 fqns, the build id%s; daemon limits: %u bytes, %u messages, %u fields\n\n",
               opt.no_layout ? " (no applied layout)" : ", an applied layout equal to the build's",
               LIMIT_REQUEST_BYTES, LIMIT_REQUEST_MESSAGES, LIMIT_REQUEST_FIELDS);

        fflush(stdout);
        /* Every size's request must fit the daemon's limits: check them all before timing any. */
        status = check_sizes_fit(&model, &opt);
        if (status != EXIT_BENCH_OK)
                goto finish;

        printf("%-10s  %9s  %8s  %8s  %9s  %9s  %15s\n",
               "BOUNDARIES", "BYTES", "MESSAGES", "FIELDS", "BEST_MS", "MEDIAN_MS", "US_PER_BOUNDARY");
        for (size_t i = 0; i < opt.n_sizes; i++) {
                size_t n = opt.sizes[i], bytes = 0, messages = 0, fields = 0;

                (void) model_measure(&model, n, &bytes, &messages, &fields);
                model.req.n_boundaries = n;
                status = time_rounds(client, &model, n, opt.rounds, times);
                if (status != EXIT_BENCH_OK)
                        goto finish;
                qsort(times, opt.rounds, sizeof(*times), cmp_double);
                double median = opt.rounds % 2 ? times[opt.rounds / 2]
                                               : (times[opt.rounds / 2 - 1] + times[opt.rounds / 2]) / 2;
                per_boundary[i] = median * 1e3 / (double) n;
                printf("%-10zu  %9zu  %8zu  %8zu  %9.3f  %9.3f  %15.3f\n",
                       n, bytes, messages, fields, times[0], median, per_boundary[i]);
                fflush(stdout);
        }

        {
                double ratio = per_boundary[smallest] > 0 ? per_boundary[largest] / per_boundary[smallest] : 0;
                bool met = ratio <= GOAL_RATIO;

                printf("\nratio: time per boundary at %zu / at %zu = %.2f   goal <= %.2f: %s\n",
                       opt.sizes[largest], opt.sizes[smallest], ratio, GOAL_RATIO, met ? "met" : "MISSED");
                if (opt.check_goals && !met)
                        status = EXIT_BENCH_GOALS;
        }

finish:
        free(times);
        model_free(&model);
        if (built) {
                if (built->build) {
                        r = familyd_release_build(client, built->build->build_id, &error);
                        if (r < 0 && status == EXIT_BENCH_OK)
                                status = fail_call("ReleaseBuild", r, &error);
                        familyd_error_clear(&error);
                }
                familyd__v1__build_response__free_unpacked(built, NULL);
        }
        /* The mesh stays: CreateMesh finds an equal mesh that other builds may use; the runner's
         * daemon goes with it. */
        if (mesh)
                familyd__v1__mesh__free_unpacked(mesh, NULL);
        familyd_client_free(client);
        return status;
}

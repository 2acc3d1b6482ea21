/* verbs-mesh.c: familyctl mesh create|get|delete, meshes. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

static int mesh_print(VerbRun *v) {
        const Familyd__V1__Mesh *m = (const Familyd__V1__Mesh *) v->response;
        _cleanup_free_ char *dev = ctl_mesh_dims_to_string(m->device_mesh, m->n_device_mesh);
        _cleanup_free_ char *exp = ctl_mesh_dims_to_string(m->expert_mesh, m->n_expert_mesh);
        _cleanup_free_ char *ranks = ctl_ranks_to_string(m->ranks, m->n_ranks);

        ctl_print_field("mesh id", "%s", strempty(m->mesh_id));
        ctl_print_field("device mesh", "%s", strempty(dev));
        ctl_print_field("expert mesh", "%s", strempty(exp));
        if (m->_tp_size_case == FAMILYD__V1__MESH___TP_SIZE_TP_SIZE)
                ctl_print_field("tp size", "%" PRId64, m->tp_size);
        if (m->_cp_size_case == FAMILYD__V1__MESH___CP_SIZE_CP_SIZE)
                ctl_print_field("cp size", "%" PRId64, m->cp_size);
        if (m->_ep_size_case == FAMILYD__V1__MESH___EP_SIZE_EP_SIZE)
                ctl_print_field("ep size", "%" PRId64, m->ep_size);
        if (m->_pp_size_case == FAMILYD__V1__MESH___PP_SIZE_PP_SIZE)
                ctl_print_field("pp size", "%" PRId64, m->pp_size);
        ctl_print_field("sequence parallel", "%s", m->sequence_parallel ? "yes" : "no");
        ctl_print_field("loss parallel", "%s", m->loss_parallel ? "yes" : "no");
        ctl_print_field("ranks", "%s (%zu)", strempty(ranks), m->n_ranks);
        return EXIT_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* mesh create DIMS */

typedef struct MeshCreateState {
        Familyd__V1__Mesh mesh;
        AxisSizes axes;
        Familyd__V1__MeshDim **dev, **exp;
        size_t n_dev, n_exp;
        int64_t *ranks;
        size_t n_ranks;
        bool sequence_parallel;
        bool loss_parallel;
} MeshCreateState;

enum {
        ARG_EXPERT = 0x100, ARG_RANKS, ARG_SP, ARG_LP,
};

static const struct option mesh_create_options[] = {
        AXIS_LONG_OPTIONS,
        { "expert",            required_argument, NULL, ARG_EXPERT },
        { "ranks",             required_argument, NULL, ARG_RANKS },
        { "sequence-parallel", no_argument,       NULL, ARG_SP },
        { "loss-parallel",     no_argument,       NULL, ARG_LP },
        {}
};

static int mesh_create_option(VerbRun *v, int c, const char *arg) {
        MeshCreateState *s = v->state;
        int r;

        switch (c) {
        case ARG_EXPERT:
                ctl_mesh_dims_free(s->exp, s->n_exp);
                s->exp = NULL;
                s->n_exp = 0;
                r = ctl_parse_mesh_dims(arg, &s->exp, &s->n_exp);
                if (r == -ENOMEM)
                        return ctl_fail("parse --expert", r, NULL);
                if (r < 0)
                        return ctl_usage_error("mesh create", "--expert needs NAME=SIZE[,NAME=SIZE...], not '%s'", arg);
                return EXIT_OK;
        case ARG_RANKS:
                s->ranks = mfree(s->ranks);
                r = ctl_parse_ranks(arg, &s->ranks, &s->n_ranks);
                if (r == -ENOMEM)
                        return ctl_fail("parse --ranks", r, NULL);
                if (r < 0)
                        return ctl_usage_error("mesh create", "--ranks needs a list like 0,1,2,3 or 0-3, not '%s'", arg);
                return EXIT_OK;
        case ARG_SP:
                s->sequence_parallel = true;
                return EXIT_OK;
        case ARG_LP:
                s->loss_parallel = true;
                return EXIT_OK;
        }
        r = ctl_axis_option("mesh create", &s->axes, c, arg);
        return r < 0 ? EXIT_INTERNAL : r;
}

static int mesh_create_prepare(VerbRun *v) {
        MeshCreateState *s = v->state;
        Familyd__V1__Mesh *m = &s->mesh;
        int r;

        r = ctl_parse_mesh_dims(v->args[0], &s->dev, &s->n_dev);
        if (r == -ENOMEM)
                return ctl_fail("parse DIMS", r, NULL);
        if (r < 0)
                return ctl_usage_error("mesh create", "DIMS must be NAME=SIZE[,NAME=SIZE...], not '%s'", v->args[0]);

        familyd__v1__mesh__init(m);
        m->device_mesh = s->dev;
        m->n_device_mesh = s->n_dev;
        m->expert_mesh = s->exp;
        m->n_expert_mesh = s->n_exp;
        m->ranks = s->ranks;
        m->n_ranks = s->n_ranks;
        m->sequence_parallel = s->sequence_parallel;
        m->loss_parallel = s->loss_parallel;
        ctl_axis_to_mesh(&s->axes, m);
        return EXIT_OK;
}

static int mesh_create_call(VerbRun *v) {
        MeshCreateState *s = v->state;

        return familyd_create_mesh(v->ctx->client, &s->mesh, (Familyd__V1__Mesh **) &v->response, &v->error);
}

static void mesh_create_done(VerbRun *v) {
        MeshCreateState *s = v->state;

        ctl_mesh_dims_free(s->dev, s->n_dev);
        ctl_mesh_dims_free(s->exp, s->n_exp);
        free(s->ranks);
}

static const VerbDef mesh_create_verb = {
        .name = "mesh create",
        .help = "Usage: familyctl mesh create [OPTIONS] DIMS\n"
                "\n"
                "Creates a mesh (or finds the identical one: mesh ids derive from the content) and\n"
                "prints it. DIMS is the device view, row-major: NAME=SIZE[,NAME=SIZE...], e.g. dp=2,tp=4.\n"
                "\n"
                "      --expert DIMS   the expert view of the same ranks, e.g. edp_shard=2,ep=4\n"
                "      --ranks LIST    the mesh's ranks, e.g. 0,1,2,3 or 0-3,8-11\n"
                "                      (default: every rank of the topology)\n"
                "      --tp N, --cp N, --ep N, --pp N\n"
                "                      declared axis sizes, checked against the views\n"
                "      --sequence-parallel, --loss-parallel\n"
                "                      set those flags on the mesh\n"
                "\n",
        .options = mesh_create_options,
        .option = mesh_create_option,
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected one DIMS argument, e.g. dp=2,tp=4",
        .args_extra = "expected one DIMS argument, e.g. dp=2,tp=4",
        .state_size = sizeof(MeshCreateState),
        .prepare = mesh_create_prepare,
        .call = mesh_create_call,
        .what = "create mesh",
        .print = mesh_print,
        .done = mesh_create_done,
};

/* ---------------------------------------------------------------------------------------- */
/* mesh get ID, mesh delete ID */

static int mesh_get_call(VerbRun *v) {
        return familyd_get_mesh(v->ctx->client, v->args[0], (Familyd__V1__Mesh **) &v->response, &v->error);
}

static const VerbDef mesh_get_verb = {
        .name = "mesh get",
        .help = "Usage: familyctl mesh get [OPTIONS] ID\n"
                "\n"
                "Shows one mesh: its views, declared sizes, flags and ranks.\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one mesh id",
        .args_extra = "expected exactly one mesh id",
        .call = mesh_get_call,
        .what = "get mesh",
        .print = mesh_print,
};

static int mesh_delete_call(VerbRun *v) {
        return familyd_delete_mesh(v->ctx->client, v->args[0], &v->error);
}

static const VerbDef mesh_delete_verb = {
        .name = "mesh delete",
        .help = "Usage: familyctl mesh delete [OPTIONS] ID\n"
                "\n"
                "Deletes a mesh. Prints nothing on success ({} with --json). A mesh that\n"
                "live builds use is refused (FAILED_PRECONDITION).\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one mesh id",
        .args_extra = "expected exactly one mesh id",
        .call = mesh_delete_call,
        .what = "delete mesh",
};

static const char mesh_help[] =
        "Usage: familyctl mesh create [OPTIONS] DIMS\n"
        "       familyctl mesh get [OPTIONS] ID\n"
        "       familyctl mesh delete [OPTIONS] ID\n"
        "\n"
        "Creates, shows or deletes a mesh. `familyctl mesh SUBVERB --help` for each.\n"
        "\n"
        COMMON_OPTIONS_HELP;

int verb_mesh(Context *ctx, int argc, char **argv) {
        if (argc < 2)
                return ctl_usage_error("mesh", "missing subverb: create, get or delete");
        if (streq(argv[1], "--help") || streq(argv[1], "-h")) {
                fputs(mesh_help, stdout);
                return EXIT_OK;
        }

        /* The subverb becomes argv[0] of its own option parsing. */
        optind = 0;
        if (streq(argv[1], "create"))
                return verb_run(ctx, &mesh_create_verb, argc - 1, argv + 1);
        if (streq(argv[1], "get"))
                return verb_run(ctx, &mesh_get_verb, argc - 1, argv + 1);
        if (streq(argv[1], "delete"))
                return verb_run(ctx, &mesh_delete_verb, argc - 1, argv + 1);
        return ctl_usage_error("mesh", "unknown subverb '%s': create, get or delete", argv[1]);
}

/* ---------------------------------------------------------------------------------------- */
/* meshes */

static const char *const meshes_columns[] = {
        "MESH_ID", "DEVICE_MESH", "EXPERT_MESH", "RANKS", NULL,
};
static const char *const *const meshes_tables[] = { meshes_columns, NULL };

static int meshes_call(VerbRun *v) {
        return familyd_list_meshes(v->ctx->client, (Familyd__V1__ListMeshesResponse **) &v->response, &v->error);
}

static int meshes_print(VerbRun *v) {
        const Familyd__V1__ListMeshesResponse *resp = (const Familyd__V1__ListMeshesResponse *) v->response;
        _cleanup_(table_freep) Table *t = table_new(&v->ctx->table, meshes_columns);

        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < resp->n_meshes; i++) {
                const Familyd__V1__Mesh *m = resp->meshes[i];
                _cleanup_free_ char *dev = ctl_mesh_dims_to_string(m->device_mesh, m->n_device_mesh);
                _cleanup_free_ char *exp = ctl_mesh_dims_to_string(m->expert_mesh, m->n_expert_mesh);
                _cleanup_free_ char *ranks = ctl_ranks_to_string(m->ranks, m->n_ranks);

                if (table_add_cell(t, m->mesh_id) < 0 || table_add_cell(t, dev) < 0 ||
                    table_add_cell(t, exp) < 0 || table_add_cell(t, ranks) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        }
        return table_print(t, false);
}

static const VerbDef meshes_verb = {
        .name = "meshes",
        .help = "Usage: familyctl meshes [OPTIONS]\n"
                "\n"
                "Lists the meshes: MESH_ID DEVICE_MESH EXPERT_MESH RANKS.\n"
                "\n",
        .tables = meshes_tables,
        .call = meshes_call,
        .what = "list meshes",
        .print = meshes_print,
};

int verb_meshes(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &meshes_verb, argc, argv);
}

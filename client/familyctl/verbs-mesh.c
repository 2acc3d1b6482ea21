/* verbs-mesh.c: familyctl mesh create|get|delete, meshes. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "macro.h"

static void print_mesh(const Familyd__V1__Mesh *m) {
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
}

static const char mesh_create_help[] =
        "Usage: familyctl mesh create [OPTIONS] DIMS\n"
        "\n"
        "Creates a mesh (or finds the identical one: mesh ids derive from the content) and\n"
        "prints it. DIMS is the device view, row-major: NAME=SIZE[,NAME=SIZE...], e.g. dp=2,tp=4.\n"
        "\n"
        "      --expert DIMS         the expert view of the same ranks, e.g. edp_shard=2,ep=4\n"
        "      --ranks LIST          the mesh's ranks, e.g. 0,1,2,3 or 0-3,8-11\n"
        "                            (default: every rank of the topology)\n"
        "      --tp-size N, --cp-size N, --ep-size N, --pp-size N\n"
        "                            declared axis sizes, checked against the views\n"
        "      --sequence-parallel, --loss-parallel\n"
        "                            set those flags on the mesh\n"
        "\n"
        COMMON_OPTIONS_HELP;

static int mesh_create(Context *ctx, int argc, char **argv) {
        enum {
                ARG_TP = 0x100, ARG_CP, ARG_EP, ARG_PP, ARG_EXPERT, ARG_RANKS, ARG_SP, ARG_LP,
        };
        static const struct option options[] = {
                COMMON_LONG_OPTIONS,
                { "tp-size",           required_argument, NULL, ARG_TP },
                { "cp-size",           required_argument, NULL, ARG_CP },
                { "ep-size",           required_argument, NULL, ARG_EP },
                { "pp-size",           required_argument, NULL, ARG_PP },
                { "expert",            required_argument, NULL, ARG_EXPERT },
                { "ranks",             required_argument, NULL, ARG_RANKS },
                { "sequence-parallel", no_argument,       NULL, ARG_SP },
                { "loss-parallel",     no_argument,       NULL, ARG_LP },
                {}
        };
        Familyd__V1__Mesh mesh = FAMILYD__V1__MESH__INIT;
        Familyd__V1__MeshDim **dev = NULL, **exp = NULL;
        size_t n_dev = 0, n_exp = 0;
        _cleanup_free_ int64_t *ranks = NULL;
        size_t n_ranks = 0;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__Mesh *created = NULL;
        int c, r;

        while ((c = getopt_long(argc, argv, "s:jt:h", options, NULL)) >= 0) {
                int64_t v;

                switch (c) {
                case 'h':
                        fputs(mesh_create_help, stdout);
                        r = EXIT_OK;
                        goto finish;
                case '?':
                        r = ctl_usage_error("mesh create", "invalid option");
                        goto finish;
                case ARG_TP:
                case ARG_CP:
                case ARG_EP:
                case ARG_PP:
                        if (ctl_parse_int64(optarg, &v) < 0) {
                                r = ctl_usage_error("mesh create", "--%s needs an integer, not '%s'",
                                                    options[4 + c - ARG_TP].name, optarg);
                                goto finish;
                        }
                        if (c == ARG_TP) {
                                mesh._tp_size_case = FAMILYD__V1__MESH___TP_SIZE_TP_SIZE;
                                mesh.tp_size = v;
                        } else if (c == ARG_CP) {
                                mesh._cp_size_case = FAMILYD__V1__MESH___CP_SIZE_CP_SIZE;
                                mesh.cp_size = v;
                        } else if (c == ARG_EP) {
                                mesh._ep_size_case = FAMILYD__V1__MESH___EP_SIZE_EP_SIZE;
                                mesh.ep_size = v;
                        } else {
                                mesh._pp_size_case = FAMILYD__V1__MESH___PP_SIZE_PP_SIZE;
                                mesh.pp_size = v;
                        }
                        break;
                case ARG_EXPERT:
                        ctl_mesh_dims_free(exp, n_exp);
                        exp = NULL;
                        n_exp = 0;
                        r = ctl_parse_mesh_dims(optarg, &exp, &n_exp);
                        if (r < 0) {
                                r = r == -ENOMEM ? ctl_fail("parse --expert", r, NULL) :
                                        ctl_usage_error("mesh create", "--expert needs NAME=SIZE[,NAME=SIZE...], not '%s'", optarg);
                                goto finish;
                        }
                        break;
                case ARG_RANKS:
                        ranks = mfree(ranks);
                        r = ctl_parse_ranks(optarg, &ranks, &n_ranks);
                        if (r < 0) {
                                r = r == -ENOMEM ? ctl_fail("parse --ranks", r, NULL) :
                                        ctl_usage_error("mesh create", "--ranks needs a list like 0,1,2,3 or 0-3, not '%s'", optarg);
                                goto finish;
                        }
                        break;
                case ARG_SP:
                        mesh.sequence_parallel = true;
                        break;
                case ARG_LP:
                        mesh.loss_parallel = true;
                        break;
                default:
                        r = ctl_common_option(ctx, c, optarg);
                        if (r != EXIT_OK) {
                                r = r < 0 ? EXIT_INTERNAL : r;
                                goto finish;
                        }
                }
        }

        if (argc - optind != 1) {
                r = ctl_usage_error("mesh create", "expected one DIMS argument, e.g. dp=2,tp=4");
                goto finish;
        }
        r = ctl_parse_mesh_dims(argv[optind], &dev, &n_dev);
        if (r < 0) {
                r = r == -ENOMEM ? ctl_fail("parse DIMS", r, NULL) :
                        ctl_usage_error("mesh create", "DIMS must be NAME=SIZE[,NAME=SIZE...], not '%s'", argv[optind]);
                goto finish;
        }

        mesh.device_mesh = dev;
        mesh.n_device_mesh = n_dev;
        mesh.expert_mesh = exp;
        mesh.n_expert_mesh = n_exp;
        mesh.ranks = ranks;
        mesh.n_ranks = n_ranks;

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                goto finish;
        r = familyd_create_mesh(ctx->client, &mesh, &created, &error);
        if (r < 0) {
                r = ctl_fail("create mesh", r, &error);
                familyd_error_clear(&error);
                goto finish;
        }
        if (ctx->json)
                r = ctl_print_json(&created->base);
        else {
                print_mesh(created);
                r = EXIT_OK;
        }
        familyd__v1__mesh__free_unpacked(created, NULL);
finish:
        ctl_mesh_dims_free(dev, n_dev);
        ctl_mesh_dims_free(exp, n_exp);
        return r;
}

static int mesh_get(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__Mesh *mesh = NULL;
        int r;

        PARSE_SIMPLE_VERB("mesh get",
                          "Usage: familyctl mesh get [OPTIONS] ID\n"
                          "\n"
                          "Shows one mesh: its views, declared sizes, flags and ranks.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (argc - optind != 1)
                return ctl_usage_error("mesh get", "expected exactly one mesh id");

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_get_mesh(ctx->client, argv[optind], &mesh, &error);
        if (r < 0) {
                r = ctl_fail("get mesh", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json)
                r = ctl_print_json(&mesh->base);
        else {
                print_mesh(mesh);
                r = EXIT_OK;
        }
        familyd__v1__mesh__free_unpacked(mesh, NULL);
        return r;
}

static int mesh_delete(Context *ctx, int argc, char **argv) {
        FamilydError error = FAMILYD_ERROR_NULL;
        int r;

        PARSE_SIMPLE_VERB("mesh delete",
                          "Usage: familyctl mesh delete [OPTIONS] ID\n"
                          "\n"
                          "Deletes a mesh. Prints nothing on success ({} with --json). A mesh that\n"
                          "live builds use is refused (FAILED_PRECONDITION).\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (argc - optind != 1)
                return ctl_usage_error("mesh delete", "expected exactly one mesh id");

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_delete_mesh(ctx->client, argv[optind], &error);
        if (r < 0) {
                r = ctl_fail("delete mesh", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json)
                puts("{}");
        return EXIT_OK;
}

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
                return mesh_create(ctx, argc - 1, argv + 1);
        if (streq(argv[1], "get"))
                return mesh_get(ctx, argc - 1, argv + 1);
        if (streq(argv[1], "delete"))
                return mesh_delete(ctx, argc - 1, argv + 1);
        return ctl_usage_error("mesh", "unknown subverb '%s': create, get or delete", argv[1]);
}

int verb_meshes(Context *ctx, int argc, char **argv) {
        _cleanup_(table_freep) Table *t = NULL;
        FamilydError error = FAMILYD_ERROR_NULL;
        Familyd__V1__ListMeshesResponse *resp = NULL;
        int r;

        PARSE_SIMPLE_VERB("meshes",
                          "Usage: familyctl meshes [OPTIONS]\n"
                          "\n"
                          "Lists the meshes: MESH_ID DEVICE_MESH EXPERT_MESH RANKS.\n"
                          "\n"
                          COMMON_OPTIONS_HELP);
        if (optind < argc)
                return ctl_usage_error("meshes", "unexpected argument '%s'", argv[optind]);

        r = ctl_connect(ctx);
        if (r != EXIT_OK)
                return r;
        r = familyd_list_meshes(ctx->client, &resp, &error);
        if (r < 0) {
                r = ctl_fail("list meshes", r, &error);
                familyd_error_clear(&error);
                return r;
        }
        if (ctx->json) {
                r = ctl_print_json(&resp->base);
                goto finish;
        }

        r = EXIT_OK;
        t = table_new(4, "MESH_ID", "DEVICE_MESH", "EXPERT_MESH", "RANKS");
        if (!t) {
                r = ctl_fail("build table", -ENOMEM, NULL);
                goto finish;
        }
        for (size_t i = 0; i < resp->n_meshes; i++) {
                const Familyd__V1__Mesh *m = resp->meshes[i];
                _cleanup_free_ char *dev = ctl_mesh_dims_to_string(m->device_mesh, m->n_device_mesh);
                _cleanup_free_ char *exp = ctl_mesh_dims_to_string(m->expert_mesh, m->n_expert_mesh);
                _cleanup_free_ char *ranks = ctl_ranks_to_string(m->ranks, m->n_ranks);

                if (table_add_cell(t, m->mesh_id) < 0 || table_add_cell(t, dev) < 0 ||
                    table_add_cell(t, exp) < 0 || table_add_cell(t, ranks) < 0) {
                        r = ctl_fail("build table", -ENOMEM, NULL);
                        goto finish;
                }
        }
        (void) table_print(t, stdout);
finish:
        familyd__v1__list_meshes_response__free_unpacked(resp, NULL);
        return r;
}

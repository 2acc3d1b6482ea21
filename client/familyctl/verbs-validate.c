/* verbs-validate.c: familyctl validate: a trainer's model file checked against its job. */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "familyctl.h"
#include "common/macro.h"

static char *fqns_to_string(char *const *fqns, size_t n) {
        char *buf = NULL;
        size_t size = 0;
        FILE *f;

        if (n == 0)
                return strdup("-");
        f = open_memstream(&buf, &size);
        if (!f)
                return NULL;
        for (size_t i = 0; i < n; i++)
                fprintf(f, "%s%s", i > 0 ? "," : "", strempty(fqns[i]));
        if (fclose(f) != 0)
                return mfree(buf);
        return buf;
}

/* Exit 1 when the daemon reported the model not ok. */
static int validate_status(const Familyd__V1__ValidateResponse *resp) {
        return !resp->ok || resp->n_violations > 0 ? EXIT_DAEMON : EXIT_OK;
}

/* The ValidateResponse as proto3 JSON, with "ok" and "violations" always present (proto3 JSON
 * may omit defaults; scripts should not have to know that a missing "ok" means false). */
static int validate_print_json(VerbRun *v) {
        const Familyd__V1__ValidateResponse *resp = (const Familyd__V1__ValidateResponse *) v->response;

        printf("{\n  \"ok\": %s,\n  \"violations\": [", resp->ok ? "true" : "false");
        for (size_t i = 0; i < resp->n_violations; i++) {
                const Familyd__V1__Violation *viol = resp->violations[i];

                printf("%s\n    {\"fqns\": [", i > 0 ? "," : "");
                for (size_t k = 0; k < viol->n_fqns; k++) {
                        if (k > 0)
                                fputs(", ", stdout);
                        ctl_json_string(stdout, viol->fqns[k]);
                }
                fputs("], \"reason\": ", stdout);
                ctl_json_string(stdout, viol->reason);
                fputs(", \"message\": ", stdout);
                ctl_json_string(stdout, viol->message);
                fputc('}', stdout);
        }
        printf("%s]\n}\n", resp->n_violations > 0 ? "\n  " : "");
        return validate_status(resp);
}

static const char *const violation_columns[] = {
        "FQNS", "REASON", "MESSAGE", NULL,
};
static const char *const *const validate_tables[] = { violation_columns, NULL };

static int validate_print(VerbRun *v) {
        const Familyd__V1__ValidateResponse *resp = (const Familyd__V1__ValidateResponse *) v->response;
        _cleanup_(table_freep) Table *t = NULL;
        int r;

        if (resp->n_violations == 0) {
                puts(resp->ok ? "ok" : "not ok (no violations listed)");
                return validate_status(resp);
        }
        t = table_new(&v->ctx->table, violation_columns);
        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        for (size_t i = 0; i < resp->n_violations; i++) {
                const Familyd__V1__Violation *viol = resp->violations[i];
                _cleanup_free_ char *fqns = fqns_to_string(viol->fqns, viol->n_fqns);

                /* A message is one line in the daemon's texts; keep the table rectangular anyway. */
                for (char *p = viol->message; p && *p; p++)
                        if (*p == '\n' || *p == '\t')
                                *p = ' ';
                if (!fqns ||
                    table_add_cell(t, fqns) < 0 ||
                    table_add_cell(t, viol->reason) < 0 ||
                    table_add_cell(t, viol->message) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        }
        r = table_print(t, false);
        return r == EXIT_OK ? validate_status(resp) : r;
}

typedef struct ValidateState {
        Familyd__V1__ValidateRequest *req;
        AxisSizes axes;
        const char *mesh;
} ValidateState;

enum {
        ARG_MESH = 0x100,
};

static const struct option validate_options[] = {
        AXIS_LONG_OPTIONS,
        { "mesh", required_argument, NULL, ARG_MESH },
        {}
};

static int validate_option(VerbRun *v, int c, const char *arg) {
        ValidateState *s = v->state;
        int r;

        if (c == ARG_MESH) {
                if (isempty(arg))
                        return ctl_usage_error("validate", "--mesh needs a mesh id");
                s->mesh = arg;
                return EXIT_OK;
        }
        r = ctl_axis_option("validate", &s->axes, c, arg);
        return r < 0 ? EXIT_INTERNAL : r;
}

/* The model file, then --mesh and the axis sizes over its context. */
static int validate_prepare(VerbRun *v) {
        ValidateState *s = v->state;
        int r;

        s->req = malloc(sizeof(*s->req));
        if (!s->req)
                return ctl_fail("read the model", -ENOMEM, NULL);
        familyd__v1__validate_request__init(s->req);
        s->req->context = malloc(sizeof(*s->req->context));
        if (!s->req->context)
                return ctl_fail("read the model", -ENOMEM, NULL);
        familyd__v1__job_context__init(s->req->context);

        r = validate_model_load(v->args[0], s->req);
        if (r != EXIT_OK)
                return r;
        if (s->mesh) {
                if (s->req->context->mesh_id != protobuf_c_empty_string)
                        free(s->req->context->mesh_id);
                s->req->context->mesh_id = strdup(s->mesh);
                if (!s->req->context->mesh_id)
                        return ctl_fail("read the model", -ENOMEM, NULL);
        }
        ctl_axis_to_context(&s->axes, s->req->context);
        return EXIT_OK;
}

static int validate_call(VerbRun *v) {
        ValidateState *s = v->state;

        return familyd_validate(v->ctx->client, s->req, (Familyd__V1__ValidateResponse **) &v->response, &v->error);
}

static void validate_done(VerbRun *v) {
        ValidateState *s = v->state;

        if (s->req)
                familyd__v1__validate_request__free_unpacked(s->req, NULL);
}

static const VerbDef validate_verb = {
        .name = "validate",
        .help = "Usage: familyctl validate [OPTIONS] MODEL.json\n"
                "\n"
                "Asks the daemon whether a trainer's model is consistent with its job (Validate): the\n"
                "cp/ep sizes each build was made for, the mesh it was laid out on, context/mesh\n"
                "agreement, shapes of parameters shared between boundaries, applied layouts against\n"
                "the builds' layouts, unknown or released builds. Prints `ok`, or every violation as a\n"
                "table FQNS REASON MESSAGE, in the order of the model's boundaries, then of its\n"
                "shared parameters.\n"
                "\n"
                "MODEL.json (see client/familyctl/README.md):\n"
                "  {\"boundaries\": [{\"fqns\": [\"layers.0.moe\", \"model.layers.0.moe\"],\n"
                "                   \"buildId\": \"bld-...\",\n"
                "                   \"appliedLayout\": {\"meshId\": \"...\", \"parameters\": [{\"name\": \"w\",\n"
                "                     \"shape\": [8, 64, 64], \"placements\": [{\"axis\": \"ep\",\n"
                "                     \"kind\": \"shard\", \"dim\": 0}]}]}}],\n"
                "   \"context\": {\"epSize\": 4},\n"
                "   \"sharedParameters\": [{\"uses\": [\n"
                "     {\"fqn\": \"embed.weight\", \"buildId\": \"bld-...\", \"parameter\": \"weight\"},\n"
                "     {\"fqn\": \"head.weight\", \"buildId\": \"bld-...\", \"parameter\": \"weight\"}]}]}\n"
                "Keys are proto3 JSON: lowerCamelCase or the proto field names (build_id, ...);\n"
                "appliedLayout, context and sharedParameters (parameters tied across builds, each\n"
                "use compared with the first) are optional. A key given twice, or a file that is\n"
                "not JSON, is refused with its line and column.\n"
                "\n"
                "Job context (set over the file's context):\n"
                "      --mesh ID       the job's mesh, made by `familyctl mesh create`\n"
                AXIS_OPTIONS_HELP
                "\n"
                "Exit status: 0 when the model is ok, 1 when the daemon reported any violation (or\n"
                "answered an error status), 2 on a bad command line or model file, 3 and 4 as for\n"
                "every verb (`familyctl --help`). --json prints {\"ok\": BOOL, \"violations\": [{\"fqns\",\n"
                "\"reason\", \"message\"}]} with the same exit status.\n"
                "\n",
        .options = validate_options,
        .option = validate_option,
        .min_args = 1,
        .max_args = 1,
        .args_missing = "missing MODEL.json",
        .tables = validate_tables,
        .state_size = sizeof(ValidateState),
        .prepare = validate_prepare,
        .call = validate_call,
        .what = "validate",
        .print = validate_print,
        .print_json = validate_print_json,
        .done = validate_done,
};

int verb_validate(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &validate_verb, argc, argv);
}

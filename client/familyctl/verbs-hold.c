/* verbs-hold.c: familyctl pin, unpin, release, publish: what keeps a build, letting it go, and sealing it for the node. */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "familyctl.h"
#include "common/macro.h"

static int pin_call(VerbRun *v) {
        return familyd_pin_build(v->ctx->client, v->args[0], (Familyd__V1__Build **) &v->response, &v->error);
}

static int unpin_call(VerbRun *v) {
        return familyd_unpin_build(v->ctx->client, v->args[0], (Familyd__V1__Build **) &v->response, &v->error);
}

/* "pinned yes", and while nothing else holds it, when it goes. */
static int hold_print(VerbRun *v) {
        const Familyd__V1__Build *b = (const Familyd__V1__Build *) v->response;

        ctl_print_field("build id", "%s", strempty(b->build_id));
        ctl_print_field("pinned", "%s", b->pinned ? "yes" : "no");
        ctl_print_field("references", "%zu", b->n_references);
        if (b->grace_deadline_unix_ms > 0) {
                _cleanup_free_ char *at = ctl_time_to_string(b->grace_deadline_unix_ms);
                ctl_print_field("freed at", "%s, unless a process takes it again", strempty(at));
        }
        return EXIT_OK;
}

static const VerbDef pin_verb = {
        .name = "pin",
        .help = "Usage: familyctl pin [OPTIONS] BUILD_ID\n"
                "\n"
                "Pins a build: it outlives every process that holds it, until `familyctl unpin`\n"
                "or `familyctl release --force`. `familyctl build --materialize` pins the build\n"
                "it makes unless --transient. --json prints the familyd.v1.Build.\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one build id",
        .args_extra = "expected exactly one build id",
        .call = pin_call,
        .what = "pin build",
        .print = hold_print,
};

static const VerbDef unpin_verb = {
        .name = "unpin",
        .help = "Usage: familyctl unpin [OPTIONS] BUILD_ID\n"
                "\n"
                "Removes a build's pin: when no process holds it either, the daemon frees it\n"
                "after its grace period (--build-grace-ms). --json prints the familyd.v1.Build.\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one build id",
        .args_extra = "expected exactly one build id",
        .call = unpin_call,
        .what = "unpin build",
        .print = hold_print,
};

static int publish_call(VerbRun *v) {
        return familyd_publish_build(v->ctx->client, v->args[0], (Familyd__V1__Build **) &v->response, &v->error);
}

static int publish_print(VerbRun *v) {
        const Familyd__V1__Build *b = (const Familyd__V1__Build *) v->response;

        ctl_print_field("build id", "%s", strempty(b->build_id));
        ctl_print_field("writable", "%s", b->writable ? "yes" : "no (published)");
        return EXIT_OK;
}

static const VerbDef publish_verb = {
        .name = "publish",
        .help = "Usage: familyctl publish [OPTIONS] BUILD_ID\n"
                "\n"
                "Publishes a writable build of a member whose parameters say init: module, once\n"
                "its filler has written the module's values and unmapped it: the daemon seals it\n"
                "against writes and the node's read-only Builds of the same request share it.\n"
                "familyd.torch does this itself. --json prints the familyd.v1.Build.\n"
                "\n",
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one build id",
        .args_extra = "expected exactly one build id",
        .call = publish_call,
        .what = "publish build",
        .print = publish_print,
};

int verb_publish(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &publish_verb, argc, argv);
}

int verb_pin(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &pin_verb, argc, argv);
}

int verb_unpin(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &unpin_verb, argc, argv);
}

/* ---------------------------------------------------------------------------------------- */
/* release ID [--force] */

typedef struct ReleaseState {
        bool force;
        bool freed;
} ReleaseState;

enum { ARG_FORCE = 0x100 };

static const struct option release_options[] = {
        { "force", no_argument, NULL, ARG_FORCE },
        {}
};

static int release_option(VerbRun *v, int c, const char *arg) {
        ReleaseState *s = v->state;

        if (c != ARG_FORCE)
                return -1;
        s->force = true;
        return EXIT_OK;
}

static int release_call(VerbRun *v) {
        ReleaseState *s = v->state;

        return familyd_release_build_full(v->ctx->client, v->args[0], s->force, &s->freed, &v->error);
}

static int release_print(VerbRun *v) {
        ReleaseState *s = v->state;

        ctl_print_field("freed", "%s", s->freed ? "yes" : "no (still held, or in its grace period)");
        return EXIT_OK;
}

static int release_print_json(VerbRun *v) {
        ReleaseState *s = v->state;

        printf("{\n  \"freed\": %s\n}\n", s->freed ? "true" : "false");
        return EXIT_OK;
}

static const VerbDef release_verb = {
        .name = "release",
        .help = "Usage: familyctl release [OPTIONS] BUILD_ID\n"
                "\n"
                "ReleaseBuild drops the calling process's reference, and familyctl, a process of\n"
                "its own that exits after each verb, holds none: without --force the daemon\n"
                "answers that the build is not held by the caller. To let go of a build that\n"
                "`familyctl build` pinned, use `familyctl unpin` (it is freed once no trainer\n"
                "holds it, after the grace period); to free a build whatever holds it, --force.\n"
                "Mappings and descriptors that trainers hold stay valid. Prints whether the\n"
                "build was freed.\n"
                "\n"
                "Options:\n"
                "      --force         free the build at once, whatever processes or pin hold it\n"
                "\n",
        .options = release_options,
        .option = release_option,
        .min_args = 1,
        .max_args = 1,
        .args_missing = "expected exactly one build id",
        .args_extra = "expected exactly one build id",
        .state_size = sizeof(ReleaseState),
        .call = release_call,
        .what = "release build",
        .print = release_print,
        .print_json = release_print_json,
};

int verb_release(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &release_verb, argc, argv);
}

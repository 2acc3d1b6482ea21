/* verbs-shard.c: familyctl shard BUILD_ID RANK: a materialised rank's shard, mapped, per slice. */

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "familyctl.h"
#include "common/macro.h"

/* How many leading values of each slice `familyctl shard` prints. */
#define SHARD_FIRST_VALUES 4

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

static const Familyd__V1__ParameterLayout *layout_parameter(const Familyd__V1__Build *b, const char *name) {
        const Familyd__V1__Layout *l = b->info ? b->info->layout : NULL;

        for (size_t i = 0; l && i < l->n_parameters; i++)
                if (streq_ptr(l->parameters[i]->name, name))
                        return l->parameters[i];
        return NULL;
}

typedef struct ShardState {
        int64_t rank;
        FamilydMapMode mode;
        const Familyd__V1__RankShard *shard;    /* in the response */
        int fd;
        bool fd_open;
        uint64_t size;
        uint8_t *mem;
} ShardState;

/* One slice as printed: its dtype, checksum and how many first values there are. */
typedef struct Slice {
        const Familyd__V1__ShardSlice *sl;
        const char *dtype;
        size_t esize;
        size_t n_first;
        uint64_t hash;
} Slice;

static int slice_read(const ShardState *s, const Familyd__V1__Build *b, const Familyd__V1__ShardSlice *sl, Slice *ret) {
        const Familyd__V1__ParameterLayout *pl = layout_parameter(b, sl->parameter);

        if (sl->byte_offset > s->size || sl->byte_length > s->size - sl->byte_offset) {
                fprintf(stderr, "familyctl: slice %s [%" PRIu64 ", +%" PRIu64 ") lies outside the shard of %" PRIu64 " bytes\n",
                        strempty(sl->parameter), sl->byte_offset, sl->byte_length, s->size);
                return -ERANGE;
        }
        *ret = (Slice) {
                .sl = sl,
                .dtype = pl && !isempty(pl->dtype) ? pl->dtype : "float32",
        };
        ret->esize = dtype_size(ret->dtype);
        ret->hash = fnv1a64(s->mem ? s->mem + sl->byte_offset : NULL, (size_t) sl->byte_length);
        ret->n_first = ret->esize ? (size_t) (sl->byte_length / ret->esize) : 0;
        if (ret->n_first > SHARD_FIRST_VALUES)
                ret->n_first = SHARD_FIRST_VALUES;
        return 0;
}

static float slice_value(const ShardState *s, const Slice *x, size_t k) {
        return element_at(s->mem + x->sl->byte_offset + k * x->esize, x->dtype);
}

/* Finds the rank's shard, fetches its descriptor over the shard socket and maps it. */
static int shard_open(VerbRun *v) {
        const Familyd__V1__Build *b = (const Familyd__V1__Build *) v->response;
        ShardState *s = v->state;
        const char *token;
        void *p = NULL;
        int r;

        for (size_t i = 0; i < b->n_shards; i++)
                if (b->shards[i]->rank == s->rank)
                        s->shard = b->shards[i];
        if (!s->shard) {
                fprintf(stderr, "familyctl: rank %" PRId64 " is not a rank of build '%s'\n", s->rank, strempty(b->build_id));
                return EXIT_DAEMON;
        }
        if (isempty(s->shard->token)) {
                fprintf(stderr, "familyctl: rank %" PRId64 " of build '%s' is not materialised on this node\n",
                        s->rank, strempty(b->build_id));
                return EXIT_DAEMON;
        }

        token = s->shard->token;
        r = familyd_shard_fetch(v->ctx->client, b->shard_socket, &token, 1, familyd_map_mode_fetch_writable(s->mode), &s->fd, &s->size, &v->error);
        if (r == -EPROTO)
                return ctl_fail("fetch the shard", r, &v->error);
        if (r == -ENOENT || r == -ECONNREFUSED || r == -ETIMEDOUT) {
                fprintf(stderr, "familyctl: cannot reach the shard socket %s: %s\n",
                        isempty(b->shard_socket) ? "(default)" : b->shard_socket, strerror(-r));
                return EXIT_UNREACHABLE;
        }
        if (r < 0)
                return ctl_fail("fetch the shard", r, NULL);
        s->fd_open = true;
        if (s->size == 0)
                return EXIT_OK;
        r = familyd_shard_map_mode(s->fd, s->size, s->mode, &p);
        if (r < 0)
                return ctl_fail("map the shard", r, NULL);
        s->mem = p;
        return EXIT_OK;
}

static void slice_print_json(const ShardState *s, const Slice *x, bool first) {
        const Familyd__V1__ShardSlice *sl = x->sl;

        printf("%s\n    {\"parameter\": ", first ? "" : ",");
        ctl_json_string(stdout, sl->parameter);
        printf(", \"dtype\": ");
        ctl_json_string(stdout, x->dtype);
        printf(", \"localShape\": ");
        json_int_list(stdout, sl->local_shape, sl->n_local_shape);
        printf(", \"globalOffset\": ");
        json_int_list(stdout, sl->global_offset, sl->n_global_offset);
        printf(", \"byteOffset\": %" PRIu64 ", \"byteLength\": %" PRIu64 ", \"fnv1a64\": \"%016" PRIx64 "\", \"first\": [",
               sl->byte_offset, sl->byte_length, x->hash);
        for (size_t k = 0; k < x->n_first; k++) {
                if (k > 0)
                        fputs(", ", stdout);
                json_float(stdout, slice_value(s, x, k));
        }
        printf("]}");
}

/* {"buildId", "rank", "node", "deviceKind", "localDevice", "sizeBytes", "mode", "writable",
 *  "slices"} */
static int shard_print_json(VerbRun *v) {
        const Familyd__V1__Build *b = (const Familyd__V1__Build *) v->response;
        ShardState *s = v->state;
        int r;

        r = shard_open(v);
        if (r != EXIT_OK)
                return r;
        printf("{\n  \"buildId\": ");
        ctl_json_string(stdout, b->build_id);
        printf(",\n  \"rank\": %" PRId64 ",\n  \"node\": ", s->shard->rank);
        ctl_json_string(stdout, s->shard->node);
        printf(",\n  \"deviceKind\": ");
        ctl_json_string(stdout, s->shard->device_kind);
        printf(",\n  \"localDevice\": %d,\n  \"sizeBytes\": %" PRIu64 ",\n  \"mode\": \"%s\",\n"
               "  \"writable\": %s,\n  \"slices\": [",
               s->shard->local_device, s->size, familyd_map_mode_to_string(s->mode),
               s->mode == FAMILYD_MAP_SHARED ? "true" : "false");
        for (size_t i = 0; i < s->shard->n_slices; i++) {
                Slice x;

                if (slice_read(s, b, s->shard->slices[i], &x) < 0) {
                        printf("\n  ]\n}\n");
                        return EXIT_INTERNAL;
                }
                slice_print_json(s, &x, i == 0);
        }
        printf("%s]\n}\n", s->shard->n_slices > 0 ? "\n  " : "");
        return EXIT_OK;
}

static const char *const slice_columns[] = {
        "PARAMETER", "LOCAL_SHAPE", "GLOBAL_OFFSET", "OFFSET", "LENGTH", "FNV1A64", "FIRST", NULL,
};
static const char *const *const shard_tables[] = { slice_columns, NULL };

static int slice_add_row(Table *t, const ShardState *s, const Slice *x) {
        const Familyd__V1__ShardSlice *sl = x->sl;
        _cleanup_free_ char *shape = ctl_shape_to_string(sl->local_shape, sl->n_local_shape);
        _cleanup_free_ char *offset = ctl_shape_to_string(sl->global_offset, sl->n_global_offset);
        _cleanup_free_ char *first = NULL;
        size_t first_size = 0;
        FILE *f = open_memstream(&first, &first_size);

        if (!f)
                return -ENOMEM;
        for (size_t k = 0; k < x->n_first; k++)
                fprintf(f, "%s%.6g", k > 0 ? "," : "", (double) slice_value(s, x, k));
        if (x->n_first == 0)
                fputc('-', f);
        if (fclose(f) != 0)
                first = mfree(first);
        if (!shape || !offset || !first ||
            table_add_cell(t, sl->parameter) < 0 ||
            table_add_cell(t, shape) < 0 ||
            table_add_cell(t, offset) < 0 ||
            table_add_cellf(t, "%" PRIu64, sl->byte_offset) < 0 ||
            table_add_cellf(t, "%" PRIu64, sl->byte_length) < 0 ||
            table_add_cellf(t, "%016" PRIx64, x->hash) < 0 ||
            table_add_cell(t, first) < 0)
                return -ENOMEM;
        return 0;
}

static int shard_print(VerbRun *v) {
        const Familyd__V1__Build *b = (const Familyd__V1__Build *) v->response;
        ShardState *s = v->state;
        _cleanup_(table_freep) Table *t = table_new(&v->ctx->table, slice_columns);
        int r;

        if (!t)
                return ctl_fail("build table", -ENOMEM, NULL);
        r = shard_open(v);
        if (r != EXIT_OK)
                return r;
        ctl_print_field("build id", "%s", strempty(b->build_id));
        ctl_print_field("rank", "%" PRId64, s->shard->rank);
        ctl_print_field("node", "%s", isempty(s->shard->node) ? "-" : s->shard->node);
        ctl_print_field("device", "%s:%d", isempty(s->shard->device_kind) ? "-" : s->shard->device_kind,
                        s->shard->local_device);
        ctl_print_field("size", "%" PRIu64 " bytes", s->size);
        ctl_print_field("mode", "%s", familyd_map_mode_to_string(s->mode));
        ctl_print_field("writable", "%s", s->mode == FAMILYD_MAP_SHARED ? "yes" : "no");
        for (size_t i = 0; i < s->shard->n_slices; i++) {
                Slice x;

                if (slice_read(s, b, s->shard->slices[i], &x) < 0)
                        return EXIT_INTERNAL;
                if (slice_add_row(t, s, &x) < 0)
                        return ctl_fail("build table", -ENOMEM, NULL);
        }
        return table_print(t, true);
}

enum {
        ARG_WRITABLE = 0x100,
        ARG_MODE,
};

static const struct option shard_options[] = {
        { "writable", no_argument,       NULL, ARG_WRITABLE },
        { "mode",     required_argument, NULL, ARG_MODE },
        {}
};

static int shard_option(VerbRun *v, int c, const char *arg) {
        ShardState *s = v->state;

        switch (c) {
        case ARG_WRITABLE:
                s->mode = FAMILYD_MAP_SHARED;
                return EXIT_OK;
        case ARG_MODE:
                if (familyd_map_mode_from_string(arg, &s->mode) < 0)
                        return ctl_usage_error("shard", "--mode needs read-only, private or shared, not '%s'", arg);
                return EXIT_OK;
        }
        return -1;
}

static int shard_prepare(VerbRun *v) {
        ShardState *s = v->state;

        if (ctl_parse_int64(v->args[1], &s->rank) < 0)
                return ctl_usage_error("shard", "RANK must be an integer, not '%s'", v->args[1]);
        return EXIT_OK;
}

static int shard_call(VerbRun *v) {
        return familyd_get_build(v->ctx->client, v->args[0], (Familyd__V1__Build **) &v->response, &v->error);
}

static void shard_done(VerbRun *v) {
        ShardState *s = v->state;

        if (s->mem)
                (void) familyd_shard_unmap(s->mem, s->size);
        if (s->fd_open)
                (void) safe_close(s->fd);
}

static const VerbDef shard_verb = {
        .name = "shard",
        .help = "Usage: familyctl shard [OPTIONS] BUILD_ID RANK\n"
                "\n"
                "Fetches the descriptor of RANK's shard of a materialised build over the build's shard\n"
                "socket, maps it, and prints each slice: PARAMETER, LOCAL_SHAPE, GLOBAL_OFFSET, OFFSET and\n"
                "LENGTH (its byte range in the shard), FNV1A64 (64-bit FNV-1a of those bytes, hex) and\n"
                "FIRST (its first values, decoded per the layout's dtype: float32, bfloat16, float16).\n"
                "--json prints the same as an object with a \"slices\" list.\n"
                "\n"
                "      --mode MODE     how to map it: read-only (the default), private (copy-on-write:\n"
                "                      writes would stay in this process) or shared (a writable\n"
                "                      descriptor, refused unless the build was made --writable);\n"
                "                      nothing is written either way\n"
                "      --writable      the same as --mode shared\n"
                "\n"
                "A rank that is not in the build, or not materialised on this node, exits 1.\n"
                "\n",
        .options = shard_options,
        .option = shard_option,
        .min_args = 2,
        .max_args = 2,
        .args_missing = "expected a build id and a rank",
        .args_extra = "expected a build id and a rank",
        .tables = shard_tables,
        .state_size = sizeof(ShardState),
        .prepare = shard_prepare,
        .call = shard_call,
        .what = "get build",
        .print = shard_print,
        .print_json = shard_print_json,
        .done = shard_done,
};

int verb_shard(Context *ctx, int argc, char **argv) {
        return verb_run(ctx, &shard_verb, argc, argv);
}

/* verbs-checkpoint.c: familyctl checkpoint inspect: a safetensors checkpoint's tensors, read here. */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "familyctl.h"
#include "common/macro.h"
#include "common/safetensors.h"

/* A checkpoint as this verb reads it: one file, or a directory's index and its files. */
typedef struct Checkpoint {
        char *path;                     /* what the user gave */
        SafetensorsIndex *index;        /* NULL: one file */
        char **files;                   /* the file names, for messages and the FILE column */
        SafetensorsHeader **headers;    /* one per file */
        uint64_t *sizes;
        size_t n_files;
} Checkpoint;

static void checkpoint_done(Checkpoint *c) {
        for (size_t i = 0; i < c->n_files; i++) {
                if (c->files)
                        free(c->files[i]);
                if (c->headers)
                        safetensors_header_free(c->headers[i]);
        }
        free(c->files);
        free(c->headers);
        free(c->sizes);
        safetensors_index_free(c->index);
        *c = (Checkpoint) {};
}

static int checkpoint_refuse(const char *path, const char *file, const char *why) {
        fprintf(stderr, "familyctl: %s%s%s: %s\n", path, file ? "/" : "", strempty(file), why);
        return EXIT_USAGE;
}

static int checkpoint_alloc(Checkpoint *c, size_t n) {
        c->files = calloc(n, sizeof *c->files);
        c->headers = calloc(n, sizeof *c->headers);
        c->sizes = calloc(n, sizeof *c->sizes);
        if (!c->files || !c->headers || !c->sizes)
                return ctl_fail("read the checkpoint", -ENOMEM, NULL);
        return EXIT_OK;
}

/* File i, name, opened in dir_fd (following links: the files are the user's own to read). */
static int checkpoint_read_file(Checkpoint *c, int dir_fd, size_t i, const char *name) {
        const char *shown = dir_fd == AT_FDCWD ? NULL : name; /* in messages, after the path */
        _cleanup_close_ int fd = -1;
        char why[512] = "";
        struct stat st;
        int r;

        c->files[i] = strdup(name);
        if (!c->files[i])
                return ctl_fail("read the checkpoint", -ENOMEM, NULL);
        c->n_files = i + 1;
        fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0)
                return checkpoint_refuse(c->path, shown, strerror(errno));
        r = safetensors_header_read(fd, &c->headers[i], why, sizeof why);
        if (r == -ENOMEM)
                return ctl_fail("read the checkpoint", r, NULL);
        if (r < 0)
                return checkpoint_refuse(c->path, shown, *why ? why : strerror(-r));
        if (fstat(fd, &st) < 0)
                return checkpoint_refuse(c->path, shown, strerror(errno));
        c->sizes[i] = (uint64_t) st.st_size;
        return EXIT_OK;
}

static int checkpoint_read_index(Checkpoint *c, int dir_fd) {
        _cleanup_free_ char *text = NULL;
        _cleanup_close_ int fd = -1;
        char why[512] = "";
        struct stat st;
        ssize_t n;
        int r;

        fd = openat(dir_fd, SAFETENSORS_INDEX_NAME, O_RDONLY | O_CLOEXEC | O_NOCTTY);
        if (fd < 0 || fstat(fd, &st) < 0)
                return checkpoint_refuse(c->path, SAFETENSORS_INDEX_NAME, strerror(errno));
        if (!S_ISREG(st.st_mode) || (uint64_t) st.st_size > SAFETENSORS_INDEX_MAX)
                return checkpoint_refuse(c->path, SAFETENSORS_INDEX_NAME,
                                         "not a regular file of at most 64 MiB");
        text = malloc((size_t) st.st_size + 1);
        if (!text)
                return ctl_fail("read the checkpoint", -ENOMEM, NULL);
        n = pread(fd, text, (size_t) st.st_size, 0);
        if (n != st.st_size)
                return checkpoint_refuse(c->path, SAFETENSORS_INDEX_NAME,
                                         n < 0 ? strerror(errno) : "it changed while read");
        r = safetensors_index_parse(text, (size_t) n, &c->index, why, sizeof why);
        if (r == -ENOMEM)
                return ctl_fail("read the checkpoint", r, NULL);
        if (r < 0)
                return checkpoint_refuse(c->path, SAFETENSORS_INDEX_NAME, why);
        r = checkpoint_alloc(c, c->index->n_files);
        for (size_t i = 0; r == EXIT_OK && i < c->index->n_files; i++)
                r = checkpoint_read_file(c, dir_fd, i, c->index->files[i]);
        if (r != EXIT_OK)
                return r;
        r = safetensors_index_check(c->index, c->headers, why, sizeof why);
        if (r < 0)
                return checkpoint_refuse(c->path, SAFETENSORS_INDEX_NAME, why);
        return EXIT_OK;
}

/* PATH: a safetensors file; or a directory with model.safetensors.index.json and its files, or
 * with model.safetensors alone. */
static int checkpoint_open(Checkpoint *c, const char *path) {
        _cleanup_close_ int dir_fd = -1;
        struct stat st;
        int r;

        c->path = (char *) path;
        if (stat(path, &st) < 0)
                return checkpoint_refuse(path, NULL, strerror(errno));
        if (!S_ISDIR(st.st_mode)) {
                r = checkpoint_alloc(c, 1);
                return r != EXIT_OK ? r : checkpoint_read_file(c, AT_FDCWD, 0, path);
        }
        dir_fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir_fd < 0)
                return checkpoint_refuse(path, NULL, strerror(errno));
        if (faccessat(dir_fd, SAFETENSORS_INDEX_NAME, F_OK, 0) == 0)
                return checkpoint_read_index(c, dir_fd);
        if (faccessat(dir_fd, "model.safetensors", F_OK, 0) < 0)
                return checkpoint_refuse(path, NULL,
                                         "a directory with neither " SAFETENSORS_INDEX_NAME
                                         " nor model.safetensors");
        r = checkpoint_alloc(c, 1);
        return r != EXIT_OK ? r : checkpoint_read_file(c, dir_fd, 0, "model.safetensors");
}

/* Every tensor of c in name order: (file, tensor) pairs, merged from the files' sorted lists. */
typedef struct TensorRef {
        size_t file;
        const SafetensorsTensor *tensor;
} TensorRef;

static int tensor_ref_compare(const void *a, const void *b) {
        return strcmp(((const TensorRef *) a)->tensor->name, ((const TensorRef *) b)->tensor->name);
}

static TensorRef *checkpoint_tensors(const Checkpoint *c, size_t *ret_n) {
        TensorRef *refs;
        size_t n = 0;

        for (size_t f = 0; f < c->n_files; f++)
                n += c->headers[f]->n_tensors;
        refs = calloc(n + 1, sizeof *refs);
        if (!refs)
                return NULL;
        n = 0;
        for (size_t f = 0; f < c->n_files; f++)
                for (size_t i = 0; i < c->headers[f]->n_tensors; i++)
                        refs[n++] = (TensorRef) { f, &c->headers[f]->tensors[i] };
        qsort(refs, n, sizeof *refs, tensor_ref_compare);
        *ret_n = n;
        return refs;
}

static char *shape_string(const SafetensorsTensor *t) {
        int64_t dims[SAFETENSORS_DIMS_MAX];

        for (size_t i = 0; i < t->n_dims; i++)
                dims[i] = (int64_t) t->shape[i];
        return ctl_shape_to_string(dims, t->n_dims);
}

static const char *const inspect_columns[] = {
        "TENSOR", "DTYPE", "SHAPE", "BYTES", "FILE", "OFFSET", NULL,
};
static const char *const *const inspect_tables[] = { inspect_columns, NULL };

static int inspect_table(VerbRun *v, const Checkpoint *c, const TensorRef *refs, size_t n) {
        _cleanup_(table_freep) Table *t = table_new(&v->ctx->table, inspect_columns);
        int r = 0;

        if (!t)
                return ctl_fail("print the tensors", -ENOMEM, NULL);
        for (size_t i = 0; r >= 0 && i < n; i++) {
                const SafetensorsTensor *x = refs[i].tensor;
                _cleanup_free_ char *shape = shape_string(x);
                r = table_add_cell(t, x->name);
                if (r >= 0)
                        r = table_add_cell(t, safetensors_dtype_to_string(x->dtype));
                if (r >= 0)
                        r = table_add_cell(t, shape ? shape : "?");
                if (r >= 0)
                        r = table_add_cellf(t, "%" PRIu64, safetensors_tensor_bytes(x));
                if (r >= 0)
                        r = table_add_cell(t, c->files[refs[i].file]);
                if (r >= 0)
                        r = table_add_cellf(t, "%" PRIu64,
                                            c->headers[refs[i].file]->data_offset + x->begin);
        }
        if (r < 0)
                return ctl_fail("print the tensors", r, NULL);
        return table_print(t, false);
}

static json_t *inspect_json_tensor(const Checkpoint *c, const TensorRef *ref) {
        const SafetensorsTensor *x = ref->tensor;
        json_t *shape = json_array();

        for (size_t i = 0; shape && i < x->n_dims; i++)
                (void) json_array_append_new(shape, json_integer((json_int_t) x->shape[i]));
        return json_pack("{s:s, s:s, s:o, s:I, s:s, s:I}", "name", x->name, "dtype",
                         safetensors_dtype_to_string(x->dtype), "shape", shape, "bytes",
                         (json_int_t) safetensors_tensor_bytes(x), "file", c->files[ref->file],
                         "offset", (json_int_t) (c->headers[ref->file]->data_offset + x->begin));
}

static json_t *inspect_json_file(const Checkpoint *c, size_t f) {
        const SafetensorsHeader *h = c->headers[f];
        json_t *metadata = json_object();

        for (size_t i = 0; metadata && i < h->n_metadata; i++)
                (void) json_object_set_new(metadata, h->metadata[2 * i],
                                           json_string(h->metadata[2 * i + 1]));
        return json_pack("{s:s, s:I, s:I, s:I, s:o}", "name", c->files[f], "bytes",
                         (json_int_t) c->sizes[f], "header_bytes", (json_int_t) h->header_size,
                         "tensors", (json_int_t) h->n_tensors, "metadata", metadata);
}

static int inspect_json(const Checkpoint *c, const TensorRef *refs, size_t n) {
        json_t *files = json_array(), *tensors = json_array(), *doc;
        int r = 0;

        for (size_t f = 0; files && f < c->n_files; f++)
                r |= json_array_append_new(files, inspect_json_file(c, f));
        for (size_t i = 0; tensors && i < n; i++)
                r |= json_array_append_new(tensors, inspect_json_tensor(c, &refs[i]));
        doc = json_pack("{s:o, s:o}", "files", files, "tensors", tensors);
        if (!doc || r < 0)
                return ctl_fail("print the tensors", -ENOMEM, NULL);
        r = json_dumpf(doc, stdout, JSON_INDENT(2)) < 0 ? -EIO : 0;
        json_decref(doc);
        if (r < 0 || putchar('\n') == EOF)
                return ctl_fail("print the tensors", -EIO, NULL);
        return EXIT_OK;
}

/* All the work happens here, before (and instead of) connecting: no daemon is asked. */
static int inspect_prepare(VerbRun *v) {
        _cleanup_free_ TensorRef *refs = NULL;
        Checkpoint c = {};
        size_t n = 0;
        int r;

        v->finished = true;
        r = checkpoint_open(&c, v->args[0]);
        if (r == EXIT_OK) {
                refs = checkpoint_tensors(&c, &n);
                r = !refs ? ctl_fail("read the checkpoint", -ENOMEM, NULL)
                    : v->ctx->json ? inspect_json(&c, refs, n)
                                   : inspect_table(v, &c, refs, n);
        }
        checkpoint_done(&c);
        return r;
}

static int inspect_call(VerbRun *v) {
        return -EINVAL; /* never: prepare finishes the verb */
}

static const char inspect_help[] =
        "Usage: familyctl checkpoint inspect [OPTIONS] PATH\n"
        "\n"
        "Lists the tensors of a safetensors checkpoint: PATH is a .safetensors file, or a\n"
        "directory with model.safetensors.index.json and the files it names (or with\n"
        "model.safetensors alone). One row per tensor, by name: its dtype, shape, bytes, file\n"
        "and offset in that file. Every header is read and checked as familyd's Build reads\n"
        "it (offsets inside the data and covering it, byte counts that match the shapes,\n"
        "known dtypes, an index that agrees with its files); the first fault is printed with\n"
        "the file and tensor, and the exit status is 2. Reads only the headers; talks to no\n"
        "daemon. --json prints {\"files\": [...], \"tensors\": [...]}.\n"
        "\n";

static const VerbDef inspect_verb = {
        .name = "checkpoint inspect",
        .help = inspect_help,
        .min_args = 1,
        .max_args = 1,
        .args_missing = "missing the checkpoint: a .safetensors file or a directory",
        .tables = inspect_tables,
        .prepare = inspect_prepare,
        .call = inspect_call,
        .what = "inspect the checkpoint",
};

static const char checkpoint_help[] =
        "Usage: familyctl checkpoint inspect [OPTIONS] PATH\n"
        "\n"
        "Reads safetensors checkpoints. `familyctl checkpoint inspect --help` for more.\n"
        "\n"
        COMMON_OPTIONS_HELP;

int verb_checkpoint(Context *ctx, int argc, char **argv) {
        if (argc < 2)
                return ctl_usage_error("checkpoint", "missing subverb: inspect");
        if (streq(argv[1], "--help") || streq(argv[1], "-h")) {
                fputs(checkpoint_help, stdout);
                return EXIT_OK;
        }
        optind = 0;
        if (streq(argv[1], "inspect"))
                return verb_run(ctx, &inspect_verb, argc - 1, argv + 1);
        return ctl_usage_error("checkpoint", "unknown subverb '%s': inspect", argv[1]);
}

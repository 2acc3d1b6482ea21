/* fuzz-registry.c: one registry YAML file, loaded by registry_load, then served. */

/*
 * A registry that loads is then used as the daemon uses it: every family is resolved (by its
 * baseline, once without a context and once with every axis active at size 2), as Resolve
 * would, and encoded and packed as ListFamilies would, so what the loader accepted is
 * exercised by the code that trusts it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/registry.h"
#include "core/resolve.h"
#include "codec/codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char *fuzz_dir;
static char *fuzz_file;

static void cleanup(void) {
        if (fuzz_file)
                unlink(fuzz_file);
        if (fuzz_dir)
                rmdir(fuzz_dir);
        free(fuzz_file);
        free(fuzz_dir);
}

static void setup(void) {
        const char *tmp = getenv("TMPDIR");
        if (asprintf(&fuzz_dir, "%s/fuzz-registry-XXXXXX", tmp && *tmp ? tmp : "/tmp") < 0)
                abort();
        if (!mkdtemp(fuzz_dir))
                abort();
        if (asprintf(&fuzz_file, "%s/fuzz.yaml", fuzz_dir) < 0)
                abort();
        atexit(cleanup);
}

static void resolve_one(const Registry *reg, const Family *f, bool parallel) {
        ResolveRequest req = { .family = f->baseline };
        ResolvedFamily res = {};
        FamilyError e = FAMILY_ERROR_NULL;

        for (Axis a = 0; parallel && a < _AXIS_MAX; a++) {
                req.context.has_size[a] = true;
                req.context.size[a] = 2;
                req.context.active[a] = true;
        }
        if (resolve_family(reg, NULL, &req, &res, &e) >= 0)
                resolved_family_done(&res);
        else if (!family_error_is_set(&e))
                abort();
        family_error_done(&e);
}

static void serve(const Registry *reg) {
        Arena arena;

        arena_init(&arena);
        for (size_t i = 0; i < reg->n_families; i++) {
                const Family *f = &reg->families[i];
                Familyd__V1__Family *pb = NULL;

                resolve_one(reg, f, false);
                resolve_one(reg, f, true);
                if (codec_family_encode(&arena, f, &pb) < 0)
                        abort();
                size_t n = familyd__v1__family__get_packed_size(pb);
                uint8_t *buf = malloc(n ? n : 1);
                if (!buf || familyd__v1__family__pack(pb, buf) != n)
                        abort();
                free(buf);
        }
        arena_done(&arena);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!fuzz_dir)
                setup();

        FILE *f = fopen(fuzz_file, "we");
        if (!f)
                abort();
        if (size > 0 && fwrite(data, 1, size, f) != size)
                abort();
        if (fclose(f) != 0)
                abort();

        Registry *reg = NULL;
        LoadDiagnostics diag = {};
        int r = registry_load(fuzz_dir, 1, &reg, &diag);
        if (r >= 0 && !reg)
                abort(); /* success must give a registry */
        if (r < 0 && diag.n == 0 && r != -ENOMEM)
                abort(); /* a load error names its problems */
        if (reg)
                serve(reg);
        registry_unref(reg);
        load_diagnostics_done(&diag);
        return 0;
}

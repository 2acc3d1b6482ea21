/* fuzz-registry.c: one registry YAML file, loaded by registry_load. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "registry.h"

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
        registry_unref(reg);
        load_diagnostics_done(&diag);
        return 0;
}

/* fuzz-request.c: a ResolveRequest end to end: wire check, unpack, decode, and resolve_family
 * against the conformance registry ($FAMILYD_SHARED/conformance/registry). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "rpc/codec-wire.h"
#include "rpc/codec.h"
#include "mesh.h"
#include "registry.h"
#include "resolve.h"
#include "resource-limits.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static Registry *fuzz_registry;
static MeshTable *fuzz_meshes;
/* How far inputs got, printed at exit with FUZZ_STATS=1: a corpus that never resolves is a bug. */
static size_t n_inputs, n_unpacked, n_decoded, n_resolved;

static void print_stats(void) {
        fprintf(stderr, "fuzz-request: %zu inputs, %zu unpacked, %zu decoded, %zu resolved\n",
                n_inputs, n_unpacked, n_decoded, n_resolved);
}

static void cleanup(void) {
        fuzz_registry = registry_unref(fuzz_registry);
        fuzz_meshes = mesh_table_free(fuzz_meshes);
}

static void setup(void) {
        const char *shared = getenv("FAMILYD_SHARED");
        if (!shared || !*shared) {
                fprintf(stderr, "fuzz-request: set FAMILYD_SHARED (the shared/ directory)\n");
                exit(2);
        }
        char *dir = NULL;
        if (asprintf(&dir, "%s/conformance/registry", shared) < 0)
                abort();
        LoadDiagnostics diag = {};
        int r = registry_load(dir, 1, &fuzz_registry, &diag);
        if (r < 0) {
                char *j = load_diagnostics_join(&diag);
                fprintf(stderr, "fuzz-request: %s: cannot load (%d)\n%s\n", dir, r, j ? j : "");
                free(j);
                exit(2);
        }
        load_diagnostics_done(&diag);
        free(dir);
        if (mesh_table_new(FAMILYD_MAX_MESHES, &fuzz_meshes) < 0)
                abort();
        atexit(cleanup);
        const char *stats = getenv("FUZZ_STATS");
        if (stats && *stats == '1')
                atexit(print_stats);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (!fuzz_registry)
                setup();
        n_inputs++;
        if (size > FAMILYD_MAX_REQUEST_BYTES)
                return 0;

        const ProtobufCMessageDescriptor *desc = &familyd__v1__resolve_request__descriptor;
        if (codec_wire_check(desc, data, size, CODEC_WIRE_MAX_DEPTH, CODEC_WIRE_MAX_MESSAGES) != 0)
                return 0;
        Familyd__V1__ResolveRequest *pb = familyd__v1__resolve_request__unpack(NULL, size, data);
        if (!pb)
                return 0;
        n_unpacked++;

        ResolveRequest req = {};
        FamilyError error = {};
        if (codec_resolve_request_decode(pb, &req, &error) >= 0) {
                ResolvedFamily resolved = {};
                FamilyError resolve_error = {};
                n_decoded++;
                if (resolve_family(fuzz_registry, fuzz_meshes, &req, &resolved, &resolve_error) >= 0) {
                        n_resolved++;
                        resolved_family_done(&resolved);
                }
                family_error_done(&resolve_error);
        }
        resolve_request_done(&req);
        family_error_done(&error);
        familyd__v1__resolve_request__free_unpacked(pb, NULL);
        return 0;
}

/* familyd-load: many concurrent clients over both sockets, latency per call, the daemon's memory
 * and descriptors sampled every second. */

/*
 * DESIGN
 *
 * The load talks to a running familyd (run-load.sh starts one with the conformance registry and
 * 8 host devices) through libfamilyd, as trainers' C code would. --clients threads are spread
 * over --procs processes forked before any gRPC call (gRPC forbids forking after it starts);
 * as root each process takes its own uid (--first-uid, default 61000, group 0 kept so the
 * 0660 sockets stay reachable), the way separate trainers of separate users would, so that the
 * shard socket's per-user connection cap (16) is not what the load measures. Each thread owns
 * one FamilydClient (its own channel) and loops over, with fixed weights:
 *
 *   Resolve     grouped_experts or attention with a context; the variant is checked
 *   CreateMesh  one of four meshes of the 8 ranks (content-derived id, the same every time)
 *   GetStatus
 *   BadResolve  an unknown family: NOT_FOUND (UNKNOWN_FAMILY) is expected (counted apart)
 *   a build cycle:
 *     Build     a small materialising Build (grouped_experts, attention, norm; on a mesh or
 *               none; float32, bfloat16 or float16), 1.5 to 48 KiB per rank
 *     Fetch     every local shard over the shard socket (familyd_shard_fetch), mapped and
 *               checksummed (FNV-1a 64); the first checksum seen for a (build kind, dtype,
 *               rank) is the reference every later one must equal, across all processes
 *     Validate  the build as one boundary with the job's context: ok, no violation
 *     Release   ReleaseBuild; every 8th cycle one token is fetched again: NOT_FOUND expected
 *
 * Every answer is checked; anything else is an unexpected error (the first 16 are printed).
 * Shard connections per user are limited to 12 at a time on the client side (a process-shared
 * semaphore): the daemon allows 16 and may take a moment to notice a closed one.
 *
 * The parent samples the daemon (--pid) every second: VmRSS from /proc/PID/status and the
 * entries of /proc/PID/fd. The samples after the warm-up are cut in thirds, and flat means:
 *  - memory: the last third's mean VmRSS is within --rss-growth-pct percent (default 10) or
 *    --rss-growth-mib MiB (default 16), whichever is larger, of the first third's. Memory
 *    moves with what is in flight (calls, queued Builds, malloc's arenas) but a leak of a few
 *    hundred bytes per call, at thousands of calls a second, passes 16 MiB within minutes;
 *  - descriptors: once the clients are gone the count must come back to within --fd-growth
 *    (default 16) of what it was before they started: a leaked descriptor stays. While they
 *    run, the last third's lowest count must be within --fd-swing (default 128) of the first
 *    third's lowest, which catches a leak undone only when its connection closes. The count
 *    swings by hundreds with the Builds in flight (a descriptor per materialised rank until
 *    ReleaseBuild) and the shard connections, and on a shared 2-core machine even the lowest
 *    of a third moved by 55 with nothing leaked; a leak of one descriptor per GetStatus (a
 *    tenth of the calls) lifts it by thousands. Besides the sample, each second's lowest of
 *    ten readings (every 100 ms) is kept, and the thirds compare those.
 * Latency is kept in log-linear histograms (1 us steps below 1 ms, then 1/512 of the value)
 * per call kind: p50, p99, max.
 *
 * Exit: 0 all well; 1 an unexpected error, a call that hung, a dead daemon, or growth over the
 * limits; 2 usage.
 */

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "familyd.h"

#define MAX_PROCS 64
#define MAX_SAMPLES 100000
#define MAX_LOGGED 16
#define SHARD_CONNECTIONS_PER_USER 12
#define N_KINDS 5
#define N_DTYPES 3
#define MAX_RANKS 8
#define HIST_BUCKETS (1024 + 26 * 512)

typedef enum Op {
        OP_RESOLVE,
        OP_CREATE_MESH,
        OP_GET_STATUS,
        OP_BAD_RESOLVE,
        OP_BUILD,
        OP_FETCH,
        OP_VALIDATE,
        OP_RELEASE,
        OP_FETCH_RELEASED,
        _OP_MAX,
} Op;

static const char *const op_names[_OP_MAX] = {
        [OP_RESOLVE] = "Resolve",          [OP_CREATE_MESH] = "CreateMesh",
        [OP_GET_STATUS] = "GetStatus",     [OP_BAD_RESOLVE] = "Resolve (bad)",
        [OP_BUILD] = "Build",              [OP_FETCH] = "shard fetch+map",
        [OP_VALIDATE] = "Validate",        [OP_RELEASE] = "ReleaseBuild",
        [OP_FETCH_RELEASED] = "fetch (released)",
};

typedef struct OpStats {
        atomic_ulong calls, errors, expected, max_us;
        atomic_ulong hist[HIST_BUCKETS];
} OpStats;

typedef struct Checksum {
        atomic_int state; /* 0 none, 1 being set, 2 set */
        uint64_t sum;
} Checksum;

typedef struct Shared {
        atomic_int stop;
        atomic_int started; /* threads that made their first call */
        OpStats ops[_OP_MAX];
        atomic_uint n_logged;
        char logged[MAX_LOGGED][320];
        Checksum sums[N_KINDS][N_DTYPES][MAX_RANKS];
        sem_t shard_slots[MAX_PROCS]; /* per user: one per process as root, else slot 0 */
} Shared;

typedef struct Options {
        const char *socket_path;
        pid_t pid;
        unsigned clients, procs;
        double duration, warmup;
        unsigned first_uid;
        double rss_growth_pct, rss_growth_mib, fd_growth, fd_swing;
        const char *samples_path;
        bool probe;
} Options;

static Options opt = {
        .clients = 64,
        .procs = 8,
        .duration = 30,
        .warmup = -1,
        .first_uid = 61000,
        .rss_growth_pct = 10,
        .rss_growth_mib = 16,
        .fd_growth = 16,
        .fd_swing = 128,
};
static Shared *shared;
static bool separate_users;

/* ---- time, randomness, histograms ------------------------------------------------------------ */

static uint64_t now_us(void) {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (uint64_t) ts.tv_sec * 1000000u + (uint64_t) ts.tv_nsec / 1000u;
}

static uint64_t rng_next(uint64_t *s) {
        *s ^= *s >> 12;
        *s ^= *s << 25;
        *s ^= *s >> 27;
        return *s * 0x2545f4914f6cdd1dull;
}

static unsigned hist_index(uint64_t us) {
        if (us < 1024)
                return (unsigned) us;
        unsigned e = 63 - (unsigned) __builtin_clzll(us); /* >= 10 */
        if (e > 35)
                return HIST_BUCKETS - 1;
        return 1024 + (e - 10) * 512 + (unsigned) ((us >> (e - 9)) - 512);
}

static uint64_t hist_value(unsigned i) {
        if (i < 1024)
                return i;
        unsigned e = (i - 1024) / 512 + 10, m = (i - 1024) % 512 + 512;
        return (uint64_t) m << (e - 9);
}

static double hist_percentile(const OpStats *s, double p) {
        uint64_t n = atomic_load(&s->calls), want = (uint64_t) (p * (double) n), seen = 0;

        if (n == 0)
                return 0;
        for (unsigned i = 0; i < HIST_BUCKETS; i++) {
                seen += atomic_load(&s->hist[i]);
                if (seen > want)
                        return (double) hist_value(i) / 1000.0;
        }
        return (double) atomic_load(&s->max_us) / 1000.0;
}

static void record(Op op, uint64_t t0, int outcome /* 0 ok, 1 expected error, -1 error */) {
        OpStats *s = &shared->ops[op];
        uint64_t us = now_us() - t0;

        atomic_fetch_add(&s->calls, 1);
        atomic_fetch_add(&s->hist[hist_index(us)], 1);
        uint64_t m = atomic_load(&s->max_us);
        while (us > m && !atomic_compare_exchange_weak(&s->max_us, &m, us))
                ;
        if (outcome > 0)
                atomic_fetch_add(&s->expected, 1);
        else if (outcome < 0)
                atomic_fetch_add(&s->errors, 1);
}

static int problem(Op op, uint64_t t0, const char *format, ...)
        __attribute__((format(printf, 3, 4)));
static int problem(Op op, uint64_t t0, const char *format, ...) {
        unsigned i = atomic_fetch_add(&shared->n_logged, 1);
        va_list ap;

        if (i < MAX_LOGGED) {
                int n = snprintf(shared->logged[i], sizeof shared->logged[i], "[pid %d] %s: ",
                                 (int) getpid(), op_names[op]);
                va_start(ap, format);
                vsnprintf(shared->logged[i] + n, sizeof shared->logged[i] - (size_t) n, format, ap);
                va_end(ap);
        }
        record(op, t0, -1);
        return -1;
}

/* A failed call's text for problem(). */
static const char *why(int r, FamilydError *e, char *buf, size_t size) {
        if (r == -EPROTO)
                snprintf(buf, size, "%s: %s", familyd_status_name(e->code),
                         e->message ? e->message : "");
        else
                snprintf(buf, size, "%s", strerror(-r));
        familyd_error_clear(e);
        return buf;
}

/* ---- requests ------------------------------------------------------------------------------ */

static Familyd__V1__Value *int_value(Familyd__V1__Value *v, int64_t x) {
        familyd__v1__value__init(v);
        v->kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
        v->int_value = x;
        return v;
}

/* The meshes of the 8 ranks (8 host devices): device views and one expert view. */
typedef struct MeshSpec {
        const char *names[2];
        int64_t sizes[2];
        size_t n;
        const char *expert_names[2];
        int64_t expert_sizes[2];
        size_t n_expert;
} MeshSpec;

static const MeshSpec meshes[] = {
        { { "dp", "ep" }, { 2, 4 }, 2, { NULL }, { 0 }, 0 },
        { { "dp", "tp" }, { 2, 4 }, 2, { NULL }, { 0 }, 0 },
        { { "dp" }, { 8 }, 1, { "edp_shard", "ep" }, { 2, 4 }, 2 },
        { { "tp", "dp" }, { 2, 4 }, 2, { NULL }, { 0 }, 0 },
};
#define N_MESHES (sizeof meshes / sizeof meshes[0])

static int create_mesh(FamilydClient *c, unsigned which, char **ret_id, FamilydError *e) {
        const MeshSpec *m = &meshes[which];
        Familyd__V1__MeshDim dims[2], edims[2], *pdims[2], *pedims[2];
        Familyd__V1__Mesh mesh = FAMILYD__V1__MESH__INIT, *reply = NULL;

        for (size_t i = 0; i < m->n; i++) {
                familyd__v1__mesh_dim__init(&dims[i]);
                dims[i].name = (char *) m->names[i];
                dims[i].size = m->sizes[i];
                pdims[i] = &dims[i];
        }
        for (size_t i = 0; i < m->n_expert; i++) {
                familyd__v1__mesh_dim__init(&edims[i]);
                edims[i].name = (char *) m->expert_names[i];
                edims[i].size = m->expert_sizes[i];
                pedims[i] = &edims[i];
        }
        mesh.n_device_mesh = m->n;
        mesh.device_mesh = pdims;
        mesh.n_expert_mesh = m->n_expert;
        mesh.expert_mesh = pedims;
        int r = familyd_create_mesh(c, &mesh, &reply, e);
        if (r < 0)
                return r;
        r = reply->mesh_id && strncmp(reply->mesh_id, "mesh-", 5) == 0 ? 0 : -EBADMSG;
        if (r == 0 && ret_id)
                *ret_id = strdup(reply->mesh_id);
        familyd__v1__mesh__free_unpacked(reply, NULL);
        return r;
}

/* What a build cycle makes: a family, its config fields, and a mesh (index, or -1: none). */
typedef struct BuildKind {
        const char *family;
        const char *keys[4];
        int64_t values[4];
        size_t n;
        int mesh;
} BuildKind;

static const BuildKind kinds[N_KINDS] = {
        { "grouped_experts", { "num_experts", "hidden_size", "moe_intermediate_size" },
          { 8, 32, 16 }, 3, 0 },
        { "grouped_experts", { "num_experts", "hidden_size", "moe_intermediate_size" },
          { 8, 32, 16 }, 3, 2 },
        { "attention", { "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size" },
          { 4, 2, 8, 32 }, 4, 1 },
        { "grouped_experts", { "num_experts", "hidden_size", "moe_intermediate_size" },
          { 4, 32, 32 }, 3, -1 },
        { "hyper_parallel.components.modules.norm.RMSNorm", { "hidden_size" }, { 2048 }, 1, 3 },
};
static const char *const dtypes[N_DTYPES] = { "float32", "bfloat16", "float16" };

typedef struct Client {
        unsigned proc, index;
        uint64_t rng;
        FamilydClient *c;
        char *mesh_ids[N_MESHES];
        unsigned cycles;
} Client;

static int do_resolve(Client *cl) {
        Familyd__V1__ResolveRequest req = FAMILYD__V1__RESOLVE_REQUEST__INIT;
        Familyd__V1__JobContext ctx = FAMILYD__V1__JOB_CONTEXT__INIT;
        Familyd__V1__ResolveRequest__ArgumentsEntry
                arg = FAMILYD__V1__RESOLVE_REQUEST__ARGUMENTS_ENTRY__INIT, *args[1] = { &arg };
        Familyd__V1__Value v;
        Familyd__V1__ResolveResponse *reply = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        unsigned pick = (unsigned) (rng_next(&cl->rng) % 4);
        const char *want;
        char buf[256];

        req.context = &ctx;
        if (pick < 3) {
                int64_t ep = (int64_t[]) { 1, 2, 4 }[pick];
                bool mxfp8 = ep <= 2 && rng_next(&cl->rng) % 2;
                req.family = (char *) "grouped_experts";
                ctx._ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                ctx.ep_size = ep;
                ctx.ep = ep > 1;
                familyd__v1__value__init(&v);
                v.kind_case = FAMILYD__V1__VALUE__KIND_BOOL_VALUE;
                v.bool_value = mxfp8;
                arg.key = (char *) "use_mxfp8";
                arg.value = &v;
                req.n_arguments = 1;
                req.arguments = args;
                want = mxfp8 ? "mxfp8" : ep > 1 ? "grouped_ep" : "grouped";
        } else {
                req.family = (char *) "attention";
                ctx._cp_size_case = FAMILYD__V1__JOB_CONTEXT___CP_SIZE_CP_SIZE;
                ctx.cp_size = 2;
                ctx.cp = true;
                want = "ring";
        }
        uint64_t t0 = now_us();
        int r = familyd_resolve(cl->c, &req, &reply, &e);
        if (r < 0)
                return problem(OP_RESOLVE, t0, "%s", why(r, &e, buf, sizeof buf));
        bool right = reply->resolved && reply->resolved->variant &&
                     strcmp(reply->resolved->variant, want) == 0;
        familyd__v1__resolve_response__free_unpacked(reply, NULL);
        if (!right)
                return problem(OP_RESOLVE, t0, "not the variant %s", want);
        record(OP_RESOLVE, t0, 0);
        return 0;
}

static int do_bad_resolve(Client *cl) {
        Familyd__V1__ResolveRequest req = FAMILYD__V1__RESOLVE_REQUEST__INIT;
        Familyd__V1__ResolveResponse *reply = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        char buf[256];

        req.family = (char *) "no_such_family";
        uint64_t t0 = now_us();
        int r = familyd_resolve(cl->c, &req, &reply, &e);
        if (r == 0) {
                familyd__v1__resolve_response__free_unpacked(reply, NULL);
                return problem(OP_BAD_RESOLVE, t0, "an unknown family resolved");
        }
        if (r == -EPROTO && e.code == 5 /* NOT_FOUND */ && e.reason &&
            strcmp(e.reason, "UNKNOWN_FAMILY") == 0) {
                familyd_error_clear(&e);
                record(OP_BAD_RESOLVE, t0, 1);
                return 0;
        }
        return problem(OP_BAD_RESOLVE, t0, "%s", why(r, &e, buf, sizeof buf));
}

static int do_status(Client *cl) {
        Familyd__V1__GetStatusResponse *st = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        char buf[256];

        uint64_t t0 = now_us();
        int r = familyd_get_status(cl->c, &st, &e);
        if (r < 0)
                return problem(OP_GET_STATUS, t0, "%s", why(r, &e, buf, sizeof buf));
        bool right = st->families > 0 && st->shm_bytes_in_use <= st->shm_budget_bytes;
        familyd__v1__get_status_response__free_unpacked(st, NULL);
        if (!right)
                return problem(OP_GET_STATUS, t0, "inconsistent status");
        record(OP_GET_STATUS, t0, 0);
        return 0;
}

static int do_create_mesh(Client *cl) {
        FamilydError e = FAMILYD_ERROR_NULL;
        unsigned which = (unsigned) (rng_next(&cl->rng) % N_MESHES);
        char *id = NULL, buf[256];

        uint64_t t0 = now_us();
        int r = create_mesh(cl->c, which, &id, &e);
        if (r < 0)
                return problem(OP_CREATE_MESH, t0, "%s", why(r, &e, buf, sizeof buf));
        bool same = !cl->mesh_ids[which] || strcmp(id, cl->mesh_ids[which]) == 0;
        free(id);
        if (!same)
                return problem(OP_CREATE_MESH, t0, "the same mesh got another id");
        record(OP_CREATE_MESH, t0, 0);
        return 0;
}

static uint64_t fnv1a64(const uint8_t *p, size_t n) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n; i++)
                h = (h ^ p[i]) * 0x100000001b3ull;
        return h;
}

/* Fetches, maps and checksums every local shard of b; 0 or -1 (a problem was recorded). */
static int fetch_and_check(Client *cl, const Familyd__V1__Build *b, unsigned kind, unsigned dtype) {
        const char *tokens[MAX_RANKS];
        int64_t ranks[MAX_RANKS];
        uint64_t want_sizes[MAX_RANKS], sizes[MAX_RANKS];
        int fds[MAX_RANKS];
        size_t n = 0;
        FamilydError e = FAMILYD_ERROR_NULL;
        sem_t *slots = &shared->shard_slots[separate_users ? cl->proc : 0];
        char buf[256];

        for (size_t i = 0; i < b->n_shards && n < MAX_RANKS; i++)
                if (b->shards[i]->token && *b->shards[i]->token) {
                        tokens[n] = b->shards[i]->token;
                        ranks[n] = b->shards[i]->rank;
                        want_sizes[n++] = b->shards[i]->size_bytes;
                }
        uint64_t t0 = now_us();
        if (n == 0)
                return problem(OP_FETCH, t0, "a materialised build has no token");
        while (sem_wait(slots) < 0 && errno == EINTR)
                ;
        t0 = now_us();
        int r = familyd_shard_fetch(cl->c, b->shard_socket, tokens, n, false, fds, sizes, &e);
        (void) sem_post(slots);
        if (r < 0)
                return problem(OP_FETCH, t0, "%s", why(r, &e, buf, sizeof buf));
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
                void *p = NULL;
                if (sizes[i] != want_sizes[i] || ranks[i] < 0 || ranks[i] >= MAX_RANKS ||
                    familyd_shard_map(fds[i], sizes[i], false, &p) < 0) {
                        bad = 1;
                } else {
                        uint64_t sum = fnv1a64(p, sizes[i]);
                        Checksum *ref = &shared->sums[kind][dtype][ranks[i]];
                        int expect = 0;
                        if (atomic_compare_exchange_strong(&ref->state, &expect, 1)) {
                                ref->sum = sum;
                                atomic_store(&ref->state, 2);
                        } else {
                                while (atomic_load(&ref->state) != 2)
                                        ;
                                if (ref->sum != sum)
                                        bad = 2;
                        }
                        (void) familyd_shard_unmap(p, sizes[i]);
                }
                close(fds[i]);
        }
        if (bad)
                return problem(OP_FETCH, t0, bad == 2 ? "shard bytes differ from the same build's "
                                                        "earlier bytes" : "bad shard size or map");
        record(OP_FETCH, t0, 0);
        return 0;
}

static int do_validate(Client *cl, const Familyd__V1__Build *b, const char *mesh_id) {
        Familyd__V1__ValidateRequest req = FAMILYD__V1__VALIDATE_REQUEST__INIT;
        Familyd__V1__ModelBoundary boundary = FAMILYD__V1__MODEL_BOUNDARY__INIT;
        Familyd__V1__ModelBoundary *pb[1] = { &boundary };
        Familyd__V1__JobContext ctx = FAMILYD__V1__JOB_CONTEXT__INIT;
        Familyd__V1__ValidateResponse *reply = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        char fqn[64], *fqns[1] = { fqn }, buf[256];

        snprintf(fqn, sizeof fqn, "layers.%u.%u.block", cl->proc, cl->index);
        boundary.n_fqns = 1;
        boundary.fqns = fqns;
        boundary.build_id = b->build_id;
        ctx.mesh_id = (char *) (mesh_id ? mesh_id : "");
        req.n_boundaries = 1;
        req.boundaries = pb;
        req.context = &ctx;
        uint64_t t0 = now_us();
        int r = familyd_validate(cl->c, &req, &reply, &e);
        if (r < 0)
                return problem(OP_VALIDATE, t0, "%s", why(r, &e, buf, sizeof buf));
        bool ok = reply->ok && reply->n_violations == 0;
        if (!ok)
                snprintf(buf, sizeof buf, "%s",
                         reply->n_violations ? reply->violations[0]->message : "not ok");
        familyd__v1__validate_response__free_unpacked(reply, NULL);
        if (!ok)
                return problem(OP_VALIDATE, t0, "violations: %s", buf);
        record(OP_VALIDATE, t0, 0);
        return 0;
}

static int do_build_cycle(Client *cl) {
        unsigned kind = (unsigned) (rng_next(&cl->rng) % N_KINDS);
        unsigned dtype = (unsigned) (rng_next(&cl->rng) % N_DTYPES);
        const BuildKind *k = &kinds[kind];
        Familyd__V1__BuildRequest req = FAMILYD__V1__BUILD_REQUEST__INIT;
        Familyd__V1__Config config = FAMILYD__V1__CONFIG__INIT;
        Familyd__V1__Config__FieldsEntry entries[5], *pentries[5];
        Familyd__V1__Value values[5];
        Familyd__V1__MaterializeOptions mat = FAMILYD__V1__MATERIALIZE_OPTIONS__INIT;
        Familyd__V1__BuildResponse *reply = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        const char *mesh_id = k->mesh >= 0 ? cl->mesh_ids[k->mesh] : NULL;
        char buf[256];
        int ret = 0;

        for (size_t i = 0; i <= k->n; i++) {
                familyd__v1__config__fields_entry__init(&entries[i]);
                if (i < k->n) {
                        entries[i].key = (char *) k->keys[i];
                        entries[i].value = int_value(&values[i], k->values[i]);
                } else {
                        familyd__v1__value__init(&values[i]);
                        values[i].kind_case = FAMILYD__V1__VALUE__KIND_DOUBLE_VALUE;
                        values[i].double_value = 0.02;
                        entries[i].key = (char *) "initializer_range";
                        entries[i].value = &values[i];
                }
                pentries[i] = &entries[i];
        }
        config.n_fields = k->n + (strcmp(k->family, "grouped_experts") == 0 ||
                                  strcmp(k->family, "attention") == 0);
        config.fields = pentries;
        mat.enabled = true;
        mat.dtype = (char *) dtypes[dtype];
        mat._seed_case = FAMILYD__V1__MATERIALIZE_OPTIONS___SEED_SEED;
        mat.seed = 7;
        req.family = (char *) k->family;
        req.config = &config;
        req.mesh_id = (char *) (mesh_id ? mesh_id : "");
        req.materialize = &mat;
        /* Each cycle its own build, freed by its ReleaseBuild (the daemon runs with
         * --build-grace-ms 0): identical requests of other clients would otherwise share it. */
        req.private_build = true;

        uint64_t t0 = now_us();
        int r = familyd_build(cl->c, &req, &reply, &e);
        if (r < 0)
                return problem(OP_BUILD, t0, "%s %s: %s", k->family, dtypes[dtype],
                               why(r, &e, buf, sizeof buf));
        record(OP_BUILD, t0, 0);
        const Familyd__V1__Build *b = reply->build;

        if (fetch_and_check(cl, b, kind, dtype) < 0)
                ret = -1;
        if (do_validate(cl, b, mesh_id) < 0)
                ret = -1;

        t0 = now_us();
        r = familyd_release_build(cl->c, b->build_id, &e);
        if (r < 0)
                ret = problem(OP_RELEASE, t0, "%s", why(r, &e, buf, sizeof buf));
        else
                record(OP_RELEASE, t0, 0);

        if (++cl->cycles % 8 == 0 && r == 0) {
                /* Released: its tokens are gone. */
                const char *token = NULL;
                int fd;
                for (size_t i = 0; i < b->n_shards && !token; i++)
                        if (b->shards[i]->token && *b->shards[i]->token)
                                token = b->shards[i]->token;
                t0 = now_us();
                r = familyd_shard_fetch(cl->c, b->shard_socket, &token, 1, false, &fd, NULL, &e);
                if (r == 0) {
                        close(fd);
                        ret = problem(OP_FETCH_RELEASED, t0, "a released token was served");
                } else if (r == -EPROTO && e.code == 5 /* NOT_FOUND */) {
                        familyd_error_clear(&e);
                        record(OP_FETCH_RELEASED, t0, 1);
                } else
                        ret = problem(OP_FETCH_RELEASED, t0, "%s", why(r, &e, buf, sizeof buf));
        }
        familyd__v1__build_response__free_unpacked(reply, NULL);
        return ret;
}

static void *client_main(void *userdata) {
        Client *cl = userdata;
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH |
                              FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS,
                .socket_path = opt.socket_path,
                .timeout_ms = 60000,
        };
        FamilydError e = FAMILYD_ERROR_NULL;
        char buf[256];

        if (familyd_client_new(&params, &cl->c) < 0) {
                problem(OP_GET_STATUS, now_us(), "cannot make a client");
                return NULL;
        }
        for (unsigned m = 0; m < N_MESHES; m++) {
                uint64_t t0 = now_us();
                int r = create_mesh(cl->c, m, &cl->mesh_ids[m], &e);
                if (r < 0) {
                        problem(OP_CREATE_MESH, t0, "%s", why(r, &e, buf, sizeof buf));
                        goto done;
                }
                record(OP_CREATE_MESH, t0, 0);
        }
        atomic_fetch_add(&shared->started, 1);

        while (!atomic_load(&shared->stop)) {
                unsigned w = (unsigned) (rng_next(&cl->rng) % 100);
                if (w < 30)
                        (void) do_resolve(cl);
                else if (w < 40)
                        (void) do_create_mesh(cl);
                else if (w < 50)
                        (void) do_status(cl);
                else if (w < 55)
                        (void) do_bad_resolve(cl);
                else
                        (void) do_build_cycle(cl);
        }
done:
        for (unsigned m = 0; m < N_MESHES; m++)
                free(cl->mesh_ids[m]);
        familyd_client_free(cl->c);
        return NULL;
}

static int child_main(unsigned proc, unsigned n_threads) {
        if (separate_users) {
                uid_t uid = opt.first_uid + proc;
                /* Group 0 stays: the daemon's sockets are 0660 root:root. */
                if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 ||
                    setresuid(uid, uid, uid) < 0) {
                        perror("familyd-load: dropping to a user of its own");
                        return 1;
                }
        }
        Client *cls = calloc(n_threads, sizeof *cls);
        pthread_t *th = calloc(n_threads, sizeof *th);
        if (!cls || !th)
                return 1;
        for (unsigned i = 0; i < n_threads; i++) {
                cls[i] = (Client) { .proc = proc, .index = i,
                                    .rng = 0x9e3779b97f4a7c15ull ^ ((uint64_t) proc << 32 | i) };
                if (pthread_create(&th[i], NULL, client_main, &cls[i]) != 0)
                        return 1;
        }
        for (unsigned i = 0; i < n_threads; i++)
                pthread_join(th[i], NULL);
        free(cls);
        free(th);
        return 0;
}

/* ---- the parent: sampling and the report ----------------------------------------------------- */

static long daemon_rss_kib(pid_t pid) {
        char path[64], line[256];
        long kib = -1;

        snprintf(path, sizeof path, "/proc/%d/status", (int) pid);
        FILE *f = fopen(path, "re");
        if (!f)
                return -1;
        while (fgets(line, sizeof line, f))
                if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
                        break;
        fclose(f);
        return kib;
}

static long daemon_fds(pid_t pid) {
        char path[64];
        long n = 0;
        struct dirent *de;

        snprintf(path, sizeof path, "/proc/%d/fd", (int) pid);
        DIR *d = opendir(path);
        if (!d)
                return -1;
        while ((de = readdir(d)))
                n += de->d_name[0] != '.';
        closedir(d);
        return n;
}

static uint64_t total_calls(void) {
        uint64_t n = 0;
        for (unsigned o = 0; o < _OP_MAX; o++)
                n += atomic_load(&shared->ops[o].calls);
        return n;
}

static double mean(const double *v, size_t from, size_t to) {
        double s = 0;
        for (size_t i = from; i < to; i++)
                s += v[i];
        return to > from ? s / (double) (to - from) : 0;
}

static double lowest(const double *v, size_t from, size_t to) {
        double m = v[from];
        for (size_t i = from; i < to; i++)
                m = v[i] < m ? v[i] : m;
        return m;
}

static int probe(void) {
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH |
                              FAMILYD_CLIENT_PARAM_FIELD_TIMEOUT_MS,
                .socket_path = opt.socket_path,
                .timeout_ms = 2000,
        };
        FamilydClient *c = NULL;
        Familyd__V1__GetStatusResponse *st = NULL;
        int r = familyd_client_new(&params, &c);
        if (r == 0)
                r = familyd_get_status(c, &st, NULL);
        if (st)
                familyd__v1__get_status_response__free_unpacked(st, NULL);
        familyd_client_free(c);
        return r < 0 ? 1 : 0;
}

static void usage(void) {
        printf("familyd-load --socket PATH --pid PID [--clients N] [--procs N] [--duration S]\n"
               "             [--warmup S] [--first-uid UID] [--rss-growth-pct P]\n"
               "             [--rss-growth-mib M] [--fd-growth N] [--fd-swing N]\n"
               "             [--samples FILE]\n"
               "familyd-load --socket PATH --probe\n");
}

static int parse_options(int argc, char **argv) {
        static const struct option options[] = {
                { "socket", required_argument, NULL, 's' },
                { "pid", required_argument, NULL, 'p' },
                { "clients", required_argument, NULL, 'c' },
                { "procs", required_argument, NULL, 'P' },
                { "duration", required_argument, NULL, 'd' },
                { "warmup", required_argument, NULL, 'w' },
                { "first-uid", required_argument, NULL, 'u' },
                { "rss-growth-pct", required_argument, NULL, 'r' },
                { "rss-growth-mib", required_argument, NULL, 'm' },
                { "fd-growth", required_argument, NULL, 'f' },
                { "fd-swing", required_argument, NULL, 'F' },
                { "samples", required_argument, NULL, 'S' },
                { "probe", no_argument, NULL, 'x' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case 's': opt.socket_path = optarg; break;
                case 'p': opt.pid = (pid_t) atoi(optarg); break;
                case 'c': opt.clients = (unsigned) atoi(optarg); break;
                case 'P': opt.procs = (unsigned) atoi(optarg); break;
                case 'd': opt.duration = atof(optarg); break;
                case 'w': opt.warmup = atof(optarg); break;
                case 'u': opt.first_uid = (unsigned) atoi(optarg); break;
                case 'r': opt.rss_growth_pct = atof(optarg); break;
                case 'm': opt.rss_growth_mib = atof(optarg); break;
                case 'f': opt.fd_growth = atof(optarg); break;
                case 'F': opt.fd_swing = atof(optarg); break;
                case 'S': opt.samples_path = optarg; break;
                case 'x': opt.probe = true; break;
                case 'h': usage(); exit(0);
                default: return -1;
                }
        }
        if (!opt.socket_path || (!opt.probe && opt.pid <= 0) || opt.clients == 0 ||
            opt.procs == 0 || opt.procs > MAX_PROCS || opt.procs > opt.clients ||
            opt.duration <= 0)
                return -1;
        if (opt.warmup < 0)
                opt.warmup = opt.duration / 3 < 60 ? opt.duration / 3 : 60;
        return 0;
}

/* The daemon's memory and descriptors, once a second (fd_low: the lowest seen within it). */
typedef struct Samples {
        double rss[MAX_SAMPLES], fds[MAX_SAMPLES], fd_low[MAX_SAMPLES], at[MAX_SAMPLES];
        size_t n;
} Samples;

/* Samples the daemon until the duration is over: 0, or 1 when the daemon is gone. */
static int sample_daemon(Samples *x, uint64_t start) {
        uint64_t last_print = start;
        uint64_t print_every = opt.duration > 120 ? 60000000u : 10000000u;

        for (;;) {
                uint64_t next = start + (uint64_t) (x->n + 1) * 1000000u;
                long low = -1;
                while (now_us() < next) {
                        usleep((useconds_t) (next - now_us() > 100000 ? 100000 : next - now_us()));
                        long k = daemon_fds(opt.pid);
                        if (k >= 0 && (low < 0 || k < low))
                                low = k;
                }
                long r = daemon_rss_kib(opt.pid), f = daemon_fds(opt.pid);
                if (f >= 0 && (low < 0 || f < low))
                        low = f;
                if (r < 0 || f < 0) {
                        printf("familyd-load: the daemon (pid %d) is gone\n", (int) opt.pid);
                        return 1;
                }
                if (x->n < MAX_SAMPLES) {
                        x->rss[x->n] = (double) r / 1024.0;
                        x->fds[x->n] = (double) f;
                        x->fd_low[x->n] = (double) low;
                        x->at[x->n] = (double) (now_us() - start) / 1e6;
                        x->n++;
                }
                if (now_us() - last_print >= print_every) {
                        last_print = now_us();
                        printf("  t=%4.0f s  calls %10" PRIu64 "  clients started %d"
                               "  VmRSS %7.1f MiB  fds %ld\n",
                               x->at[x->n - 1], total_calls(), atomic_load(&shared->started),
                               (double) r / 1024.0, f);
                        fflush(stdout);
                }
                if (now_us() - start >= (uint64_t) (opt.duration * 1e6))
                        return 0;
        }
}

/* Each client finishes the call it is in (deadline 60 s), then exits: 0, or 1 when one did not. */
static int wait_clients(const pid_t *children) {
        uint64_t give_up = now_us() + 90000000u;
        int status = 0;

        for (unsigned p = 0; p < opt.procs; p++) {
                int ws = 0;
                pid_t w;
                while ((w = waitpid(children[p], &ws, WNOHANG)) == 0 && now_us() < give_up)
                        usleep(50000);
                if (w == 0) {
                        printf("familyd-load: client process %u did not finish its calls\n", p);
                        kill(children[p], SIGKILL);
                        waitpid(children[p], &ws, 0);
                        status = 1;
                } else if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
                        printf("familyd-load: client process %u failed (status 0x%x)\n", p, ws);
                        status = 1;
                }
        }
        return status;
}

/* The calls' table: 0, or 1 on errors, no calls, or clients that never got going. */
static int report_calls(double elapsed) {
        uint64_t calls = 0, errors = 0, expected = 0;
        int status = 0;

        printf("\n  %-18s %10s %8s %9s %9s %9s %9s\n", "call", "calls", "errors", "expected",
               "p50 ms", "p99 ms", "max ms");
        for (unsigned o = 0; o < _OP_MAX; o++) {
                const OpStats *s = &shared->ops[o];
                uint64_t n = atomic_load(&s->calls);
                calls += n;
                errors += atomic_load(&s->errors);
                expected += atomic_load(&s->expected);
                printf("  %-18s %10" PRIu64 " %8lu %9lu %9.2f %9.2f %9.2f\n", op_names[o], n,
                       atomic_load(&s->errors), atomic_load(&s->expected),
                       hist_percentile(s, 0.50), hist_percentile(s, 0.99),
                       (double) atomic_load(&s->max_us) / 1000.0);
        }
        printf("  %-18s %10" PRIu64 " %8" PRIu64 " %9" PRIu64 "   (%.0f calls/s over %.0f s)\n",
               "all", calls, errors, expected, (double) calls / elapsed, elapsed);
        unsigned logged = atomic_load(&shared->n_logged);
        for (unsigned i = 0; i < logged && i < MAX_LOGGED; i++)
                printf("  error: %s\n", shared->logged[i]);
        if (errors > 0 || calls == 0)
                status = 1;
        if (atomic_load(&shared->started) < (int) opt.clients) {
                printf("familyd-load: only %d of %u clients got going\n",
                       atomic_load(&shared->started), opt.clients);
                status = 1;
        }
        return status;
}

/* Flat after the warm-up: the last third's mean against the first third's. 0, or 1. */
static int report_growth(const Samples *x) {
        size_t w0 = 0;
        while (w0 < x->n && x->at[w0] < opt.warmup)
                w0++;
        size_t n = x->n - w0, third = n / 3;
        if (third < 2) {
                printf("familyd-load: too few samples after the warm-up (%zu) to judge growth\n",
                       n);
                return 1;
        }
        double r1 = mean(x->rss, w0, w0 + third), r3 = mean(x->rss, x->n - third, x->n);
        double f1 = lowest(x->fd_low, w0, w0 + third);
        double f3 = lowest(x->fd_low, x->n - third, x->n);
        double rss_limit = r1 * opt.rss_growth_pct / 100.0;
        if (rss_limit < opt.rss_growth_mib)
                rss_limit = opt.rss_growth_mib;
        bool rss_flat = r3 - r1 <= rss_limit, fd_flat = f3 - f1 <= opt.fd_swing;
        double rmin = x->rss[w0], rmax = x->rss[w0], fmin = x->fds[w0], fmax = x->fds[w0];
        for (size_t i = w0; i < x->n; i++) {
                rmin = x->rss[i] < rmin ? x->rss[i] : rmin;
                rmax = x->rss[i] > rmax ? x->rss[i] : rmax;
                fmin = x->fds[i] < fmin ? x->fds[i] : fmin;
                fmax = x->fds[i] > fmax ? x->fds[i] : fmax;
        }
        printf("  VmRSS: %.1f MiB at the start, after warm-up %.1f..%.1f MiB; first third "
               "mean %.1f MiB, last third %.1f MiB: %+.1f MiB (%+.1f%%), limit +%.1f MiB: "
               "%s\n",
               x->rss[0], rmin, rmax, r1, r3, r3 - r1, 100.0 * (r3 - r1) / r1, rss_limit,
               rss_flat ? "flat" : "GROWING");
        printf("  fds:   %.0f at the start, after warm-up %.0f..%.0f; lowest of the first "
               "third %.0f, of the last third %.0f: %+.0f, limit +%.0f: %s\n",
               x->fds[0], fmin, fmax, f1, f3, f3 - f1, opt.fd_swing,
               fd_flat ? "flat" : "GROWING");
        printf("  (%zu samples, 1 per second; %zu after the warm-up, thirds of %zu)\n",
               x->n, n, third);
        return rss_flat && fd_flat ? 0 : 1;
}

static void write_samples(const Samples *x) {
        FILE *f = opt.samples_path ? fopen(opt.samples_path, "we") : NULL;

        if (!f)
                return;
        fprintf(f, "seconds,vmrss_mib,fds,fds_lowest_in_second\n");
        for (size_t i = 0; i < x->n; i++)
                fprintf(f, "%.1f,%.2f,%.0f,%.0f\n", x->at[i], x->rss[i], x->fds[i],
                        x->fd_low[i]);
        fclose(f);
}

/* The clients are gone: their connections close, the daemon's count comes back. 0, or 1. */
static int check_fds_back(long fds_before) {
        long fds_after = daemon_fds(opt.pid);
        for (unsigned i = 0; i < 100 && fds_after > fds_before + (long) opt.fd_growth; i++) {
                usleep(100000);
                fds_after = daemon_fds(opt.pid);
        }
        bool fds_back = fds_after >= 0 && fds_after <= fds_before + (long) opt.fd_growth;
        printf("  fds idle: %ld before the clients started, %ld after they left, limit +%.0f: %s\n",
               fds_before, fds_after, opt.fd_growth, fds_back ? "back" : "NOT BACK");
        return fds_back ? 0 : 1;
}

int main(int argc, char **argv) {
        static Samples samples;
        int status = 0;

        if (parse_options(argc, argv) < 0) {
                usage();
                return 2;
        }
        if (opt.probe)
                return probe();

        shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                      -1, 0);
        if (shared == MAP_FAILED) {
                perror("familyd-load: mmap");
                return 1;
        }
        separate_users = geteuid() == 0 && opt.first_uid > 0;
        for (unsigned i = 0; i < MAX_PROCS; i++)
                sem_init(&shared->shard_slots[i], 1, SHARD_CONNECTIONS_PER_USER);

        printf("familyd-load: %u clients (%u processes of %u threads%s), %.0f s, warm-up %.0f s, "
               "daemon pid %d\n",
               opt.clients, opt.procs, (opt.clients + opt.procs - 1) / opt.procs,
               separate_users ? ", a uid each" : ", one uid", opt.duration, opt.warmup,
               (int) opt.pid);
        fflush(stdout);

        long fds_before = daemon_fds(opt.pid);
        pid_t children[MAX_PROCS];
        for (unsigned p = 0; p < opt.procs; p++) {
                unsigned n = opt.clients / opt.procs + (p < opt.clients % opt.procs);
                children[p] = fork();
                if (children[p] < 0) {
                        perror("familyd-load: fork");
                        return 1;
                }
                if (children[p] == 0)
                        _exit(child_main(p, n));
        }

        uint64_t start = now_us();
        status |= sample_daemon(&samples, start);
        double elapsed = (double) (now_us() - start) / 1e6;
        atomic_store(&shared->stop, 1);
        status |= wait_clients(children);
        status |= report_calls(elapsed);
        status |= report_growth(&samples);
        write_samples(&samples);
        status |= check_fds_back(fds_before);
        if (kill(opt.pid, 0) < 0) {
                printf("familyd-load: the daemon is gone at the end\n");
                status = 1;
        }
        printf("familyd-load: %s\n", status == 0 ? "PASS" : "FAIL");
        return status;
}

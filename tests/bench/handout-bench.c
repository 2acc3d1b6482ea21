/* handout-bench: a built shard mapped through the shard socket against the same bytes over gRPC. */

/*
 * DESIGN
 *
 * The handout goal: the time from a Build reply to a mapped tensor in the trainer, and to
 * the first full read of it, against the same bytes sent in a gRPC response. The bench starts
 * no daemon (run-handout-bench.sh does); it talks to a running familyd whose registry has a
 * family (default `blob`) with one float32 parameter (default `data`) of shape [n] (config field
 * default `n`) initialised to the constant 1.0, so a full read can be checked: the sum is n.
 *
 * Every size (MiB) is built with materialize first (untimed) and held; then, timed:
 *
 *   map        connect to the shard socket named by the Build reply, send ShardFdRequest{token},
 *              recvmsg the reply with its descriptor (SCM_RIGHTS), mmap it PROT_READ/MAP_SHARED.
 *              Timed from the connect to mmap's return. A cold trainer: a fresh connection and
 *              fresh mapping every time, so every page of the read below faults in anew.
 *   map+read   the same, then a sum of every float32 of the mapping, checked against n: a
 *              lazy mapping, every page faulted by the read.
 *   map+populate+read  the same with the mapping populated first as libfamilyd and the Python
 *              client do by default (MADV_POPULATE_READ on up to 4 threads): what a trainer
 *              gets now. grpc/(map+read) and the floor goal use this one.
 *   read floor the same sum again over the populated mapping just read, every page resident
 *              in it: what the read costs without page faults, on the same pages (huge or not).
 *   host mapping  a plain memfd of the same bytes made by this process (no familyd), written
 *              once, then in every round mapped, populated and read exactly as the shard: what
 *              any fresh mapping of these pages costs on this host, whoever made them. On 4 KiB
 *              pages that is the page-table entries' cost, which no daemon can avoid (a
 *              hypervisor that shadows page tables makes the first use of every new entry
 *              expensive: docs/benchmarks.md). Measured for the sizes not on hugetlb pages.
 *   grpc       a unary call to a gRPC core server in this process (its own completion-queue
 *              thread, its own Unix socket, max message lengths raised on both ends) whose reply
 *              is size bytes of 1.0f: a preallocated, pre-faulted payload referenced, not
 *              copied, by the reply. "recv" is the call until the message is in (the channel is
 *              connected beforehand, which favours gRPC); "grpc" adds the same sum over the
 *              received slices as they are, no flattening copy (also in gRPC's favour).
 *
 * Map-only rounds rotate over the sizes (the map is microseconds of IPC: drift of a noisy
 * machine then falls on every size alike); then, size by size, rounds of map+read, gRPC and the
 * floor in turn. Each column is the median of its rounds (map over the map-only rounds and the
 * read rounds). Then every build is released. The sum is one loop over 16 float lanes in blocks
 * of 4096 floats (GCC vector extensions: SSE2, no -ffast-math needed), each block added into a
 * double: exact for ones, and memory-bound. From 8 MiB up it runs on every online CPU
 * (--read-threads), as a trainer's tensor library would read, on all three paths alike.
 *
 * A shard on huge pages (the daemon's --huge-pages, run-handout-bench.sh --huge-pages) has a
 * descriptor of its bytes rounded up to whole 2 MiB pages: it is mapped and unmapped at that
 * size (RankShard.allocation_bytes), and the "huge" column says which kind each size got.
 *
 * Goals: map time flat in the size (map at the largest size / map at the smallest <= 2),
 * grpc / (map+populate+read) >= 10 and (map+populate+read) / read floor <= 2.5 at the largest
 * size (--goal-ratio, --goal-floor; the huge-page goals are 20 and 1.3). --fill-compare: a
 * fresh fill on huge pages against normal pages (--goal-fill, 1.5). --check-goals: exit 1 when
 * one is missed.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "bench-util.h"
#include "familyd-v1-family.pb-c.h"
#include "familyd-v1-shard.pb-c.h"
#include "familyd-v1-values.pb-c.h"
#include "grpc-health-v1-health.pb-c.h"

#define MAX_SIZES 16
#define MIB (UINT64_C(1) << 20)
#define SUM_LANES 16
#define SUM_BLOCK_FLOATS 4096
#define SHARD_FRAME_MAX 65536u
#define BLOB_METHOD "/familydbench.Blob/Get"

enum {
        EXIT_BENCH_OK = 0,
        EXIT_BENCH_GOALS = 1,
        EXIT_BENCH_USAGE = 2,
        EXIT_BENCH_CALLS = 3,
};

typedef struct Options {
        const char *socket_path;
        const char *family;
        const char *parameter;
        const char *field;
        uint64_t sizes_mib[MAX_SIZES];
        size_t n_sizes;
        unsigned rounds;
        unsigned map_rounds;
        double goal_flat;
        double goal_ratio;
        double goal_floor; /* (map+populate+read) / read floor at the largest size, at most */
        double goal_fill;  /* --fill-compare: normal-page Build / huge-page Build, at least */
        uint64_t fill_compare_mib;
        bool check_goals;
        bool probe;
        bool populate;
        unsigned read_threads; /* the full read's threads, both paths alike; 0: online CPUs */
        unsigned call_timeout_ms;
} Options;

static Options opt = {
        .family = "blob",
        .parameter = "data",
        .field = "n",
        .sizes_mib = { 1, 64, 1024 },
        .n_sizes = 3,
        .rounds = 5,
        .map_rounds = 20,
        .goal_flat = 2.0,
        .goal_ratio = 10.0,
        .goal_floor = 2.5,
        .goal_fill = 1.5,
        .call_timeout_ms = 120000,
};

/* One round of the host mapping (measure_reads()), in its parts. */
typedef struct HostRound {
        uint64_t total_ns, populate_ns, read_ns;
        long populate_faults, read_faults;
} HostRound;

typedef struct Result {
        uint64_t size;
        double map_us;       /* median */
        double map_read_ms;  /* median: lazy mapping, every page faulted by the read */
        double map_pop_read_ms; /* median: populated mapping (libfamilyd's default), then read */
        bool huge;           /* the shard is on huge pages (its descriptor's st_blksize) */
        double grpc_recv_ms; /* median */
        double grpc_ms;      /* median */
        double floor_ms;     /* median: the sum alone, over resident memory */
        double host_ms;      /* median: a plain memfd of this host, mapped as the shard; 0: none */
        HostRound host_first; /* the host mapping's first round, in its parts */
} Result;

static double median_ns(uint64_t *v, size_t n) {
        if (n == 0)
                return NAN;
        qsort(v, n, sizeof(*v), cmp_u64);
        return n % 2 ? (double) v[n / 2] : ((double) v[n / 2 - 1] + (double) v[n / 2]) / 2.0;
}

/* ---- the sum ------------------------------------------------------------------------------ */

/* Four lanes of float32: GCC and clang vector extensions, plain SSE2 on x86-64. */
typedef float Lanes __attribute__((vector_size(16)));

/* Sums n whole float32 values at p (any alignment). */
static double sum_floats(const unsigned char *p, size_t n) {
        double total = 0;

        while (n > 0) {
                size_t block = n < SUM_BLOCK_FLOATS ? n : SUM_BLOCK_FLOATS;
                size_t full = block / SUM_LANES * SUM_LANES;
                Lanes acc[SUM_LANES / 4] = {};
                float tail = 0;

                for (size_t i = 0; i < full; i += SUM_LANES)
                        for (size_t j = 0; j < SUM_LANES / 4; j++) {
                                Lanes v;

                                memcpy(&v, p + (i + 4 * j) * sizeof(float), sizeof(v));
                                acc[j] += v;
                        }
                for (size_t i = full; i < block; i++) {
                        float v;

                        memcpy(&v, p + i * sizeof(float), sizeof(v));
                        tail += v;
                }
                for (size_t j = 0; j < SUM_LANES / 4; j++)
                        for (size_t k = 0; k < 4; k++)
                                total += acc[j][k];
                total += tail;
                p += block * sizeof(float);
                n -= block;
        }
        return total;
}

/* Sums a float32 stream that arrives in pieces of any length (gRPC slices). */
typedef struct StreamSum {
        unsigned char carry[sizeof(float)];
        size_t n_carry;
        double total;
} StreamSum;

static void stream_sum_add(StreamSum *s, const unsigned char *p, size_t len) {
        if (s->n_carry > 0) {
                size_t k = sizeof(float) - s->n_carry;

                if (k > len)
                        k = len;
                memcpy(s->carry + s->n_carry, p, k);
                s->n_carry += k;
                p += k;
                len -= k;
                if (s->n_carry < sizeof(float))
                        return;
                s->total += sum_floats(s->carry, 1);
                s->n_carry = 0;
        }
        s->total += sum_floats(p, len / sizeof(float));
        s->n_carry = len % sizeof(float);
        memcpy(s->carry, p + len - s->n_carry, s->n_carry);
}

/*
 * The full read as a trainer's tensor library does it: on every core. The bytes are a list of
 * pieces (one mapping, or the slices of a gRPC message); each thread sums a float-aligned
 * range of the whole stream, walking the pieces it overlaps, so a float split across two
 * slices is still read whole. Both paths use this, with the same thread count.
 */
typedef struct Piece {
        const unsigned char *p;
        size_t len;
} Piece;

typedef struct SumJob {
        const Piece *pieces;
        size_t n_pieces;
        size_t from, to; /* byte range of the stream, both multiples of sizeof(float) */
        StreamSum sum;
        pthread_t thread;
} SumJob;

/* Below this the threads cost more than they save. */
#define PARALLEL_SUM_MIN_BYTES (8u << 20)

static void *sum_job_run(void *userdata) {
        SumJob *j = userdata;
        size_t off = 0;

        for (size_t i = 0; i < j->n_pieces && off < j->to; i++) {
                size_t a = off, b = off + j->pieces[i].len;

                off = b;
                if (b <= j->from)
                        continue;
                size_t s = a < j->from ? j->from - a : 0;
                size_t e = (b > j->to ? j->to : b) - a;
                stream_sum_add(&j->sum, j->pieces[i].p + s, e - s);
        }
        return NULL;
}

static unsigned read_threads(void) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        if (opt.read_threads > 0)
                return opt.read_threads;
        return n > 0 ? (unsigned) n : 1;
}

/* The sum of the float32 stream; *ret_ok false when a float is left incomplete. */
static double parallel_sum(const Piece *pieces, size_t n_pieces, size_t total, bool *ret_ok) {
        unsigned n = total < PARALLEL_SUM_MIN_BYTES ? 1 : read_threads();
        size_t floats = total / sizeof(float);
        SumJob jobs[64];
        double sum = 0;

        if (n > 64)
                n = 64;
        for (unsigned t = 0; t < n; t++) {
                jobs[t] = (SumJob) {
                        .pieces = pieces,
                        .n_pieces = n_pieces,
                        .from = floats * t / n * sizeof(float),
                        .to = t + 1 == n ? total : floats * (t + 1) / n * sizeof(float),
                };
                if (t > 0 && pthread_create(&jobs[t].thread, NULL, sum_job_run, &jobs[t]) != 0)
                        sum_job_run(&jobs[t]), jobs[t].thread = 0;
        }
        sum_job_run(&jobs[0]);
        *ret_ok = true;
        for (unsigned t = 0; t < n; t++) {
                if (t > 0 && jobs[t].thread)
                        pthread_join(jobs[t].thread, NULL);
                sum += jobs[t].sum.total;
                if (jobs[t].sum.n_carry != 0 && t + 1 < n)
                        *ret_ok = false;
        }
        if (jobs[n - 1].sum.n_carry != 0)
                *ret_ok = false;
        return sum;
}

/* ---- gRPC client calls -------------------------------------------------------------------- */

static char last_error[512];

static grpc_channel *channel_new(const char *path, bool big) {
        grpc_channel_credentials *creds = grpc_insecure_credentials_create();
        grpc_arg args[2];
        grpc_channel_args channel_args = { .num_args = 0, .args = args };
        grpc_channel *ch;
        char target[4096];

        memset(args, 0, sizeof(args));
        if (big) {
                args[0].type = args[1].type = GRPC_ARG_INTEGER;
                args[0].key = (char *) GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
                args[1].key = (char *) GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
                args[0].value.integer = args[1].value.integer = -1;
                channel_args.num_args = 2;
        }
        snprintf(target, sizeof(target), "unix:%s", path);
        ch = grpc_channel_create(target, creds, &channel_args);
        grpc_channel_credentials_release(creds);
        return ch;
}

/* One unary call; the reply's byte buffer in *ret_recv (the caller destroys it). */
static int unary_call(grpc_channel *ch, grpc_completion_queue *cq, const char *method,
                      const void *req, size_t len, grpc_byte_buffer **ret_recv) {
        grpc_metadata_array initial_md, trailing_md;
        grpc_byte_buffer *send, *recv = NULL;
        grpc_status_code status = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_slice payload;
        grpc_op ops[6];
        grpc_call *call;
        grpc_event ev;
        int r = 0;

        call = grpc_channel_create_call(ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
                                        grpc_slice_from_static_string(method), NULL,
                                        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                     gpr_time_from_millis(opt.call_timeout_ms,
                                                                          GPR_TIMESPAN)),
                                        NULL);
        if (!call) {
                snprintf(last_error, sizeof(last_error), "%s: grpc_channel_create_call failed", method);
                return -ENOMEM;
        }
        payload = grpc_slice_from_copied_buffer(req, len);
        send = grpc_raw_byte_buffer_create(&payload, 1);
        grpc_slice_unref(payload);
        grpc_metadata_array_init(&initial_md);
        grpc_metadata_array_init(&trailing_md);

        memset(ops, 0, sizeof(ops));
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = send;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
        ops[4].op = GRPC_OP_RECV_MESSAGE;
        ops[4].data.recv_message.recv_message = &recv;
        ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
        ops[5].data.recv_status_on_client.status = &status;
        ops[5].data.recv_status_on_client.status_details = &details;

        if (grpc_call_start_batch(call, ops, 6, call, NULL) != GRPC_CALL_OK) {
                snprintf(last_error, sizeof(last_error), "%s: grpc_call_start_batch failed", method);
                r = -EIO;
                goto finish;
        }
        ev = grpc_completion_queue_pluck(cq, call, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
                snprintf(last_error, sizeof(last_error), "%s: batch failed", method);
                r = -EIO;
                goto finish;
        }
        if (status != GRPC_STATUS_OK) {
                char *text = grpc_slice_to_c_string(details);

                snprintf(last_error, sizeof(last_error), "%s: status %d: %s", method, (int) status, text);
                gpr_free(text);
                r = -EPROTO;
                goto finish;
        }
        if (!recv) {
                snprintf(last_error, sizeof(last_error), "%s: OK without a reply", method);
                r = -EBADMSG;
                goto finish;
        }
        *ret_recv = recv;
        recv = NULL;

finish:
        grpc_byte_buffer_destroy(send);
        if (recv)
                grpc_byte_buffer_destroy(recv);
        grpc_slice_unref(details);
        grpc_metadata_array_destroy(&initial_md);
        grpc_metadata_array_destroy(&trailing_md);
        grpc_call_unref(call);
        return r;
}

/* The reply flattened into one slice (small replies: protobuf messages). */
static int unary_call_flat(grpc_channel *ch, grpc_completion_queue *cq, const char *method,
                           const void *req, size_t len, grpc_slice *ret) {
        grpc_byte_buffer *recv = NULL;
        grpc_byte_buffer_reader reader;
        int r;

        r = unary_call(ch, cq, method, req, len, &recv);
        if (r < 0)
                return r;
        if (!grpc_byte_buffer_reader_init(&reader, recv)) {
                grpc_byte_buffer_destroy(recv);
                snprintf(last_error, sizeof(last_error), "%s: unreadable reply", method);
                return -EBADMSG;
        }
        *ret = grpc_byte_buffer_reader_readall(&reader);
        grpc_byte_buffer_reader_destroy(&reader);
        grpc_byte_buffer_destroy(recv);
        return 0;
}

/* ---- familyd: probe, Build, ReleaseBuild -------------------------------------------------- */

typedef struct Familyd {
        grpc_channel *channel;
        grpc_completion_queue *cq;
} Familyd;

static int familyd_probe(Familyd *f) {
        Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        Grpc__Health__V1__HealthCheckResponse *resp;
        uint8_t buf[64];
        grpc_slice reply;
        size_t len;
        int r;

        len = grpc__health__v1__health_check_request__pack(&req, buf);
        r = unary_call_flat(f->channel, f->cq, "/grpc.health.v1.Health/Check", buf, len, &reply);
        if (r < 0)
                return r;
        resp = grpc__health__v1__health_check_response__unpack(NULL, GRPC_SLICE_LENGTH(reply),
                                                               GRPC_SLICE_START_PTR(reply));
        grpc_slice_unref(reply);
        if (!resp)
                return -EBADMSG;
        r = resp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? 0 : -EAGAIN;
        grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
        return r;
}

typedef struct Built {
        char *build_id;
        char *token;
        char *shard_socket;
        uint64_t size_bytes;
        uint64_t alloc_bytes; /* the descriptor's: on huge pages, rounded up to whole pages */
        uint64_t build_ns;    /* the Build call, its fill of fresh pages included */
} Built;

static void built_done(Built *b) {
        free(b->build_id);
        free(b->token);
        free(b->shard_socket);
        memset(b, 0, sizeof(*b));
}

static int familyd_build(Familyd *f, uint64_t n_floats, bool private_build, Built *ret) {
        Familyd__V1__BuildRequest req = FAMILYD__V1__BUILD_REQUEST__INIT;
        Familyd__V1__Config config = FAMILYD__V1__CONFIG__INIT;
        Familyd__V1__Config__FieldsEntry entry = FAMILYD__V1__CONFIG__FIELDS_ENTRY__INIT;
        Familyd__V1__Config__FieldsEntry *entries[1] = { &entry };
        Familyd__V1__Value value = FAMILYD__V1__VALUE__INIT;
        Familyd__V1__MaterializeOptions mat = FAMILYD__V1__MATERIALIZE_OPTIONS__INIT;
        Familyd__V1__BuildResponse *resp;
        const Familyd__V1__RankShard *shard;
        uint8_t *buf;
        grpc_slice reply;
        size_t len;
        int r;

        value.kind_case = FAMILYD__V1__VALUE__KIND_INT_VALUE;
        value.int_value = (int64_t) n_floats;
        entry.key = (char *) opt.field;
        entry.value = &value;
        config.n_fields = 1;
        config.fields = entries;
        mat.enabled = true;
        mat.dtype = (char *) "float32";
        req.family = (char *) opt.family;
        req.config = &config;
        req.materialize = &mat;
        /* --fill-compare builds the same request twice: the second must fill, not share. */
        req.private_build = private_build;

        len = familyd__v1__build_request__get_packed_size(&req);
        buf = malloc(len + 1);
        if (!buf)
                return -ENOMEM;
        familyd__v1__build_request__pack(&req, buf);
        r = unary_call_flat(f->channel, f->cq, "/familyd.v1.FamilyService/Build", buf, len, &reply);
        free(buf);
        if (r < 0)
                return r;
        resp = familyd__v1__build_response__unpack(NULL, GRPC_SLICE_LENGTH(reply), GRPC_SLICE_START_PTR(reply));
        grpc_slice_unref(reply);
        if (!resp || !resp->build) {
                snprintf(last_error, sizeof(last_error), "undecodable BuildResponse");
                r = -EBADMSG;
                goto finish;
        }
        if (resp->build->n_shards != 1 || !resp->build->shards[0]->token[0]) {
                snprintf(last_error, sizeof(last_error),
                         "Build %s: expected one materialised rank with a token, got %zu ranks",
                         resp->build->build_id, resp->build->n_shards);
                r = -EBADMSG;
                goto finish;
        }
        shard = resp->build->shards[0];
        if (shard->size_bytes != n_floats * sizeof(float)) {
                snprintf(last_error, sizeof(last_error), "Build %s: shard of %" PRIu64 " bytes, expected %" PRIu64
                         " (is '%s' float32 of shape [%s]?)", resp->build->build_id, shard->size_bytes,
                         n_floats * sizeof(float), opt.parameter, opt.field);
                r = -EBADMSG;
                goto finish;
        }
        if (!resp->build->shard_socket[0]) {
                snprintf(last_error, sizeof(last_error), "Build %s: no shard_socket in the reply",
                         resp->build->build_id);
                r = -EBADMSG;
                goto finish;
        }
        ret->build_id = strdup(resp->build->build_id);
        ret->token = strdup(shard->token);
        ret->shard_socket = strdup(resp->build->shard_socket);
        ret->size_bytes = shard->size_bytes;
        ret->alloc_bytes = shard->allocation_bytes ? shard->allocation_bytes : shard->size_bytes;
        if (!ret->build_id || !ret->token || !ret->shard_socket) {
                built_done(ret);
                r = -ENOMEM;
        }
finish:
        if (resp)
                familyd__v1__build_response__free_unpacked(resp, NULL);
        return r;
}

static int familyd_release(Familyd *f, const char *build_id) {
        Familyd__V1__ReleaseBuildRequest req = FAMILYD__V1__RELEASE_BUILD_REQUEST__INIT;
        uint8_t buf[512];
        grpc_slice reply;
        size_t len;
        int r;

        req.build_id = (char *) build_id;
        if (familyd__v1__release_build_request__get_packed_size(&req) > sizeof(buf))
                return -E2BIG;
        len = familyd__v1__release_build_request__pack(&req, buf);
        r = unary_call_flat(f->channel, f->cq, "/familyd.v1.FamilyService/ReleaseBuild", buf, len, &reply);
        if (r >= 0)
                grpc_slice_unref(reply);
        return r;
}

/* ---- the shard socket --------------------------------------------------------------------- */

/*
 * Reads n bytes; descriptors that ride with them (SCM_RIGHTS) go to fds (at most max_fds, more
 * are closed), their count added to *n_fds.
 */
static int recv_full(int fd, void *buf, size_t n, int *fds, size_t max_fds, size_t *n_fds) {
        uint8_t *p = buf;

        while (n > 0) {
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * 4)];
                } control;
                struct iovec iov = { .iov_base = p, .iov_len = n };
                struct msghdr mh = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = &control,
                        .msg_controllen = sizeof(control),
                };
                ssize_t k = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);

                if (k < 0 && errno == EINTR)
                        continue;
                if (k < 0)
                        return -errno;
                for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
                        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                                continue;
                        size_t cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                        for (size_t i = 0; i < cnt; i++) {
                                int got;

                                memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                                if (*n_fds < max_fds)
                                        fds[(*n_fds)++] = got;
                                else
                                        close(got);
                        }
                }
                if (mh.msg_flags & MSG_CTRUNC)
                        return -EMSGSIZE;
                if (k == 0)
                        return -EPIPE;
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

/* connect, ShardFdRequest{token}, the reply and its descriptor: the fd in *ret_fd. */
static int shard_fetch(const char *socket_path, const char *token, uint64_t expect_size, int *ret_fd) {
        Familyd__V1__ShardFdRequest req = FAMILYD__V1__SHARD_FD_REQUEST__INIT;
        Familyd__V1__ShardFdReply *reply = NULL;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        uint8_t frame[4 + 1024], header[4], body[SHARD_FRAME_MAX];
        char *tokens[1] = { (char *) token };
        int fds[4], sock = -1, r;
        size_t n_fds = 0, len;
        uint32_t body_len;

        if (strlen(socket_path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, socket_path);
        req.n_tokens = 1;
        req.tokens = tokens;
        len = familyd__v1__shard_fd_request__get_packed_size(&req);
        if (len > sizeof(frame) - 4)
                return -E2BIG;
        familyd__v1__shard_fd_request__pack(&req, frame + 4);
        frame[0] = (uint8_t) len;
        frame[1] = (uint8_t) (len >> 8);
        frame[2] = (uint8_t) (len >> 16);
        frame[3] = (uint8_t) (len >> 24);

        sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (sock < 0)
                return -errno;
        if (connect(sock, (struct sockaddr *) &sa, sizeof(sa)) < 0) {
                r = -errno;
                snprintf(last_error, sizeof(last_error), "connect %s: %s", socket_path, strerror(-r));
                goto finish;
        }
        r = write_full(sock, frame, 4 + len);
        if (r < 0)
                goto finish;
        r = recv_full(sock, header, sizeof(header), fds, 4, &n_fds);
        if (r < 0)
                goto finish;
        body_len = (uint32_t) header[0] | (uint32_t) header[1] << 8 | (uint32_t) header[2] << 16 |
                   (uint32_t) header[3] << 24;
        if (body_len > sizeof(body)) {
                r = -EBADMSG;
                goto finish;
        }
        r = recv_full(sock, body, body_len, fds, 4, &n_fds);
        if (r < 0)
                goto finish;
        reply = familyd__v1__shard_fd_reply__unpack(NULL, body_len, body);
        if (!reply) {
                snprintf(last_error, sizeof(last_error), "undecodable ShardFdReply");
                r = -EBADMSG;
                goto finish;
        }
        if (reply->code != 0) {
                snprintf(last_error, sizeof(last_error), "shard socket: code %d: %s", reply->code, reply->message);
                r = -EPROTO;
                goto finish;
        }
        if (n_fds != 1 || reply->n_sizes != 1 || reply->sizes[0] != expect_size) {
                snprintf(last_error, sizeof(last_error), "shard socket: %zu descriptors, %zu sizes (%" PRIu64
                         "), expected 1 of %" PRIu64 " bytes", n_fds, reply->n_sizes,
                         reply->n_sizes ? reply->sizes[0] : 0, expect_size);
                r = -EBADMSG;
                goto finish;
        }
        *ret_fd = fds[0];
        n_fds = 0;
        r = 0;
finish:
        if (reply)
                familyd__v1__shard_fd_reply__free_unpacked(reply, NULL);
        for (size_t i = 0; i < n_fds; i++)
                close(fds[i]);
        close(sock);
        return r;
}

/*
 * Populating a mapping as libfamilyd does (familyd_shard_populate(), client/libfamilyd/shard.c): the
 * mapping's page tables filled up front by MADV_POPULATE_READ on up to 4 threads of at least
 * 64 MiB each, in whole 2 MiB pieces. The bench does not link libfamilyd: the same few lines.
 */
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define POPULATE_MAX_THREADS 4
#define POPULATE_BYTES_PER_THREAD (64u << 20)

typedef struct PopulateJob {
        unsigned char *p;
        size_t len;
        int r;
        pthread_t thread;
} PopulateJob;

static void *populate_job_run(void *userdata) {
        PopulateJob *j = userdata;
        j->r = j->len == 0 || madvise(j->p, j->len, MADV_POPULATE_READ) == 0 ? 0 : -errno;
        return NULL;
}

static int populate(void *p, size_t len) {
        PopulateJob jobs[POPULATE_MAX_THREADS] = {};
        size_t n = len / POPULATE_BYTES_PER_THREAD, per;
        int r = 0;

        n = n < 1 ? 1 : n > POPULATE_MAX_THREADS ? POPULATE_MAX_THREADS : n;
        if (n > read_threads())
                n = read_threads();
        per = (len / n + (2u << 20) - 1) & ~(size_t) ((2u << 20) - 1);
        for (size_t i = 0; i < n; i++) {
                size_t off = i * per < len ? i * per : len;
                jobs[i].p = (unsigned char *) p + off;
                jobs[i].len = len - off < per ? len - off : per;
                if (i > 0 && pthread_create(&jobs[i].thread, NULL, populate_job_run, &jobs[i]) != 0)
                        populate_job_run(&jobs[i]), jobs[i].thread = 0;
        }
        populate_job_run(&jobs[0]);
        for (size_t i = 0; i < n; i++) {
                if (i > 0 && jobs[i].thread)
                        pthread_join(jobs[i].thread, NULL);
                if (jobs[i].r < 0 && r == 0)
                        r = jobs[i].r;
        }
        return r;
}

/* The timed handout: fetch + mmap (+ populate) in *ret_map_ns; with read, the sum too, in
 * *ret_total_ns. The mapping is the descriptor's size (a hugetlb one unmaps whole pages). */
static int handout_once(const Built *b, bool read, bool pop, uint64_t *ret_map_ns,
                        uint64_t *ret_total_ns, uint64_t *ret_floor_ns) {
        uint64_t t0, t1, t2;
        void *p;
        int fd, r;

        t0 = now_ns();
        r = shard_fetch(b->shard_socket, b->token, b->alloc_bytes, &fd);
        if (r < 0)
                return r;
        p = mmap(NULL, b->alloc_bytes, PROT_READ, MAP_SHARED | (opt.populate ? MAP_POPULATE : 0), fd, 0);
        if (p != MAP_FAILED && pop) {
                /* As libfamilyd: shmem THP (advise) folios map huge where the mapping asks. */
                (void) madvise(p, b->alloc_bytes, MADV_HUGEPAGE);
                r = populate(p, b->alloc_bytes);
                if (r < 0)
                        snprintf(last_error, sizeof(last_error), "populate: %s", strerror(-r));
        }
        t1 = now_ns();
        if (p == MAP_FAILED) {
                r = -errno;
                snprintf(last_error, sizeof(last_error), "mmap of %" PRIu64 " bytes: %s", b->alloc_bytes,
                         strerror(-r));
                close(fd);
                return r;
        }
        close(fd);
        *ret_map_ns = t1 - t0;
        if (read && r >= 0) {
                Piece whole = { .p = p, .len = b->size_bytes };
                bool ok;
                double s = parallel_sum(&whole, 1, b->size_bytes, &ok);

                t2 = now_ns();
                *ret_total_ns = t2 - t0;
                if (s != (double) (b->size_bytes / sizeof(float))) {
                        snprintf(last_error, sizeof(last_error), "mapped sum %.1f, expected %" PRIu64, s,
                                 b->size_bytes / sizeof(float));
                        r = -EBADMSG;
                }
                /* The floor: the same read again, every page resident in this mapping. */
                if (ret_floor_ns && r >= 0) {
                        t2 = now_ns();
                        (void) parallel_sum(&whole, 1, b->size_bytes, &ok);
                        *ret_floor_ns = now_ns() - t2;
                }
        }
        munmap(p, b->alloc_bytes);
        return r;
}

/* A plain memfd of size bytes of 1.0f, resident, as a shard is (THP asked as the daemon does). */
static int host_blob_new(size_t size, int *ret_fd) {
        float *w;
        int fd, r = 0;

        fd = memfd_create("handout-bench-host", MFD_CLOEXEC);
        if (fd < 0)
                return -errno;
        if (ftruncate(fd, (off_t) size) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        w = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (w == MAP_FAILED) {
                r = -errno;
                close(fd);
                return r;
        }
        (void) madvise(w, size, MADV_HUGEPAGE);
        for (size_t i = 0; i < size / sizeof(float); i++)
                w[i] = 1.0f;
        munmap(w, size);
        *ret_fd = fd;
        return 0;
}

/* Minor page faults of this process so far (every thread). */
static long minor_faults(void) {
        struct rusage u;

        return getrusage(RUSAGE_SELF, &u) == 0 ? u.ru_minflt : 0;
}

/*
 * The host mapping: the memfd mapped, populated and read as handout_once() does a shard. Its
 * parts are kept apart (the first round's): the populate with its page faults, and the first
 * read with its own, which are none once populated: what the first read costs over the floor
 * then is the new page-table entries' first use, not faults.
 */
static int host_once(int fd, size_t size, HostRound *ret) {
        uint64_t t0 = now_ns(), t1, t2;
        long f0 = minor_faults(), f1;
        Piece whole;
        bool ok;
        void *p;
        int r;

        p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
                return -errno;
        (void) madvise(p, size, MADV_HUGEPAGE);
        r = populate(p, size);
        t1 = now_ns();
        f1 = minor_faults();
        whole = (Piece) { .p = p, .len = size };
        if (r >= 0 && parallel_sum(&whole, 1, size, &ok) != (double) (size / sizeof(float))) {
                snprintf(last_error, sizeof(last_error), "host mapping: wrong sum");
                r = -EBADMSG;
        }
        t2 = now_ns();
        *ret = (HostRound) { .total_ns = t2 - t0, .populate_ns = t1 - t0, .read_ns = t2 - t1,
                             .populate_faults = f1 - f0, .read_faults = minor_faults() - f1 };
        munmap(p, size);
        return r;
}

/* ---- the gRPC baseline: a server in this process ------------------------------------------ */

typedef struct BlobCall {
        grpc_call *call;
        grpc_call_details details;
        grpc_metadata_array request_md;
        grpc_byte_buffer *request;
        grpc_byte_buffer *response;
        int cancelled;
        int stage; /* 0 waiting for a call, 1 reading its request, 2 replying */
} BlobCall;

typedef struct BlobServer {
        grpc_server *server;
        grpc_completion_queue *cq;
        pthread_t thread;
        bool thread_started;
        grpc_slice payload; /* refcounted, pointing at data */
        void *data;
        size_t size;
        char path[108];
        char dir[64];
} BlobServer;

#define TAG_SHUTDOWN ((void *) 1)

static void payload_keep(void *p) {
        (void) p; /* the payload outlives the server; blob_server_done frees it */
}

static int blob_request(BlobServer *s) {
        BlobCall *c = calloc(1, sizeof(*c));

        if (!c)
                return -ENOMEM;
        grpc_call_details_init(&c->details);
        grpc_metadata_array_init(&c->request_md);
        if (grpc_server_request_call(s->server, &c->call, &c->details, &c->request_md, s->cq, s->cq, c) !=
            GRPC_CALL_OK) {
                grpc_call_details_destroy(&c->details);
                grpc_metadata_array_destroy(&c->request_md);
                free(c);
                return -EIO;
        }
        return 0;
}

static void blob_call_free(BlobCall *c) {
        if (c->call)
                grpc_call_unref(c->call);
        if (c->request)
                grpc_byte_buffer_destroy(c->request);
        if (c->response)
                grpc_byte_buffer_destroy(c->response);
        grpc_call_details_destroy(&c->details);
        grpc_metadata_array_destroy(&c->request_md);
        free(c);
}

static void blob_step(BlobServer *s, BlobCall *c, bool ok) {
        grpc_op ops[3];
        uint64_t want = 0;

        memset(ops, 0, sizeof(ops));
        switch (c->stage) {
        case 0: /* a new call: read its request */
                if (!ok) {
                        blob_call_free(c);
                        return;
                }
                (void) blob_request(s);
                c->stage = 1;
                ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
                ops[1].op = GRPC_OP_RECV_MESSAGE;
                ops[1].data.recv_message.recv_message = &c->request;
                if (grpc_call_start_batch(c->call, ops, 2, c, NULL) != GRPC_CALL_OK)
                        blob_call_free(c);
                return;
        case 1: { /* the request: 8 bytes, the size wanted, little-endian */
                grpc_status_code code = GRPC_STATUS_OK;
                grpc_slice sub;

                if (!ok) {
                        blob_call_free(c);
                        return;
                }
                if (c->request) {
                        grpc_byte_buffer_reader reader;

                        if (grpc_byte_buffer_reader_init(&reader, c->request)) {
                                grpc_slice all = grpc_byte_buffer_reader_readall(&reader);

                                if (GRPC_SLICE_LENGTH(all) == 8)
                                        for (int i = 7; i >= 0; i--)
                                                want = want << 8 | GRPC_SLICE_START_PTR(all)[i];
                                else
                                        code = GRPC_STATUS_INVALID_ARGUMENT;
                                grpc_slice_unref(all);
                                grpc_byte_buffer_reader_destroy(&reader);
                        }
                }
                if (want > s->size)
                        code = GRPC_STATUS_OUT_OF_RANGE;
                c->stage = 2;
                sub = grpc_slice_sub(s->payload, 0, code == GRPC_STATUS_OK ? (size_t) want : 0);
                c->response = grpc_raw_byte_buffer_create(&sub, 1);
                grpc_slice_unref(sub);
                ops[0].op = GRPC_OP_SEND_MESSAGE;
                ops[0].data.send_message.send_message = c->response;
                ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
                ops[1].data.send_status_from_server.status = code;
                ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
                ops[2].data.recv_close_on_server.cancelled = &c->cancelled;
                if (grpc_call_start_batch(c->call, ops, 3, c, NULL) != GRPC_CALL_OK)
                        blob_call_free(c);
                return;
        }
        default:
                blob_call_free(c);
                return;
        }
}

static void *blob_server_main(void *userdata) {
        BlobServer *s = userdata;

        for (;;) {
                grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);

                if (ev.type == GRPC_QUEUE_SHUTDOWN)
                        break;
                if (ev.type != GRPC_OP_COMPLETE)
                        continue;
                if (ev.tag == TAG_SHUTDOWN) {
                        grpc_completion_queue_shutdown(s->cq);
                        continue;
                }
                blob_step(s, ev.tag, ev.success);
        }
        return NULL;
}

static int blob_server_start(BlobServer *s, size_t size) {
        grpc_server_credentials *creds;
        grpc_arg args[2];
        grpc_channel_args server_args = { .num_args = 2, .args = args };
        char addr[128];
        float one = 1.0f;

        memset(s, 0, sizeof(*s));
        s->size = size;
        s->data = mmap(NULL, size > 0 ? size : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (s->data == MAP_FAILED) {
                s->data = NULL;
                return -errno;
        }
        for (size_t i = 0; i < size / sizeof(float); i++) /* touches every page, too */
                memcpy((char *) s->data + i * sizeof(float), &one, sizeof(one));
        s->payload = grpc_slice_new(s->data, size, payload_keep);

        snprintf(s->dir, sizeof(s->dir), "/tmp/handout-bench-XXXXXX");
        if (!mkdtemp(s->dir))
                return -errno;
        snprintf(s->path, sizeof(s->path), "%s/blob.sock", s->dir);
        snprintf(addr, sizeof(addr), "unix:%s", s->path);

        memset(args, 0, sizeof(args));
        args[0].type = args[1].type = GRPC_ARG_INTEGER;
        args[0].key = (char *) GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
        args[1].key = (char *) GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
        args[0].value.integer = args[1].value.integer = -1;
        s->server = grpc_server_create(&server_args, NULL);
        s->cq = grpc_completion_queue_create_for_next(NULL);
        if (!s->server || !s->cq)
                return -ENOMEM;
        grpc_server_register_completion_queue(s->server, s->cq, NULL);
        creds = grpc_insecure_server_credentials_create();
        if (!grpc_server_add_http2_port(s->server, addr, creds)) {
                grpc_server_credentials_release(creds);
                snprintf(last_error, sizeof(last_error), "cannot listen on %s", addr);
                return -EADDRNOTAVAIL;
        }
        grpc_server_credentials_release(creds);
        grpc_server_start(s->server);
        if (blob_request(s) < 0)
                return -EIO;
        if (pthread_create(&s->thread, NULL, blob_server_main, s) != 0)
                return -EAGAIN;
        s->thread_started = true;
        return 0;
}

static void blob_server_done(BlobServer *s) {
        if (s->server) {
                grpc_server_shutdown_and_notify(s->server, s->cq, TAG_SHUTDOWN);
                grpc_server_cancel_all_calls(s->server);
        } else if (s->cq) {
                grpc_completion_queue_shutdown(s->cq);
        }
        if (s->thread_started)
                pthread_join(s->thread, NULL);
        else if (s->cq) {
                if (s->server)
                        grpc_completion_queue_shutdown(s->cq);
                while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
                       GRPC_QUEUE_SHUTDOWN)
                        ;
        }
        if (s->server)
                grpc_server_destroy(s->server);
        if (s->cq)
                grpc_completion_queue_destroy(s->cq);
        if (s->data) {
                grpc_slice_unref(s->payload);
                munmap(s->data, s->size > 0 ? s->size : 1);
        }
        if (s->path[0])
                unlink(s->path);
        if (s->dir[0])
                rmdir(s->dir);
}

/* One timed gRPC round: call -> message in (*ret_recv_ns) -> summed (*ret_total_ns). */
static int grpc_once(grpc_channel *ch, grpc_completion_queue *cq, uint64_t size, uint64_t *ret_recv_ns,
                     uint64_t *ret_total_ns) {
        grpc_byte_buffer *recv = NULL;
        grpc_byte_buffer_reader reader;
        StreamSum sum = {};
        uint8_t req[8];
        uint64_t t0, t1, t2, got = 0;
        grpc_slice slice;
        int r;

        for (int i = 0; i < 8; i++)
                req[i] = (uint8_t) (size >> (8 * i));
        t0 = now_ns();
        r = unary_call(ch, cq, BLOB_METHOD, req, sizeof(req), &recv);
        if (r < 0)
                return r;
        t1 = now_ns();
        if (!grpc_byte_buffer_reader_init(&reader, recv)) {
                grpc_byte_buffer_destroy(recv);
                return -EBADMSG;
        }
        /* The slices as they are (no flattening copy), then the same read as the mapping's. */
        size_t n_slices = 0, allocated = 0;
        grpc_slice *slices = NULL;
        Piece *pieces = NULL;
        bool ok = true;
        while (grpc_byte_buffer_reader_next(&reader, &slice)) {
                if (n_slices == allocated) {
                        allocated = allocated ? 2 * allocated : 256;
                        slices = realloc(slices, allocated * sizeof(*slices));
                        pieces = realloc(pieces, allocated * sizeof(*pieces));
                        if (!slices || !pieces)
                                abort();
                }
                slices[n_slices] = slice;
                got += GRPC_SLICE_LENGTH(slice);
                n_slices++;
        }
        /* Only now: a small slice keeps its bytes inline, in the grpc_slice itself. */
        for (size_t i = 0; i < n_slices; i++)
                pieces[i] = (Piece) { GRPC_SLICE_START_PTR(slices[i]), GRPC_SLICE_LENGTH(slices[i]) };
        sum.total = parallel_sum(pieces, n_slices, got, &ok);
        t2 = now_ns();
        for (size_t i = 0; i < n_slices; i++)
                grpc_slice_unref(slices[i]);
        free(slices);
        free(pieces);
        grpc_byte_buffer_reader_destroy(&reader);
        grpc_byte_buffer_destroy(recv);
        *ret_recv_ns = t1 - t0;
        *ret_total_ns = t2 - t0;
        if (got != size || !ok || sum.total != (double) (size / sizeof(float))) {
                snprintf(last_error, sizeof(last_error), "gRPC reply of %" PRIu64 " bytes summing to %.1f, "
                         "expected %" PRIu64 " bytes, %" PRIu64, got, sum.total, size, size / sizeof(float));
                return -EBADMSG;
        }
        return 0;
}

/* ---- the measurement --------------------------------------------------------------------- */

/*
 * Every size is built first (untimed) and held, so that the map-only rounds can rotate over the
 * sizes: the map column is microseconds of IPC, and a noisy machine's drift then falls on every
 * size alike. The read rounds (map+read, then gRPC, in turn) go size by size. All builds are
 * released at the end, even after a failure.
 */
/* One size's read rounds: map+read lazy, map+read populated, gRPC, the floor, and (on pages
 * that are not hugetlb) the host mapping, in turn. */
static int measure_reads(const Built *b, grpc_channel *blob_ch, grpc_completion_queue *blob_cq,
                         const BlobServer *blob, uint64_t *map_ns, Result *res) {
        uint64_t *lazy_ns, *pop_ns, *recv_ns, *grpc_ns, *floor_ns, *host_ns, scratch;
        int r = 0, host_fd = -1;

        lazy_ns = calloc(opt.rounds, sizeof(uint64_t));
        pop_ns = calloc(opt.rounds, sizeof(uint64_t));
        recv_ns = calloc(opt.rounds, sizeof(uint64_t));
        grpc_ns = calloc(opt.rounds, sizeof(uint64_t));
        floor_ns = calloc(opt.rounds, sizeof(uint64_t));
        host_ns = calloc(opt.rounds, sizeof(uint64_t));
        if (!lazy_ns || !pop_ns || !recv_ns || !grpc_ns || !floor_ns || !host_ns)
                r = -ENOMEM;
        if (r >= 0 && !res->huge)
                r = host_blob_new(b->size_bytes, &host_fd);
        for (unsigned k = 0; r >= 0 && k < opt.rounds; k++) {
                r = handout_once(b, true, false, &map_ns[k], &lazy_ns[k], NULL);
                if (r >= 0)
                        r = handout_once(b, true, true, &scratch, &pop_ns[k], &floor_ns[k]);
                if (r >= 0)
                        r = grpc_once(blob_ch, blob_cq, res->size, &recv_ns[k], &grpc_ns[k]);
                if (r >= 0 && host_fd >= 0) {
                        HostRound h;

                        r = host_once(host_fd, b->size_bytes, &h);
                        host_ns[k] = h.total_ns;
                        if (k == 0)
                                res->host_first = h;
                }
        }
        if (r >= 0) {
                res->map_read_ms = median_ns(lazy_ns, opt.rounds) / 1e6;
                res->map_pop_read_ms = median_ns(pop_ns, opt.rounds) / 1e6;
                res->grpc_recv_ms = median_ns(recv_ns, opt.rounds) / 1e6;
                res->grpc_ms = median_ns(grpc_ns, opt.rounds) / 1e6;
                res->floor_ms = median_ns(floor_ns, opt.rounds) / 1e6;
                res->host_ms = host_fd >= 0 ? median_ns(host_ns, opt.rounds) / 1e6 : 0;
        }
        if (host_fd >= 0)
                close(host_fd);
        free(host_ns);
        free(lazy_ns);
        free(pop_ns);
        free(recv_ns);
        free(grpc_ns);
        free(floor_ns);
        return r;
}

/* Whether b's descriptor is a hugetlb file (its block size is the huge page size). */
static bool built_on_huge_pages(const Built *b) {
        struct stat st;
        int fd;

        if (shard_fetch(b->shard_socket, b->token, b->alloc_bytes, &fd) < 0)
                return false;
        bool huge = fstat(fd, &st) == 0 && st.st_blksize > 4096;
        close(fd);
        return huge;
}

/*
 * Every size is built first (untimed) and held, so that the map-only rounds can rotate over the
 * sizes: the map column is microseconds of IPC, and a noisy machine's drift then falls on every
 * size alike. The read rounds go size by size. All builds are released at the end, even after
 * a failure.
 */
static int measure_all(Familyd *f, grpc_channel *blob_ch, grpc_completion_queue *blob_cq, const BlobServer *blob,
                       Result *res) {
        size_t n = opt.n_sizes, per_map = opt.rounds + opt.map_rounds;
        uint64_t *map_ns, scratch;
        Built built[MAX_SIZES] = {};
        int r = 0;

        map_ns = calloc(n * per_map, sizeof(uint64_t));
        if (!map_ns)
                return -ENOMEM;

        for (size_t i = 0; r >= 0 && i < n; i++) {
                res[i].size = opt.sizes_mib[i] * MIB;
                r = familyd_build(f, res[i].size / sizeof(float), false, &built[i]);
                if (r < 0)
                        fprintf(stderr, "handout-bench: Build of %" PRIu64 " MiB failed\n", opt.sizes_mib[i]);
                else
                        res[i].huge = built_on_huge_pages(&built[i]);
        }
        if (r < 0)
                goto finish;

        /* Untimed warm-up of both paths (the shard socket, its thread, the gRPC channel). */
        for (size_t i = 0; r >= 0 && i < n; i++)
                for (int k = 0; r >= 0 && k < 3; k++)
                        r = handout_once(&built[i], false, false, &scratch, &scratch, NULL);
        for (int k = 0; r >= 0 && k < 3; k++)
                r = grpc_once(blob_ch, blob_cq, MIB, &scratch, &scratch);

        for (unsigned k = 0; r >= 0 && k < opt.map_rounds; k++)
                for (size_t i = 0; r >= 0 && i < n; i++)
                        r = handout_once(&built[i], false, false, &map_ns[i * per_map + k], &scratch, NULL);

        for (size_t i = 0; r >= 0 && i < n; i++) {
                r = measure_reads(&built[i], blob_ch, blob_cq, blob,
                                  &map_ns[i * per_map + opt.map_rounds], &res[i]);
                if (r < 0) {
                        fprintf(stderr, "handout-bench: %" PRIu64 " MiB failed\n", opt.sizes_mib[i]);
                        break;
                }
                res[i].map_us = median_ns(&map_ns[i * per_map], per_map) / 1e3;
                printf("%" PRIu64 " MiB%s: map %.1f us, map+read %.3f ms, map+populate+read %.3f ms, "
                       "read floor %.3f ms, grpc recv %.3f ms, grpc %.3f ms, host mapping %.3f ms\n",
                       opt.sizes_mib[i], res[i].huge ? " (huge pages)" : "", res[i].map_us,
                       res[i].map_read_ms, res[i].map_pop_read_ms, res[i].floor_ms,
                       res[i].grpc_recv_ms, res[i].grpc_ms, res[i].host_ms);
                fflush(stdout);
        }

finish:
        for (size_t i = 0; i < n; i++)
                if (built[i].build_id) {
                        int q = familyd_release(f, built[i].build_id);
                        if (q < 0 && r >= 0)
                                r = q;
                        built_done(&built[i]);
                }
        free(map_ns);
        return r;
}

/*
 * --fill-compare MIB: the same Build of MIB twice in a row, both held, each timed (the call,
 * its fill of fresh pages included). Run with just enough huge pages reserved for one of them
 * (run-handout-bench.sh --huge-pages), the first goes on huge pages and the second, finding
 * none free, on normal pages (--huge-pages auto): one daemon, one run. Prints both and the
 * ratio; with both kinds present, the goal normal/huge >= --goal-fill.
 */
static int fill_compare(Familyd *f, bool *ret_met) {
        Built b[2] = {};
        bool huge[2] = {};
        double ms[2] = {};
        int r = 0;

        for (int k = 0; r >= 0 && k < 2; k++) {
                uint64_t t0 = now_ns();
                r = familyd_build(f, opt.fill_compare_mib * MIB / sizeof(float), true, &b[k]);
                ms[k] = (double) (now_ns() - t0) / 1e6;
                if (r >= 0)
                        huge[k] = built_on_huge_pages(&b[k]);
        }
        for (int k = 0; k < 2; k++)
                if (b[k].build_id) {
                        int q = familyd_release(f, b[k].build_id);
                        if (q < 0 && r >= 0)
                                r = q;
                        built_done(&b[k]);
                }
        if (r < 0)
                return r;
        for (int k = 0; k < 2; k++)
                printf("fill %" PRIu64 " MiB fresh (Build) #%d on %s pages: %.1f ms, %.2f GB/s\n",
                       opt.fill_compare_mib, k + 1, huge[k] ? "huge" : "normal", ms[k],
                       (double) opt.fill_compare_mib * MIB / (ms[k] * 1e6));
        if (huge[0] == huge[1]) {
                printf("fill compare: both Builds on %s pages (reserve huge pages for exactly one)\n",
                       huge[0] ? "huge" : "normal");
                return 0;
        }
        double ratio = huge[0] ? ms[1] / ms[0] : ms[0] / ms[1];
        *ret_met = ratio >= opt.goal_fill;
        printf("goal fill normal/huge @%" PRIu64 "MiB >= %.2f: %.3f %s\n", opt.fill_compare_mib,
               opt.goal_fill, ratio, *ret_met ? "met" : "NOT MET");
        return 0;
}

/* ---- output ------------------------------------------------------------------------------- */

static bool print_report(const Result *res, size_t n) {
        const Result *small = &res[0], *large = &res[0];
        double flat, ratio, floor_ratio;
        bool ok_flat, ok_ratio, ok_floor;

        for (size_t i = 0; i < n; i++) {
                if (res[i].size < small->size)
                        small = &res[i];
                if (res[i].size > large->size)
                        large = &res[i];
        }

        printf("\n%9s %5s %10s %13s %13s %14s %13s %10s %11s\n", "size_mib", "huge", "map_us",
               "map+read_ms", "m+pop+r_ms", "read_floor_ms", "grpc_recv_ms", "grpc_ms", "grpc/(m+r)");
        for (size_t i = 0; i < n; i++)
                printf("%9" PRIu64 " %5s %10.1f %13.3f %13.3f %14.3f %13.3f %10.3f %11.2f\n",
                       res[i].size / MIB, res[i].huge ? "yes" : "no", res[i].map_us,
                       res[i].map_read_ms, res[i].map_pop_read_ms, res[i].floor_ms,
                       res[i].grpc_recv_ms, res[i].grpc_ms, res[i].grpc_ms / res[i].map_pop_read_ms);
        printf("\n");
        /* map+read here is the populated path: what libfamilyd and the Python client do. */
        for (size_t i = 0; i < n; i++)
                printf("ratio grpc/(map+read) @%" PRIu64 "MiB %.3f recv/(map+read) %.3f read GB/s map %.2f grpc %.2f\n",
                       res[i].size / MIB, res[i].grpc_ms / res[i].map_pop_read_ms,
                       res[i].grpc_recv_ms / res[i].map_pop_read_ms,
                       (double) res[i].size / (res[i].map_pop_read_ms * 1e6),
                       (double) res[i].size / (res[i].grpc_ms * 1e6));
        for (size_t i = 0; i < n; i++)
                printf("ratio over the read floor @%" PRIu64 "MiB (%s pages) lazy %.3f populated %.3f\n",
                       res[i].size / MIB, res[i].huge ? "huge" : "4 KiB",
                       res[i].map_read_ms / res[i].floor_ms, res[i].map_pop_read_ms / res[i].floor_ms);
        for (size_t i = 0; i < n; i++)
                if (res[i].host_ms > 0)
                        printf("host mapping @%" PRIu64 "MiB (a plain memfd, mapped, populated and read the same way): "
                               "%.3f over the read floor; familyd populated / host mapping %.3f\n",
                               res[i].size / MIB, res[i].host_ms / res[i].floor_ms,
                               res[i].map_pop_read_ms / res[i].host_ms);
        for (size_t i = 0; i < n; i++)
                if (res[i].host_ms > 0)
                        printf("host mapping @%" PRIu64 "MiB in parts: populate %.3f ms (%ld page faults), "
                               "first read %.3f ms (%ld page faults), read floor %.3f ms\n",
                               res[i].size / MIB, res[i].host_first.populate_ns / 1e6,
                               res[i].host_first.populate_faults, res[i].host_first.read_ns / 1e6,
                               res[i].host_first.read_faults, res[i].floor_ms);

        flat = large->map_us / small->map_us;
        ratio = large->grpc_ms / large->map_pop_read_ms;
        floor_ratio = large->map_pop_read_ms / large->floor_ms;
        ok_flat = flat <= opt.goal_flat;
        ok_ratio = ratio >= opt.goal_ratio;
        ok_floor = floor_ratio <= opt.goal_floor;
        printf("\ngoals:\n");
        printf("goal map flat map@%" PRIu64 "MiB/map@%" PRIu64 "MiB <= %.2f: %.3f %s\n", large->size / MIB,
               small->size / MIB, opt.goal_flat, flat, ok_flat ? "met" : "NOT MET");
        printf("goal grpc/(map+read) @%" PRIu64 "MiB >= %.2f: %.3f %s\n", large->size / MIB, opt.goal_ratio,
               ratio, ok_ratio ? "met" : "NOT MET");
        printf("goal (map+populate+read)/floor @%" PRIu64 "MiB <= %.2f: %.3f %s\n", large->size / MIB,
               opt.goal_floor, floor_ratio, ok_floor ? "met" : "NOT MET");
        printf("goals %s\n", ok_flat && ok_ratio && ok_floor ? "met" : "NOT MET");
        return ok_flat && ok_ratio && ok_floor;
}

/* ---- main --------------------------------------------------------------------------------- */

static void usage(FILE *out) {
        fprintf(out,
                "Usage: handout-bench --socket PATH [OPTIONS]\n"
                "\n"
                "Times a materialised shard from the Build reply to a mapped tensor (shard socket +\n"
                "mmap) and to its first full read (sum), against the same bytes in a gRPC response\n"
                "from a server in this process. Starts no daemon: see run-handout-bench.sh.\n"
                "\n"
                "  --socket PATH       familyd's API socket (required)\n"
                "  --sizes LIST        shard sizes in MiB, comma-separated (default 1,64,1024)\n"
                "  --rounds N          timed rounds per size, median taken (default 5)\n"
                "  --map-rounds N      extra map-only rounds per size (default 20)\n"
                "  --family NAME       family to build (default blob)\n"
                "  --parameter NAME    its one float32 parameter, constant 1.0 (default data)\n"
                "  --field NAME        the int config field that is its length (default n)\n"
                "  --quick             --sizes 1,16 --rounds 3 --map-rounds 10\n"
                "  --goal-flat X       goal: map at the largest / map at the smallest <= X (default 2)\n"
                "  --goal-ratio X      goal: grpc / (map+populate+read) at the largest >= X (default 10)\n"
                "  --goal-floor X      goal: (map+populate+read) / read floor at the largest <= X\n"
                "                      (default 2.5)\n"
                "  --fill-compare MIB  first, Build MIB twice, both held, and time each: with huge\n"
                "                      pages reserved for one only, huge against normal pages\n"
                "  --goal-fill X       goal: normal-page / huge-page Build time >= X (default 1.5)\n"
                "  --populate          mmap with MAP_POPULATE: the page faults move into \"map\"\n"
                "                      (what a trainer could do; map is then not flat by design)\n"
                "  --read-threads N    threads of the full read, on both paths alike (default:\n"
                "                      every online CPU, as a trainer's torch.sum would)\n"
                "  --check-goals       exit 1 when a goal is not met\n"
                "  --probe             one Health/Check: exit 0 when SERVING, 3 otherwise\n"
                "\n"
                "Exit: 0 done, 1 goals not met (with --check-goals), 2 usage, 3 a call or check failed.\n");
}

static int parse_u64(const char *s, uint64_t *ret) {
        char *end;
        unsigned long long v;

        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno != 0 || end == s || *end != '\0' || s[0] == '-')
                return -EINVAL;
        *ret = v;
        return 0;
}

static int parse_sizes(const char *s) {
        char *copy = strdup(s), *save = NULL, *tok;
        int r = 0;

        if (!copy)
                return -ENOMEM;
        opt.n_sizes = 0;
        for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                uint64_t v;

                /* gRPC frames a message with a 32-bit length: stay below 4 GiB. */
                if (opt.n_sizes >= MAX_SIZES || parse_u64(tok, &v) < 0 || v == 0 || v >= 4096) {
                        r = -EINVAL;
                        break;
                }
                opt.sizes_mib[opt.n_sizes++] = v;
        }
        free(copy);
        return r < 0 || opt.n_sizes == 0 ? -EINVAL : 0;
}

enum {
        ARG_SOCKET = 0x100, ARG_SIZES, ARG_ROUNDS, ARG_MAP_ROUNDS, ARG_FAMILY, ARG_PARAMETER,
        ARG_FIELD, ARG_QUICK, ARG_GOAL_FLAT, ARG_GOAL_RATIO, ARG_CHECK, ARG_PROBE, ARG_POPULATE,
        ARG_READ_THREADS, ARG_GOAL_FLOOR, ARG_FILL_COMPARE, ARG_GOAL_FILL, ARG_HELP,
};

/* The options that take a number: -EINVAL for one out of range or not a number. */
static int set_number(int c, const char *arg) {
        uint64_t v;

        switch (c) {
        case ARG_ROUNDS:
                if (parse_u64(arg, &v) < 0 || v == 0 || v > 10000)
                        return -EINVAL;
                opt.rounds = (unsigned) v;
                return 0;
        case ARG_MAP_ROUNDS:
                if (parse_u64(arg, &v) < 0 || v > 100000)
                        return -EINVAL;
                opt.map_rounds = (unsigned) v;
                return 0;
        case ARG_FILL_COMPARE:
                if (parse_u64(arg, &v) < 0 || v == 0 || v >= 4096)
                        return -EINVAL;
                opt.fill_compare_mib = v;
                return 0;
        case ARG_GOAL_FLAT:
                return parse_double(arg, &opt.goal_flat);
        case ARG_GOAL_RATIO:
                return parse_double(arg, &opt.goal_ratio);
        case ARG_GOAL_FLOOR:
                return parse_double(arg, &opt.goal_floor);
        case ARG_GOAL_FILL:
                return parse_double(arg, &opt.goal_fill);
        default:
                return -EINVAL;
        }
}

static int parse_args(int argc, char **argv) {
        static const struct option options[] = {
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "sizes", required_argument, NULL, ARG_SIZES },
                { "rounds", required_argument, NULL, ARG_ROUNDS },
                { "map-rounds", required_argument, NULL, ARG_MAP_ROUNDS },
                { "family", required_argument, NULL, ARG_FAMILY },
                { "parameter", required_argument, NULL, ARG_PARAMETER },
                { "field", required_argument, NULL, ARG_FIELD },
                { "quick", no_argument, NULL, ARG_QUICK },
                { "goal-flat", required_argument, NULL, ARG_GOAL_FLAT },
                { "goal-ratio", required_argument, NULL, ARG_GOAL_RATIO },
                { "check-goals", no_argument, NULL, ARG_CHECK },
                { "probe", no_argument, NULL, ARG_PROBE },
                { "populate", no_argument, NULL, ARG_POPULATE },
                { "read-threads", required_argument, NULL, ARG_READ_THREADS },
                { "goal-floor", required_argument, NULL, ARG_GOAL_FLOOR },
                { "fill-compare", required_argument, NULL, ARG_FILL_COMPARE },
                { "goal-fill", required_argument, NULL, ARG_GOAL_FILL },
                { "help", no_argument, NULL, ARG_HELP },
                {}
        };
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case ARG_SOCKET:
                        opt.socket_path = optarg;
                        break;
                case ARG_SIZES:
                        if (parse_sizes(optarg) < 0)
                                goto bad;
                        break;
                case ARG_ROUNDS:
                case ARG_MAP_ROUNDS:
                case ARG_FILL_COMPARE:
                case ARG_GOAL_FLAT:
                case ARG_GOAL_RATIO:
                case ARG_GOAL_FLOOR:
                case ARG_GOAL_FILL:
                        if (set_number(c, optarg) < 0)
                                goto bad;
                        break;
                case ARG_FAMILY:
                        opt.family = optarg;
                        break;
                case ARG_PARAMETER:
                        opt.parameter = optarg;
                        break;
                case ARG_FIELD:
                        opt.field = optarg;
                        break;
                case ARG_QUICK:
                        opt.sizes_mib[0] = 1;
                        opt.sizes_mib[1] = 16;
                        opt.n_sizes = 2;
                        opt.rounds = 3;
                        opt.map_rounds = 10;
                        break;
                case ARG_CHECK:
                        opt.check_goals = true;
                        break;
                case ARG_PROBE:
                        opt.probe = true;
                        break;
                case ARG_READ_THREADS: {
                        char *end;
                        unsigned long threads = strtoul(optarg, &end, 10);
                        if (*end || threads < 1 || threads > 64)
                                goto bad;
                        opt.read_threads = (unsigned) threads;
                        break;
                }
                case ARG_POPULATE:
                        opt.populate = true;
                        break;
                case 'h':
                case ARG_HELP:
                        usage(stdout);
                        exit(EXIT_BENCH_OK);
                default:
                        usage(stderr);
                        return -EINVAL;
                }
        }
        if (optind < argc) {
                fprintf(stderr, "handout-bench: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!opt.socket_path) {
                fprintf(stderr, "handout-bench: --socket is required\n");
                return -EINVAL;
        }
        return 0;

bad:
        fprintf(stderr, "handout-bench: invalid value '%s' for --%s\n", optarg, options[c - ARG_SOCKET].name);
        return -EINVAL;
}

int main(int argc, char **argv) {
        Result results[MAX_SIZES] = {};
        BlobServer blob = {};
        Familyd f = {};
        grpc_channel *blob_ch = NULL;
        grpc_completion_queue *blob_cq = NULL;
        uint64_t max_size = 0;
        bool met = true;
        int r;

        if (parse_args(argc, argv) < 0)
                return EXIT_BENCH_USAGE;

        grpc_init();
        f.channel = channel_new(opt.socket_path, false);
        f.cq = grpc_completion_queue_create_for_pluck(NULL);

        if (opt.probe) {
                opt.call_timeout_ms = 1000;
                r = familyd_probe(&f);
                goto finish;
        }

        for (size_t i = 0; i < opt.n_sizes; i++)
                if (opt.sizes_mib[i] * MIB > max_size)
                        max_size = opt.sizes_mib[i] * MIB;

        printf("handout-bench: socket %s, family %s (%s: float32 [%s] of 1.0), sizes", opt.socket_path,
               opt.family, opt.parameter, opt.field);
        for (size_t i = 0; i < opt.n_sizes; i++)
                printf("%s%" PRIu64, i ? "," : " ", opt.sizes_mib[i]);
        printf(" MiB, %u rounds (+%u map-only), medians%s; full reads on %u thread%s (8 MiB and up)\n",
               opt.rounds, opt.map_rounds, opt.populate ? ", mmap with MAP_POPULATE" : "",
               read_threads(), read_threads() == 1 ? "" : "s");
        printf("map: connect + ShardFdRequest + fd + mmap; map+read: and a sum of every float; grpc: unary call "
               "of the same bytes from a gRPC core server in this process + the same sum over its slices\n");
        fflush(stdout);

        r = familyd_probe(&f);
        if (r < 0) {
                fprintf(stderr, "handout-bench: familyd not SERVING: %s\n", last_error[0] ? last_error : strerror(-r));
                goto finish;
        }
        r = blob_server_start(&blob, max_size);
        if (r < 0) {
                fprintf(stderr, "handout-bench: gRPC baseline server: %s\n", last_error[0] ? last_error : strerror(-r));
                goto finish;
        }
        blob_ch = channel_new(blob.path, true);
        blob_cq = grpc_completion_queue_create_for_pluck(NULL);

        if (opt.fill_compare_mib > 0) {
                r = fill_compare(&f, &met);
                if (r < 0) {
                        fprintf(stderr, "handout-bench: fill compare: %s\n", last_error[0] ? last_error : strerror(-r));
                        goto finish;
                }
        }
        r = measure_all(&f, blob_ch, blob_cq, &blob, results);
        if (r < 0) {
                fprintf(stderr, "handout-bench: %s\n", last_error[0] ? last_error : strerror(-r));
                goto finish;
        }
        met = print_report(results, opt.n_sizes) && met;

finish:
        if (blob_ch)
                grpc_channel_destroy(blob_ch);
        if (blob_cq) {
                grpc_completion_queue_shutdown(blob_cq);
                grpc_completion_queue_destroy(blob_cq);
        }
        blob_server_done(&blob);
        grpc_channel_destroy(f.channel);
        grpc_completion_queue_shutdown(f.cq);
        grpc_completion_queue_destroy(f.cq);
        grpc_shutdown();
        if (r < 0)
                return EXIT_BENCH_CALLS;
        return opt.check_goals && !met ? EXIT_BENCH_GOALS : EXIT_BENCH_OK;
}

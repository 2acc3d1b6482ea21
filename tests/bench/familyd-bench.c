/* familyd-bench: Resolve against an empty call and a raw Unix-socket floor, side by side. */

/*
 * DESIGN
 *
 * The bench starts nothing: it talks to a running familyd (run-bench.sh starts one). Three
 * kinds of call are measured in one process, interleaved so that drift of a noisy machine
 * falls on all of them alike:
 *
 *   resolve  familyd.v1.FamilyService/Resolve of a family with ep_size set (what trainers do)
 *   empty    grpc.health.v1.Health/Check on the same server and client stack
 *   raw      a 64-byte ping-pong over a Unix stream socket pair with an echo thread in this
 *            process: the floor, no gRPC at all
 *
 * Latency: N sequential calls of each kind on one channel, in blocks rotating over the kinds;
 * p50 and p99. Throughput: 1, 4, 16 concurrent clients, each a thread with its own channel
 * (local subchannel pool, so its own connection) and completion queue, for a fixed time split
 * into rounds rotating over the kinds. Every reply is decoded and checked as a real client
 * would. Threads: the main thread, one per concurrent client, one echo thread per raw pair,
 * and gRPC's own.
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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
#include "grpc-health-v1-health.pb-c.h"

#define RAW_MESSAGE_SIZE 64
#define MAX_CONCURRENCY 256
#define MAX_LEVELS 16
#define LATENCY_BLOCKS 10
#define THROUGHPUT_ROUNDS 3

enum {
        EXIT_BENCH_OK = 0,
        EXIT_BENCH_GOALS = 1,
        EXIT_BENCH_USAGE = 2,
        EXIT_BENCH_CALLS = 3,
};

typedef enum Kind {
        KIND_RESOLVE,
        KIND_EMPTY,
        KIND_RAW,
        _KIND_MAX,
} Kind;

static const char *const kind_names[_KIND_MAX] = { "resolve", "empty", "raw" };

typedef struct Options {
        const char *socket_path;
        const char *family;
        const char *expect_variant;
        int64_t ep_size;
        size_t calls;
        size_t warmup;
        double duration_s;
        size_t levels[MAX_LEVELS];
        size_t n_levels;
        double goal_p50;
        double goal_throughput;
        bool check_goals;
        bool probe;
        unsigned call_timeout_ms;
} Options;

static Options opt = {
        .family = "grouped_experts",
        .expect_variant = "grouped_ep",
        .ep_size = 4,
        .calls = 20000,
        .warmup = 500,
        .duration_s = 2.0,
        .levels = { 1, 4, 16 },
        .n_levels = 3,
        .goal_p50 = 1.10,
        .goal_throughput = 0.90,
        .call_timeout_ms = 10000,
};

/* One client: a gRPC channel with its completion queue, and a raw socket pair with its echo. */
typedef struct Client {
        grpc_channel *channel;
        grpc_completion_queue *cq;
        int raw_fd;
        int echo_fd;
        pthread_t echo_thread;
        bool echo_started;
        /* pre-encoded requests */
        uint8_t *resolve_req;
        size_t resolve_len;
        uint8_t *health_req;
        size_t health_len;
        /* per run */
        Kind kind;
        uint64_t count;
        uint64_t errors;
        uint64_t t_start_ns;
        uint64_t t_end_ns;
        char last_error[256];
} Client;

static atomic_bool stop_flag;
static pthread_barrier_t start_barrier;

static double percentile_us(uint64_t *v, size_t n, double p) {
        size_t i;

        if (n == 0)
                return NAN;
        i = (size_t) ceil(p * (double) n);
        if (i > 0)
                i--;
        if (i >= n)
                i = n - 1;
        return (double) v[i] / 1000.0;
}

/* ---- raw floor ---------------------------------------------------------------------------- */

static int read_full(int fd, void *buf, size_t n) {
        uint8_t *p = buf;

        while (n > 0) {
                ssize_t k = read(fd, p, n);
                if (k < 0 && errno == EINTR)
                        continue;
                if (k <= 0)
                        return k == 0 ? -EPIPE : -errno;
                p += k;
                n -= (size_t) k;
        }
        return 0;
}

static void *echo_main(void *userdata) {
        int fd = *(int *) userdata;
        uint8_t buf[RAW_MESSAGE_SIZE];

        while (read_full(fd, buf, sizeof(buf)) == 0)
                if (write_full(fd, buf, sizeof(buf)) < 0)
                        break;
        return NULL;
}

static int raw_call(Client *c) {
        uint8_t buf[RAW_MESSAGE_SIZE];
        int r;

        memset(buf, (int) (c->count & 0xff), sizeof(buf));
        r = write_full(c->raw_fd, buf, sizeof(buf));
        if (r < 0)
                return r;
        r = read_full(c->raw_fd, buf, sizeof(buf));
        if (r < 0)
                return r;
        return buf[RAW_MESSAGE_SIZE - 1] == (uint8_t) (c->count & 0xff) ? 0 : -EBADMSG;
}

/* ---- gRPC calls --------------------------------------------------------------------------- */

static int unary_call(Client *c, const char *method, const uint8_t *req, size_t len,
                      grpc_slice *ret_reply) {
        grpc_metadata_array initial_md, trailing_md;
        grpc_byte_buffer *send = NULL, *recv = NULL;
        grpc_status_code status = GRPC_STATUS_UNKNOWN;
        grpc_slice details = grpc_empty_slice();
        grpc_slice payload, method_slice;
        grpc_op ops[6];
        grpc_call *call;
        grpc_event ev;
        int r = 0;

        method_slice = grpc_slice_from_static_string(method);
        call = grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, c->cq,
                                        method_slice, NULL,
                                        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                                     gpr_time_from_millis(opt.call_timeout_ms,
                                                                          GPR_TIMESPAN)),
                                        NULL);
        if (!call) {
                snprintf(c->last_error, sizeof(c->last_error), "grpc_channel_create_call failed");
                return -ENOMEM;
        }

        payload = grpc_slice_from_copied_buffer((const char *) req, len);
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
                snprintf(c->last_error, sizeof(c->last_error), "grpc_call_start_batch failed");
                r = -EIO;
                goto finish;
        }
        ev = grpc_completion_queue_pluck(c->cq, call, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
                snprintf(c->last_error, sizeof(c->last_error), "batch failed");
                r = -EIO;
                goto finish;
        }
        if (status != GRPC_STATUS_OK) {
                char *text = grpc_slice_to_c_string(details);

                snprintf(c->last_error, sizeof(c->last_error), "%s: status %d: %s", method,
                         (int) status, text);
                gpr_free(text);
                r = -EPROTO;
                goto finish;
        }
        if (!recv) {
                snprintf(c->last_error, sizeof(c->last_error), "%s: OK without a reply", method);
                r = -EBADMSG;
                goto finish;
        }
        {
                grpc_byte_buffer_reader reader;

                if (!grpc_byte_buffer_reader_init(&reader, recv)) {
                        r = -EBADMSG;
                        goto finish;
                }
                *ret_reply = grpc_byte_buffer_reader_readall(&reader);
                grpc_byte_buffer_reader_destroy(&reader);
        }

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

static int resolve_call(Client *c) {
        Familyd__V1__ResolveResponse *resp;
        grpc_slice reply;
        int r;

        r = unary_call(c, "/familyd.v1.FamilyService/Resolve", c->resolve_req, c->resolve_len, &reply);
        if (r < 0)
                return r;
        resp = familyd__v1__resolve_response__unpack(NULL, GRPC_SLICE_LENGTH(reply),
                                                     GRPC_SLICE_START_PTR(reply));
        grpc_slice_unref(reply);
        if (!resp) {
                snprintf(c->last_error, sizeof(c->last_error), "undecodable ResolveResponse");
                return -EBADMSG;
        }
        if (!resp->resolved || strcmp(resp->resolved->variant, opt.expect_variant) != 0) {
                snprintf(c->last_error, sizeof(c->last_error), "Resolve gave variant '%s', expected '%s'",
                         resp->resolved ? resp->resolved->variant : "(none)", opt.expect_variant);
                r = -EBADMSG;
        }
        familyd__v1__resolve_response__free_unpacked(resp, NULL);
        return r;
}

static int empty_call(Client *c) {
        Grpc__Health__V1__HealthCheckResponse *resp;
        grpc_slice reply;
        int r;

        r = unary_call(c, "/grpc.health.v1.Health/Check", c->health_req, c->health_len, &reply);
        if (r < 0)
                return r;
        resp = grpc__health__v1__health_check_response__unpack(NULL, GRPC_SLICE_LENGTH(reply),
                                                               GRPC_SLICE_START_PTR(reply));
        grpc_slice_unref(reply);
        if (!resp) {
                snprintf(c->last_error, sizeof(c->last_error), "undecodable HealthCheckResponse");
                return -EBADMSG;
        }
        if (resp->status != GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING) {
                snprintf(c->last_error, sizeof(c->last_error), "health status %d", (int) resp->status);
                r = -EBADMSG;
        }
        grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
        return r;
}

static int one_call(Client *c, Kind k) {
        switch (k) {
        case KIND_RESOLVE:
                return resolve_call(c);
        case KIND_EMPTY:
                return empty_call(c);
        case KIND_RAW:
                return raw_call(c);
        default:
                return -EINVAL;
        }
}

/* ---- clients ------------------------------------------------------------------------------ */

static int client_init(Client *c) {
        Familyd__V1__ResolveRequest rreq = FAMILYD__V1__RESOLVE_REQUEST__INIT;
        Familyd__V1__JobContext ctx = FAMILYD__V1__JOB_CONTEXT__INIT;
        Grpc__Health__V1__HealthCheckRequest hreq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
        grpc_arg args[1];
        grpc_channel_args channel_args;
        grpc_channel_credentials *creds;
        char target[4096];
        int fds[2];

        memset(c, 0, sizeof(*c));
        c->raw_fd = c->echo_fd = -1;

        rreq.family = (char *) opt.family;
        if (opt.ep_size > 0) {
                ctx._ep_size_case = FAMILYD__V1__JOB_CONTEXT___EP_SIZE_EP_SIZE;
                ctx.ep_size = opt.ep_size;
        }
        rreq.context = &ctx;
        c->resolve_len = familyd__v1__resolve_request__get_packed_size(&rreq);
        c->resolve_req = malloc(c->resolve_len + 1);
        c->health_len = grpc__health__v1__health_check_request__get_packed_size(&hreq);
        c->health_req = malloc(c->health_len + 1);
        if (!c->resolve_req || !c->health_req)
                return -ENOMEM;
        familyd__v1__resolve_request__pack(&rreq, c->resolve_req);
        grpc__health__v1__health_check_request__pack(&hreq, c->health_req);

        /* Each client its own connection: channels with equal args would share a subchannel. */
        memset(args, 0, sizeof(args));
        args[0].type = GRPC_ARG_INTEGER;
        args[0].key = (char *) GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
        args[0].value.integer = 1;
        channel_args.num_args = 1;
        channel_args.args = args;
        snprintf(target, sizeof(target), "unix:%s", opt.socket_path);
        creds = grpc_insecure_credentials_create();
        c->channel = grpc_channel_create(target, creds, &channel_args);
        grpc_channel_credentials_release(creds);
        c->cq = grpc_completion_queue_create_for_pluck(NULL);
        if (!c->channel || !c->cq)
                return -ENOMEM;

        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) < 0)
                return -errno;
        c->raw_fd = fds[0];
        c->echo_fd = fds[1];
        if (pthread_create(&c->echo_thread, NULL, echo_main, &c->echo_fd) != 0)
                return -EAGAIN;
        c->echo_started = true;
        return 0;
}

static void client_done(Client *c) {
        grpc_event ev;

        if (c->raw_fd >= 0)
                (void) shutdown(c->raw_fd, SHUT_RDWR);
        if (c->echo_started)
                (void) pthread_join(c->echo_thread, NULL);
        if (c->raw_fd >= 0)
                close(c->raw_fd);
        if (c->echo_fd >= 0)
                close(c->echo_fd);
        if (c->channel)
                grpc_channel_destroy(c->channel);
        if (c->cq) {
                grpc_completion_queue_shutdown(c->cq);
                do
                        ev = grpc_completion_queue_pluck(c->cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
                while (ev.type != GRPC_QUEUE_SHUTDOWN);
                grpc_completion_queue_destroy(c->cq);
        }
        free(c->resolve_req);
        free(c->health_req);
}

static int client_warmup(Client *c, size_t n) {
        for (size_t i = 0; i < n; i++)
                for (int k = 0; k < _KIND_MAX; k++) {
                        int r = one_call(c, (Kind) k);
                        if (r < 0) {
                                fprintf(stderr, "familyd-bench: warm-up %s call failed: %s\n",
                                        kind_names[k], c->last_error[0] ? c->last_error : strerror(-r));
                                return r;
                        }
                        c->count++;
                }
        c->count = 0;
        return 0;
}

/* ---- latency ------------------------------------------------------------------------------ */

typedef struct Result {
        double p50_us;
        double p99_us;
        double mean_us;
        double throughput[MAX_LEVELS];
} Result;

static int measure_latency(Client *c, Result results[_KIND_MAX]) {
        uint64_t *samples[_KIND_MAX] = {};
        size_t n[_KIND_MAX] = {};
        int r = 0;

        for (int k = 0; k < _KIND_MAX; k++) {
                samples[k] = calloc(opt.calls, sizeof(uint64_t));
                if (!samples[k]) {
                        r = -ENOMEM;
                        goto finish;
                }
        }

        for (size_t b = 0; b < LATENCY_BLOCKS; b++) {
                size_t lo = opt.calls * b / LATENCY_BLOCKS, hi = opt.calls * (b + 1) / LATENCY_BLOCKS;

                for (int k = 0; k < _KIND_MAX; k++)
                        for (size_t i = lo; i < hi; i++) {
                                uint64_t t0 = now_ns();

                                r = one_call(c, (Kind) k);
                                if (r < 0) {
                                        fprintf(stderr, "familyd-bench: %s call failed: %s\n", kind_names[k],
                                                c->last_error[0] ? c->last_error : strerror(-r));
                                        goto finish;
                                }
                                samples[k][n[k]++] = now_ns() - t0;
                                c->count++;
                        }
        }

        for (int k = 0; k < _KIND_MAX; k++) {
                double sum = 0;

                for (size_t i = 0; i < n[k]; i++)
                        sum += (double) samples[k][i];
                qsort(samples[k], n[k], sizeof(uint64_t), cmp_u64);
                results[k].p50_us = percentile_us(samples[k], n[k], 0.50);
                results[k].p99_us = percentile_us(samples[k], n[k], 0.99);
                results[k].mean_us = n[k] ? sum / (double) n[k] / 1000.0 : NAN;
        }

finish:
        for (int k = 0; k < _KIND_MAX; k++)
                free(samples[k]);
        return r;
}

/* ---- throughput --------------------------------------------------------------------------- */

static void *worker_main(void *userdata) {
        Client *c = userdata;

        c->count = c->errors = 0;
        (void) pthread_barrier_wait(&start_barrier);
        c->t_start_ns = now_ns();
        while (!atomic_load_explicit(&stop_flag, memory_order_relaxed)) {
                if (one_call(c, c->kind) < 0) {
                        c->errors++;
                        break;
                }
                c->count++;
        }
        c->t_end_ns = now_ns();
        return NULL;
}

/* Runs every client on kind k for seconds; returns calls and the span in *ret_ns. */
static int run_concurrent(Client *clients, size_t n, Kind k, double seconds, uint64_t *ret_calls,
                          uint64_t *ret_ns) {
        pthread_t threads[MAX_CONCURRENCY];
        struct timespec ts;
        uint64_t calls = 0, t_start = UINT64_MAX, t_end = 0;
        int r = 0;

        atomic_store(&stop_flag, false);
        if (pthread_barrier_init(&start_barrier, NULL, (unsigned) n + 1) != 0)
                return -EAGAIN;
        for (size_t i = 0; i < n; i++) {
                clients[i].kind = k;
                if (pthread_create(&threads[i], NULL, worker_main, &clients[i]) != 0) {
                        fprintf(stderr, "familyd-bench: cannot start thread\n");
                        abort();   /* the barrier would never open */
                }
        }
        (void) pthread_barrier_wait(&start_barrier);
        ts.tv_sec = (time_t) seconds;
        ts.tv_nsec = (long) ((seconds - (double) ts.tv_sec) * 1e9);
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
                ;
        atomic_store(&stop_flag, true);
        for (size_t i = 0; i < n; i++) {
                (void) pthread_join(threads[i], NULL);
                calls += clients[i].count;
                if (clients[i].t_start_ns < t_start)
                        t_start = clients[i].t_start_ns;
                if (clients[i].t_end_ns > t_end)
                        t_end = clients[i].t_end_ns;
                if (clients[i].errors > 0) {
                        fprintf(stderr, "familyd-bench: %s client %zu failed: %s\n", kind_names[k], i,
                                clients[i].last_error[0] ? clients[i].last_error : "I/O error");
                        r = -EIO;
                }
        }
        (void) pthread_barrier_destroy(&start_barrier);
        *ret_calls = calls;
        *ret_ns = t_end > t_start ? t_end - t_start : 1;
        return r;
}

static int measure_throughput(size_t level_index, Result results[_KIND_MAX]) {
        size_t n = opt.levels[level_index];
        Client *clients;
        uint64_t calls[_KIND_MAX] = {}, ns[_KIND_MAX] = {};
        int r = 0;

        clients = calloc(n, sizeof(Client));
        if (!clients)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                r = client_init(&clients[i]);
                if (r < 0) {
                        fprintf(stderr, "familyd-bench: client setup failed: %s\n", strerror(-r));
                        n = i + 1;
                        goto finish;
                }
                r = client_warmup(&clients[i], 20);
                if (r < 0) {
                        n = i + 1;
                        goto finish;
                }
        }

        for (int round = 0; round < THROUGHPUT_ROUNDS; round++)
                for (int k = 0; k < _KIND_MAX; k++) {
                        uint64_t c, t;

                        r = run_concurrent(clients, n, (Kind) k, opt.duration_s / THROUGHPUT_ROUNDS, &c, &t);
                        if (r < 0)
                                goto finish;
                        calls[k] += c;
                        ns[k] += t;
                }
        for (int k = 0; k < _KIND_MAX; k++)
                results[k].throughput[level_index] = ns[k] ? (double) calls[k] * 1e9 / (double) ns[k] : 0;

finish:
        for (size_t i = 0; i < n; i++)
                client_done(&clients[i]);
        free(clients);
        return r;
}

/* ---- output ------------------------------------------------------------------------------- */

static bool print_report(const Result res[_KIND_MAX]) {
        const Result *rv = &res[KIND_RESOLVE], *em = &res[KIND_EMPTY], *raw = &res[KIND_RAW];
        bool met = true;
        char head[64];

        printf("\n%-10s %10s %10s %10s", "kind", "p50_us", "p99_us", "mean_us");
        for (size_t l = 0; l < opt.n_levels; l++) {
                snprintf(head, sizeof(head), "calls/s@%zu", opt.levels[l]);
                printf(" %13s", head);
        }
        printf("\n");
        for (int k = 0; k < _KIND_MAX; k++) {
                printf("%-10s %10.1f %10.1f %10.1f", kind_names[k], res[k].p50_us, res[k].p99_us,
                       res[k].mean_us);
                for (size_t l = 0; l < opt.n_levels; l++)
                        printf(" %13.0f", res[k].throughput[l]);
                printf("\n");
        }

        printf("\n");
        for (int base = KIND_EMPTY; base <= KIND_RAW; base++) {
                const Result *b = &res[base];

                printf("ratio resolve/%-5s p50 %.3f p99 %.3f", kind_names[base],
                       rv->p50_us / b->p50_us, rv->p99_us / b->p99_us);
                for (size_t l = 0; l < opt.n_levels; l++)
                        printf(" throughput@%zu %.3f", opt.levels[l], rv->throughput[l] / b->throughput[l]);
                printf("\n");
        }
        (void) raw;

        printf("\ngoals (resolve against the empty call on the same server and client):\n");
        {
                double ratio = rv->p50_us / em->p50_us;
                bool ok = ratio <= opt.goal_p50;

                met = met && ok;
                printf("goal p50 resolve/empty <= %.2f: %.3f %s\n", opt.goal_p50, ratio, ok ? "met" : "NOT MET");
        }
        for (size_t l = 0; l < opt.n_levels; l++) {
                double ratio = rv->throughput[l] / em->throughput[l];
                bool ok = ratio >= opt.goal_throughput;

                met = met && ok;
                printf("goal throughput@%zu resolve/empty >= %.2f: %.3f %s\n", opt.levels[l],
                       opt.goal_throughput, ratio, ok ? "met" : "NOT MET");
        }
        printf("goals %s\n", met ? "met" : "NOT MET");
        return met;
}

/* ---- main --------------------------------------------------------------------------------- */

static void usage(FILE *f) {
        fprintf(f,
                "Usage: familyd-bench --socket PATH [OPTIONS]\n"
                "\n"
                "Measures Resolve against an empty call (grpc.health.v1.Health/Check) on the same\n"
                "familyd and client, and against a raw 64-byte Unix-socket ping-pong (the floor).\n"
                "Starts nothing: see tests/bench/run-bench.sh.\n"
                "\n"
                "  --socket PATH          familyd's API socket (required)\n"
                "  --calls N              sequential calls per kind for latency (default 20000)\n"
                "  --duration SECONDS     per kind and concurrency level for throughput (default 2)\n"
                "  --concurrency LIST     client counts, comma-separated (default 1,4,16)\n"
                "  --family NAME          family to resolve (default grouped_experts)\n"
                "  --ep-size N            context ep_size, 0 for none (default 4)\n"
                "  --expect-variant NAME  variant every Resolve must answer (default grouped_ep)\n"
                "  --warmup N             warm-up rounds before latency (default 500)\n"
                "  --quick                --calls 2000 --duration 0.3 --warmup 50\n"
                "  --goal-p50 X           goal: p50(resolve)/p50(empty) <= X (default 1.10)\n"
                "  --goal-throughput X    goal: calls/s ratio >= X at each level (default 0.90)\n"
                "  --check-goals          exit 1 when a goal is not met\n"
                "  --probe                one Health/Check: exit 0 when SERVING, 3 otherwise\n"
                "\n"
                "Exit: 0 done, 1 goals not met (with --check-goals), 2 usage, 3 a call failed.\n");
}

static int parse_size(const char *s, size_t *ret) {
        char *end;
        unsigned long long v;

        errno = 0;
        v = strtoull(s, &end, 10);
        if (errno != 0 || end == s || *end != '\0' || s[0] == '-')
                return -EINVAL;
        *ret = (size_t) v;
        return 0;
}

static int parse_levels(const char *s) {
        char *copy = strdup(s), *save = NULL, *tok;
        int r = 0;

        if (!copy)
                return -ENOMEM;
        opt.n_levels = 0;
        for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                size_t v;

                if (opt.n_levels >= MAX_LEVELS || parse_size(tok, &v) < 0 || v == 0 || v > MAX_CONCURRENCY) {
                        r = -EINVAL;
                        break;
                }
                opt.levels[opt.n_levels++] = v;
        }
        free(copy);
        return r < 0 || opt.n_levels == 0 ? -EINVAL : 0;
}

static int parse_args(int argc, char **argv) {
        enum {
                ARG_SOCKET = 0x100, ARG_CALLS, ARG_DURATION, ARG_CONCURRENCY, ARG_FAMILY, ARG_EP,
                ARG_VARIANT, ARG_WARMUP, ARG_QUICK, ARG_GOAL_P50, ARG_GOAL_TP, ARG_CHECK, ARG_PROBE, ARG_HELP,
        };
        static const struct option options[] = {
                { "socket", required_argument, NULL, ARG_SOCKET },
                { "calls", required_argument, NULL, ARG_CALLS },
                { "duration", required_argument, NULL, ARG_DURATION },
                { "concurrency", required_argument, NULL, ARG_CONCURRENCY },
                { "family", required_argument, NULL, ARG_FAMILY },
                { "ep-size", required_argument, NULL, ARG_EP },
                { "expect-variant", required_argument, NULL, ARG_VARIANT },
                { "warmup", required_argument, NULL, ARG_WARMUP },
                { "quick", no_argument, NULL, ARG_QUICK },
                { "goal-p50", required_argument, NULL, ARG_GOAL_P50 },
                { "goal-throughput", required_argument, NULL, ARG_GOAL_TP },
                { "check-goals", no_argument, NULL, ARG_CHECK },
                { "probe", no_argument, NULL, ARG_PROBE },
                { "help", no_argument, NULL, ARG_HELP },
                {}
        };
        size_t v;
        int c;

        while ((c = getopt_long(argc, argv, "h", options, NULL)) >= 0) {
                switch (c) {
                case ARG_SOCKET:
                        opt.socket_path = optarg;
                        break;
                case ARG_CALLS:
                        if (parse_size(optarg, &opt.calls) < 0 || opt.calls < LATENCY_BLOCKS)
                                goto bad;
                        break;
                case ARG_DURATION:
                        if (parse_double(optarg, &opt.duration_s) < 0 || opt.duration_s <= 0)
                                goto bad;
                        break;
                case ARG_CONCURRENCY:
                        if (parse_levels(optarg) < 0)
                                goto bad;
                        break;
                case ARG_FAMILY:
                        opt.family = optarg;
                        break;
                case ARG_EP:
                        if (parse_size(optarg, &v) < 0)
                                goto bad;
                        opt.ep_size = (int64_t) v;
                        break;
                case ARG_VARIANT:
                        opt.expect_variant = optarg;
                        break;
                case ARG_WARMUP:
                        if (parse_size(optarg, &opt.warmup) < 0)
                                goto bad;
                        break;
                case ARG_QUICK:
                        opt.calls = 2000;
                        opt.duration_s = 0.3;
                        opt.warmup = 50;
                        break;
                case ARG_GOAL_P50:
                        if (parse_double(optarg, &opt.goal_p50) < 0)
                                goto bad;
                        break;
                case ARG_GOAL_TP:
                        if (parse_double(optarg, &opt.goal_throughput) < 0)
                                goto bad;
                        break;
                case ARG_CHECK:
                        opt.check_goals = true;
                        break;
                case ARG_PROBE:
                        opt.probe = true;
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
                fprintf(stderr, "familyd-bench: unexpected argument '%s'\n", argv[optind]);
                return -EINVAL;
        }
        if (!opt.socket_path) {
                fprintf(stderr, "familyd-bench: --socket is required\n");
                return -EINVAL;
        }
        return 0;

bad:
        fprintf(stderr, "familyd-bench: invalid value '%s' for --%s\n", optarg, options[c - ARG_SOCKET].name);
        return -EINVAL;
}

int main(int argc, char **argv) {
        Result results[_KIND_MAX] = {};
        Client main_client;
        bool met;
        int r;

        if (parse_args(argc, argv) < 0)
                return EXIT_BENCH_USAGE;

        grpc_init();

        if (opt.probe) {
                opt.call_timeout_ms = 1000;
                r = client_init(&main_client);
                if (r >= 0)
                        r = empty_call(&main_client);
                client_done(&main_client);
                grpc_shutdown();
                return r < 0 ? EXIT_BENCH_CALLS : EXIT_BENCH_OK;
        }

        printf("familyd-bench: socket %s, Resolve %s ep_size=%" PRId64 " -> %s\n", opt.socket_path,
               opt.family, opt.ep_size, opt.expect_variant);
        printf("latency: %zu sequential calls per kind, %d interleaved blocks; throughput: %.2f s per kind "
               "and level, %d rounds\n", opt.calls, LATENCY_BLOCKS, opt.duration_s, THROUGHPUT_ROUNDS);
        fflush(stdout);

        r = client_init(&main_client);
        if (r < 0) {
                fprintf(stderr, "familyd-bench: client setup failed: %s\n", strerror(-r));
                client_done(&main_client);
                grpc_shutdown();
                return EXIT_BENCH_CALLS;
        }
        r = client_warmup(&main_client, opt.warmup);
        if (r >= 0)
                r = measure_latency(&main_client, results);
        client_done(&main_client);
        for (size_t l = 0; r >= 0 && l < opt.n_levels; l++)
                r = measure_throughput(l, results);

        grpc_shutdown();
        if (r < 0)
                return EXIT_BENCH_CALLS;

        met = print_report(results);
        return opt.check_goals && !met ? EXIT_BENCH_GOALS : EXIT_BENCH_OK;
}

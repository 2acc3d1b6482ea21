/* server.c: the gRPC core server's life: register every method, run the workers, shut down. */
#include <grpc/grpc.h>
#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>

#include "call.h"
#include "common/log.h"
#include "executor.h"
#include "server.h"

/* Refused connections waiting for their client to read the answer (rpc/call.c): each waits at
 * most a second; past the queue they are closed at once. */
#define SERVER_CLOSER_THREADS 2u
#define SERVER_CLOSER_QUEUE 64u

/* At shutdown, how long gRPC may take to close its connections itself (writing the cancelled
 * calls' trailers) before familyd shuts their sockets: a connection whose client never reads
 * would otherwise keep the shutdown waiting forever. */
#define SERVER_SHUTDOWN_GRACE_SEC 2

static const RpcService *const services[] = {
        &service_family,
        &service_build,
        &service_validate,
        &service_mesh,
        &service_admin,
        &service_health,
        &service_reflection_v1,
        &service_reflection_v1alpha,
};

struct Server {
        grpc_server *server;
        grpc_completion_queue *cq;
        grpc_server_credentials *credentials;
        atomic_bool shutting_down;
        CallSite *sites;
        size_t n_sites;
        pthread_t *threads;
        size_t n_threads;
        RpcTag shutdown_tag;
        bool started;
        pthread_mutex_t lock;
        pthread_cond_t cond;
        bool shutdown_done;
        CallCounter calls;
        RpcHooks hooks;
        CallerTable *callers; /* who is at the other end of each connection */
        Executor *closer;     /* closes refused connections once their answer is read */
};


/* Runs on a worker: only signals, because the main thread may still be inside
 * grpc_server_cancel_all_calls() and must destroy the server itself afterwards. */
static void on_shutdown_done(RpcTag *tag, bool ok) {
        Server *s = container_of(tag, Server, shutdown_tag);

        (void) pthread_mutex_lock(&s->lock);
        s->shutdown_done = true;
        (void) pthread_cond_signal(&s->cond);
        (void) pthread_mutex_unlock(&s->lock);
}

static void *worker(void *userdata) {
        Server *s = userdata;

        for (;;) {
                grpc_event ev = grpc_completion_queue_next(s->cq,
                                                           gpr_inf_future(GPR_CLOCK_REALTIME),
                                                           NULL);
                if (ev.type == GRPC_QUEUE_SHUTDOWN)
                        break;
                if (ev.type == GRPC_OP_COMPLETE) {
                        RpcTag *tag = ev.tag;
                        tag->complete(tag, ev.success != 0);
                }
        }
        return NULL;
}

static size_t count_methods(void) {
        size_t n = 0;
        for (size_t i = 0; i < ELEMENTSOF(services); i++)
                n += services[i]->n_methods;
        return n;
}

int server_new(const ServerParams *params, Server **ret) {
        _cleanup_(server_freep) Server *s = NULL;
        grpc_arg args[4];
        int r;

        s = calloc(1, sizeof *s);
        if (!s)
                return -ENOMEM;
        (void) pthread_mutex_init(&s->lock, NULL);
        (void) pthread_cond_init(&s->cond, NULL);
        call_counter_init(&s->calls, params->max_watches,
                          params->max_watches_per_process ?: params->max_watches);
        s->hooks = params->hooks;
        CallerQueueLimits queue = {
                .per_connection = params->queue_limits.per_connection ?: UINT64_MAX,
                .total = params->queue_limits.total ?: UINT64_MAX,
        };
        r = caller_table_new(params->admin_gid, &queue, &s->callers);
        if (r < 0)
                return r;
        r = executor_new(SERVER_CLOSER_THREADS, SERVER_CLOSER_QUEUE, &s->closer);
        if (r < 0)
                return log_error_errno(r, "Failed to start the connection closer: %m");

        grpc_init();

        args[0] = (grpc_arg) { .type = GRPC_ARG_INTEGER,
                               .key = (char *) GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                               .value.integer = (int) params->max_request_bytes };
        args[1] = (grpc_arg) { .type = GRPC_ARG_INTEGER,
                               .key = (char *) GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               .value.integer = 128 };
        /* Also closes connections that never send the HTTP/2 preface: the handshake timeout
         * does not apply to channels added from an fd (measured with gRPC 1.51). */
        args[2] = (grpc_arg) { .type = GRPC_ARG_INTEGER,
                               .key = (char *) GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                               .value.integer = (int) params->connection_idle_ms };
        /* No ping policing (0: strikes unlimited). gRPC 1.51 answers each PING past the
         * strike limit with another close of the transport, which waits for the write in
         * progress and keeps every attempt's error (about 3.6 KB a PING) while a client that
         * never reads holds that write: 80 MiB a connection measured. Without
         * strikes a PING costs its ACK, and chttp2 stops reading a connection with 10,000
         * ACKs (and SETTINGS ACKs, RST_STREAMs) unwritten: under 1 MiB a connection. */
        args[3] = (grpc_arg) { .type = GRPC_ARG_INTEGER,
                               .key = (char *) GRPC_ARG_HTTP2_MAX_PING_STRIKES,
                               .value.integer = 0 };
        grpc_channel_args channel_args = { .num_args = ELEMENTSOF(args), .args = args };

        s->server = grpc_server_create(&channel_args, NULL);
        s->cq = grpc_completion_queue_create_for_next(NULL);
        s->credentials = grpc_insecure_server_credentials_create();
        if (!s->server || !s->cq || !s->credentials)
                return -ENOMEM;
        grpc_server_register_completion_queue(s->server, s->cq, NULL);

        /* One site per method plus the catch-all (method NULL) for unknown methods. */
        s->sites = calloc(count_methods() + 1, sizeof(CallSite));
        if (!s->sites)
                return -ENOMEM;
        for (size_t i = 0; i < ELEMENTSOF(services); i++)
                for (size_t j = 0; j < services[i]->n_methods; j++) {
                        const RpcMethod *m = &services[i]->methods[j];
                        CallSite *site = &s->sites[s->n_sites++];

                        *site = (CallSite) {
                                .server = s->server,
                                .cq = s->cq,
                                .context = { .manager = params->manager,
                                             .hooks = &s->hooks,
                                             .executor = params->executor,
                                             .shards = params->shards,
                                             .shard_socket = params->shard_socket,
                                             .userdata = services[i]->userdata },
                                .method = m,
                                .shutting_down = &s->shutting_down,
                                .counter = &s->calls,
                                .callers = s->callers,
                                .closer = s->closer,
                        };
                        site->registered = grpc_server_register_method(
                                s->server, m->path, NULL,
                                m->kind == RPC_BIDI_BYTES ? GRPC_SRM_PAYLOAD_NONE
                                                          : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
                                0);
                        if (!site->registered)
                                return log_error_errno(-EINVAL, "Failed to register %s", m->path);
                }
        s->sites[s->n_sites++] = (CallSite) {
                .server = s->server,
                .cq = s->cq,
                .context = { .manager = params->manager, .hooks = &s->hooks },
                .shutting_down = &s->shutting_down,
                .counter = &s->calls,
                .callers = s->callers,
                .closer = s->closer,
        };

        grpc_server_start(s->server);
        s->started = true;

        for (size_t i = 0; i < s->n_sites; i++) {
                r = call_arm(&s->sites[i]);
                if (r < 0)
                        return log_error_errno(r, "Failed to arm the gRPC server: %m");
        }

        s->threads = calloc(params->threads, sizeof(pthread_t));
        if (!s->threads)
                return -ENOMEM;
        for (size_t i = 0; i < params->threads; i++) {
                r = -pthread_create(&s->threads[i], NULL, worker, s);
                if (r < 0)
                        return log_error_errno(r, "Failed to start a gRPC worker thread: %m");
                s->n_threads++;
        }

        *ret = TAKE_PTR(s);
        return 0;
}

void server_add_connection(Server *s, int fd, const RpcRefusal *refusal) {
        int r = caller_table_add(s->callers, fd, refusal);
        if (r < 0 && refusal && refusal->kind != RPC_REFUSAL_NONE) {
                /* Unmarked it would be served past its cap. */
                log_warning_errno(r, "Failed to file a refused API connection, closing it: %m");
                safe_close(fd);
                return;
        }
        if (r < 0)
                /* Its calls then cannot name their caller: refused where that matters. */
                log_warning_errno(r, "Failed to read the credentials of an API connection, "
                                     "ignoring: %m");
        grpc_server_add_channel_from_fd(s->server, fd, s->credentials);
}

void server_notify_watches(Server *s) {
        call_counter_notify_watches(&s->calls);
}

void server_notify_watches_of(Server *s, const char *path) {
        call_counter_notify_watches_of(&s->calls, path);
}

static bool calls_live(Server *s) {
        (void) pthread_mutex_lock(&s->calls.lock);
        bool live = s->calls.live > 0;
        (void) pthread_mutex_unlock(&s->calls.lock);
        return live;
}

/* Without workers: runs completions on the calling thread until the shutdown tag has fired and
 * every call is gone. */
static void drain_until_shutdown(Server *s) {
        while (!s->shutdown_done || calls_live(s)) {
                grpc_event ev = grpc_completion_queue_next(s->cq,
                                                           gpr_inf_future(GPR_CLOCK_REALTIME),
                                                           NULL);
                if (ev.type != GRPC_OP_COMPLETE)
                        break;
                RpcTag *tag = ev.tag;
                tag->complete(tag, ev.success != 0);
        }
}

/* Waits for gRPC's shutdown tag; past the grace, shuts the sockets gRPC still holds. */
static void server_wait_shutdown(Server *s) {
        struct timespec until;
        bool forced = false;

        (void) clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += SERVER_SHUTDOWN_GRACE_SEC;
        (void) pthread_mutex_lock(&s->lock);
        while (!s->shutdown_done) {
                if (forced) {
                        (void) pthread_cond_wait(&s->cond, &s->lock);
                        continue;
                }
                if (pthread_cond_timedwait(&s->cond, &s->lock, &until) != ETIMEDOUT)
                        continue;
                forced = true;
                (void) pthread_mutex_unlock(&s->lock);
                unsigned n = caller_table_shutdown_all(s->callers);
                if (n > 0)
                        log_info("%u API connection(s) still open %d s into the shutdown "
                                 "(clients that do not read): closed.",
                                 n, SERVER_SHUTDOWN_GRACE_SEC);
                (void) pthread_mutex_lock(&s->lock);
        }
        (void) pthread_mutex_unlock(&s->lock);
}

Server *server_free(Server *s) {
        if (!s)
                return NULL;

        atomic_store(&s->shutting_down, true);
        if (s->closer)
                executor_stop(s->closer); /* its calls close at once, so the calls drain */
        if (s->started) {
                /* The order gRPC wants: shutdown, cancel every call, wait for the shutdown
                 * tag, destroy the server, shut the queue down, drain it to its end. Before the
                 * destroy, every Call must be gone too: a worker still inside a handler would
                 * start a batch on a destroyed server. */
                s->shutdown_tag.complete = on_shutdown_done;
                grpc_server_shutdown_and_notify(s->server, s->cq, &s->shutdown_tag);
                grpc_server_cancel_all_calls(s->server);
                if (s->n_threads == 0)
                        drain_until_shutdown(s);
                else {
                        server_wait_shutdown(s);
                        call_counter_wait_drained(&s->calls);
                }
        }
        if (s->server)
                grpc_server_destroy(s->server);
        if (s->cq) {
                grpc_completion_queue_shutdown(s->cq);
                if (s->n_threads == 0)
                        (void) worker(s);
                for (size_t i = 0; i < s->n_threads; i++)
                        (void) pthread_join(s->threads[i], NULL);
                grpc_completion_queue_destroy(s->cq);
        }
        executor_free(s->closer);
        if (s->credentials)
                grpc_server_credentials_release(s->credentials);
        free(s->sites);
        free(s->threads);
        (void) pthread_cond_destroy(&s->cond);
        (void) pthread_mutex_destroy(&s->lock);
        call_counter_done(&s->calls);
        caller_table_unref(s->callers);
        grpc_shutdown();
        return mfree(s);
}

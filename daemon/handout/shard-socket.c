/* shard-socket.c: the shard socket's thread: framed ShardFdRequests in, replies and fds out. */

/*
 * DESIGN: the socket has its own thread and sd-event loop, so neither the main loop nor the
 * gRPC workers ever wait on a shard client, and this thread waits on none either: every socket
 * is non-blocking, a connection reads at most one frame ahead of its replies, and a reply that
 * does not fit in the socket buffer stays queued (with its descriptors, until its first byte
 * leaves) while the thread watches for EPOLLOUT. Descriptors for a reply are opened when the
 * request is handled and closed by us once the kernel has taken them with the first chunk.
 * Each connection is an I/O source of the loop; one timer serves every connection's deadline,
 * and is moved only when a deadline comes before it, so requests cost no timer changes.
 *
 * A connection ends on: a declared frame length over SHARD_SOCKET_MAX_FRAME_BYTES (closed at
 * once: the stream cannot be resynchronised); a frame that is not a ShardFdRequest (answered
 * INVALID_ARGUMENT, then closed: the client's framing is evidently wrong, but it learns why);
 * no complete request frame and no reply taken for the idle timeout; EOF or an error. Requests
 * that decode get a reply and the connection lives on: too many tokens is INVALID_ARGUMENT, an
 * unknown or released token NOT_FOUND (naming its index, never the token), and all or nothing.
 *
 * Descriptors in flight: descriptors sent over a Unix socket and not yet received are charged by
 * the kernel to the sender's user (user->unix_inflight); once that count passes RLIMIT_NOFILE,
 * every SCM_RIGHTS sendmsg of every process of that user fails with ETOOMANYREFS (short of
 * CAP_SYS_RESOURCE or CAP_SYS_ADMIN). A client that asks and never reads would pin our budget,
 * so:
 *  - a connection has at most one descriptor-carrying reply unread: once a reply's descriptors
 *    have left (with its first byte), the connection reads no further frame (back-pressure)
 *    until SIOCOUTQ, which for AF_UNIX counts what was sent and not yet consumed by the client,
 *    is 0. Replies without descriptors still pipeline. The thread learns that the client has read
 *    from an edge-triggered EPOLLOUT (the kernel wakes a writer each time its client frees a
 *    buffer of it) and, as that wakeup can come a moment before the count drops, from a
 *    re-check every SHARD_SOCKET_UNREAD_RECHECK_MS while such connections exist. Neither spins:
 *    an edge needs the client to consume something, and the watch is changed only when the
 *    state changes.
 *  - a cap on concurrent connections per peer uid (SO_PEERCRED at accept), besides the global
 *    one.
 *  - a connection waiting for its client to read is never idle-closed: closing it would free its
 *    slot while the descriptors stay in the client's receive queue, still charged to us, and the
 *    client could pin 253 more on a new connection, again and again. After the unread timeout
 *    it is shut down (SHUT_RDWR: the client reads what was sent, then EOF; no more requests),
 *    but we keep the socket, and its slot, until SIOCOUTQ is 0: the client read everything or
 *    closed its end (which frees its queue).
 * Hence the bound, at all times: at most per-uid cap x 253 descriptors in flight for one client
 * uid (4,048 with the defaults), global cap x 253 over all (32,384), plus up to 253 per
 * connection in our own table while a reply waits for room in a full socket (those are ours,
 * and closed by an idle close). Every other way a connection ends happens while none of its
 * descriptors is unread, since it reads frames only then; shard_server_free is the exception.
 * An in-flight limit hit anyway (other processes of our user, a low RLIMIT_NOFILE) makes the
 * sendmsg fail before any byte leaves: that reply becomes RESOURCE_EXHAUSTED without
 * descriptors, with a rate-limited warning, and the connection lives on.
 *
 * Descriptors coming in (a checkpoint deposit's, checkpoint-deposit.h) are the daemon's from
 * the moment they are read: a connection keeps at most SHARD_SOCKET_MAX_TOKENS with the frame
 * being read, and all unfinished frames together at most SHARD_SOCKET_MAX_IN_FDS; a connection
 * that sends past either is closed (its descriptors with it), so a client that sends
 * descriptors and never finishes its frame holds a bounded number of them until the idle
 * timeout. A finished frame's descriptors go to the deposit table (its own limits) or are
 * closed with the refusal.
 *
 * The thread owns the loop and the connections outright; other threads touch only the atomic
 * settings, the stop eventfd, whose source ends the loop, and the counters (relaxed atomics the
 * thread bumps and /metrics reads: shard_server_counters). All signals are blocked in the
 * thread.
 */

#include <assert.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/sockios.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-event.h>
#include <time.h>

#include "core/error.h"
#include "checkpoint-deposit.h"
#include "socket-cred.h"
#include "codec/codec-shard.h"
#include "common/log.h"
#include "shard-socket.h"

#define SHARD_SOCKET_FRAME_HEADER 4u
/* Frames handled per connection per wakeup, so one busy client cannot starve the others
 * (its watch is level-triggered: the rest wakes us again). */
#define SHARD_SOCKET_FRAMES_PER_WAKEUP 16u
/* After EMFILE and friends, accepting pauses this long instead of spinning. */
#define SHARD_SOCKET_ACCEPT_PAUSE_MS 250u
#define SHARD_SOCKET_LOG_INTERVAL_MS 10000u
/* While a connection waits for its client to read a reply with descriptors, SIOCOUTQ is checked
 * this often besides on EPOLLOUT (see DESIGN). */
#define SHARD_SOCKET_UNREAD_RECHECK_MS 50u
#define UNREAD_RECHECK_USEC (SHARD_SOCKET_UNREAD_RECHECK_MS * 1000u)
/* Timers fire within this of their deadline (sd-event's default, 250 ms, would stretch them). */
#define SHARD_SOCKET_TIMER_ACCURACY_USEC 1000u
/* Descriptors that frames still being read may hold in all (a deposit's, before its frame
 * is complete): past it the connection that sends more is closed. */
#define SHARD_SOCKET_MAX_IN_FDS 1024u
/* Idle checkpoint deposits are looked for this often (their descriptors keep files alive). */
#define SHARD_SOCKET_DEPOSIT_SWEEP_MS 5000u


typedef struct Connection Connection;
struct Connection {
        Connection *prev, *next;
        ShardServer *server;
        int fd;
        uid_t uid;
        bool admin; /* root, or in --admin-group: maps any build's shards */
        /* The process that connected (SO_PEERCRED at accept): pid (0: it cannot be named) and
         * start time. A training handout's tokens go to their one process only. */
        int32_t pid;
        uint64_t start_time;
        sd_event_source *io;
        uint32_t watched; /* the events io watches for now */
        /* The idle deadline; while unread_fds, the unread timeout's; UINT64_MAX once shut down
         * (CLOCK_MONOTONIC, usec). */
        uint64_t deadline;
        /* The frame being read: its header, then its body. */
        uint8_t header[SHARD_SOCKET_FRAME_HEADER];
        size_t n_header;
        uint8_t *body;
        size_t body_size, n_body;
        /* The reply being written, and the descriptors riding with its first byte. */
        uint8_t *out;
        size_t n_out, n_sent;
        int fds[SHARD_SOCKET_MAX_TOKENS];
        size_t n_fds;
        /* Descriptors that came with the frame being read (a checkpoint deposit's). */
        int in_fds[SHARD_SOCKET_MAX_TOKENS];
        size_t n_in_fds;
        bool close_after_reply;
        /* Descriptors we sent may be unread by the client: no frame is read (see DESIGN). */
        bool unread_fds;
        /* Shut down at the unread timeout: freed once the client has read or closed. */
        bool shut_down;
};

typedef struct RateLimit {
        uint64_t logged_ms;
        unsigned suppressed;
} RateLimit;

struct ShardServer {
        ShardTable *table;
        char *path;
        int listen_fd;
        int stop_fd;
        sd_event *event;
        sd_event_source *listener, *stopper;
        sd_event_source *expire;        /* at or before the earliest deadline */
        sd_event_source *recheck;       /* on while a connection has unread_fds */
        sd_event_source *accept_resume; /* on while accepting pauses */
        sd_event_source *sweep;         /* drops idle checkpoint deposits */
        _Atomic(CheckpointDeposits *) deposits; /* NULL: deposits are refused */
        pthread_t thread;
        bool thread_started;
        atomic_uint idle_timeout_ms;
        atomic_uint max_connections;
        atomic_uint max_connections_per_uid;
        atomic_uint unread_timeout_ms;
        atomic_uint admin_gid; /* (gid_t) -1: none */
        /* Owned by the thread from here on. */
        Connection *connections;
        unsigned n_in_fds; /* descriptors held by frames not yet complete (in_fds) */
        unsigned n_connections;
        RateLimit cap_log, uid_cap_log, inflight_log;
        /* Written by the thread, read by any (shard_server_counters). */
        atomic_uint open_connections; /* n_connections */
        atomic_uint_fast64_t connections_total, refused_total, handouts_total,
                descriptors_total;
};

/* This loop iteration's time, CLOCK_MONOTONIC usec. */
static uint64_t loop_now(ShardServer *s) {
        uint64_t now = 0;

        (void) sd_event_now(s->event, CLOCK_MONOTONIC, &now);
        return now;
}

/* (Re)starts a one-shot timer at usec. */
static void timer_set(sd_event_source *t, uint64_t usec) {
        (void) sd_event_source_set_time(t, usec);
        (void) sd_event_source_set_enabled(t, SD_EVENT_ONESHOT);
}

static bool timer_on(sd_event_source *t) {
        int on = SD_EVENT_OFF;

        (void) sd_event_source_get_enabled(t, &on);
        return on != SD_EVENT_OFF;
}

static int timer_new(ShardServer *s, sd_event_source **ret, sd_event_time_handler_t handler) {
        int r = sd_event_add_time(s->event, ret, CLOCK_MONOTONIC, 0,
                                  SHARD_SOCKET_TIMER_ACCURACY_USEC, handler, s);
        return r < 0 ? r : sd_event_source_set_enabled(*ret, SD_EVENT_OFF);
}

/* True once the interval since the last message passed; otherwise counts one suppressed. */
static bool ratelimit_pass(ShardServer *s, RateLimit *rl, unsigned *ret_suppressed) {
        uint64_t now = loop_now(s) / 1000u;

        if (rl->logged_ms != 0 && now - rl->logged_ms < SHARD_SOCKET_LOG_INTERVAL_MS) {
                rl->suppressed++;
                return false;
        }
        *ret_suppressed = rl->suppressed;
        rl->logged_ms = now ? now : 1;
        rl->suppressed = 0;
        return true;
}

static void connection_drop_reply(Connection *c) {
        for (size_t i = 0; i < c->n_fds; i++)
                safe_close(c->fds[i]);
        c->n_fds = 0;
        c->out = mfree(c->out);
        c->n_out = c->n_sent = 0;
}

static void connection_drop_in_fds(Connection *c) {
        for (size_t i = 0; i < c->n_in_fds; i++)
                safe_close(c->in_fds[i]);
        c->server->n_in_fds -= c->n_in_fds;
        c->n_in_fds = 0;
}

static void connection_free(ShardServer *s, Connection *c) {
        if (c->prev)
                c->prev->next = c->next;
        else
                s->connections = c->next;
        if (c->next)
                c->next->prev = c->prev;
        s->n_connections--;
        atomic_store_explicit(&s->open_connections, s->n_connections, memory_order_relaxed);

        connection_drop_reply(c);
        connection_drop_in_fds(c);
        free(c->body);
        sd_event_source_disable_unref(c->io);
        safe_close(c->fd);
        free(c);
}

/* The expiry timer only moves earlier here; a deadline that moved later is found when it
 * fires (on_expire). */
static void connection_set_deadline(ShardServer *s, Connection *c, unsigned msec) {
        uint64_t at = UINT64_MAX;

        c->deadline = loop_now(s) + (uint64_t) msec * 1000u;
        if (timer_on(s->expire))
                (void) sd_event_source_get_time(s->expire, &at);
        if (c->deadline < at)
                timer_set(s->expire, c->deadline);
}

static void connection_touch(ShardServer *s, Connection *c) {
        connection_set_deadline(s, c, atomic_load(&s->idle_timeout_ms));
}

/* Level-triggered EPOLLOUT while a reply waits for room, edge-triggered while the client has
 * descriptors to read (the socket is writable then: only a new edge says anything), otherwise
 * level-triggered EPOLLIN. Changed only when it differs: re-arming an edge-triggered watch on
 * a writable socket reports it at once, which would spin. */
static int connection_watch(Connection *c) {
        uint32_t events = c->n_out > 0 ? EPOLLOUT : c->unread_fds ? EPOLLOUT | EPOLLET : EPOLLIN;

        if (events == c->watched)
                return 0;
        int r = sd_event_source_set_io_events(c->io, events);
        if (r < 0)
                return r;
        c->watched = events;
        return 0;
}

/* Clears unread_fds once the whole reply has left and the client has consumed everything sent.
 * Returns whether descriptors may still be unread. */
static bool connection_check_unread(ShardServer *s, Connection *c) {
        int n = 0;

        if (!c->unread_fds || c->n_out > 0)
                return c->unread_fds;
        if (ioctl(c->fd, SIOCOUTQ, &n) < 0 || n > 0)
                return true;
        c->unread_fds = false;
        /* The reply was taken: the idle clock starts over (unless the connection is done). */
        if (!c->shut_down)
                connection_touch(s, c);
        return false;
}

/* Queues a reply; takes the n_fds descriptors in fds (closed on failure too). */
static int connection_queue_reply(Connection *c, const ShardReply *reply, int *fds,
                                  size_t n_fds) {
        size_t size = codec_shard_reply_size(reply);
        uint8_t *out;

        assert(c->n_out == 0 && c->n_fds == 0);
        if (n_fds > 0)
                memcpy(c->fds, fds, n_fds * sizeof(int));
        c->n_fds = n_fds;

        /* 253 entries of a few bytes each: far below the frame limit, which clients also use. */
        if (size > SHARD_SOCKET_MAX_FRAME_BYTES) {
                connection_drop_reply(c);
                return -EMSGSIZE;
        }
        out = malloc(SHARD_SOCKET_FRAME_HEADER + size);
        if (!out) {
                connection_drop_reply(c);
                return -ENOMEM;
        }
        for (unsigned i = 0; i < SHARD_SOCKET_FRAME_HEADER; i++)
                out[i] = (uint8_t) ((uint32_t) size >> (8 * i));
        codec_shard_reply_pack(reply, out + SHARD_SOCKET_FRAME_HEADER);
        c->out = out;
        c->n_out = SHARD_SOCKET_FRAME_HEADER + size;
        c->n_sent = 0;
        return 0;
}

static int connection_queue_error(Connection *c, FamilyStatus code, const char *message) {
        ShardReply reply = { .code = (int32_t) code, .message = message };

        return connection_queue_reply(c, &reply, NULL, 0);
}

static int connection_answer(ShardServer *s, Connection *c, const ShardRequest *req) {
        ShardSegment *segments[SHARD_SOCKET_MAX_TOKENS];
        int fds[SHARD_SOCKET_MAX_TOKENS];
        uint64_t sizes[SHARD_SOCKET_MAX_TOKENS];
        const char *kinds[SHARD_SOCKET_MAX_TOKENS];
        int32_t devices[SHARD_SOCKET_MAX_TOKENS];
        char message[320];
        size_t n = req->n_tokens, bad, n_fds = 0;
        int r;

        if (n > SHARD_SOCKET_MAX_TOKENS) {
                (void) snprintf(message, sizeof message,
                                "request names %zu shard tokens, at most %u are allowed", n,
                                SHARD_SOCKET_MAX_TOKENS);
                return connection_queue_error(c, FAMILY_STATUS_INVALID_ARGUMENT, message);
        }

        ShardAsker asker = { .uid = c->uid, .admin = c->admin, .pid = c->pid,
                             .start_time = c->start_time };
        r = shard_table_lookup_many_as(s->table, req->tokens, n, &asker, segments, &bad);
        if (r == SHARD_TABLE_OTHER_PROCESS) {
                (void) snprintf(message, sizeof message,
                                "shard token %zu of %zu belongs to another process: its build "
                                "is a training handout (private and writable), which only the "
                                "process that made it may map",
                                bad + 1, n);
                return connection_queue_error(c, FAMILY_STATUS_PERMISSION_DENIED, message);
        }
        if (r == SHARD_TABLE_DENIED) {
                (void) snprintf(message, sizeof message,
                                "shard token %zu of %zu is of another user's build: only its "
                                "owner's processes and admins may map it, unless it was built "
                                "with share \"group\"",
                                bad + 1, n);
                return connection_queue_error(c, FAMILY_STATUS_PERMISSION_DENIED, message);
        }
        if (r == SHARD_TABLE_NOT_FOUND) {
                /* The index, never the token: a reply may end up in a log. */
                (void) snprintf(message, sizeof message,
                                "shard token %zu of %zu is unknown or released", bad + 1, n);
                return connection_queue_error(c, FAMILY_STATUS_NOT_FOUND, message);
        }
        if (r != 0)
                return r < 0 ? r : -EIO;

        /* Every reference is dropped; after a failure nothing more is opened. */
        for (size_t i = 0; i < n; i++) {
                if (r == 0) {
                        r = shard_segment_open(segments[i], req->writable, &fds[n_fds]);
                        if (r < 0)
                                bad = i;
                        else {
                                n_fds++;
                                sizes[i] = shard_segment_size(segments[i]);
                                kinds[i] = shard_segment_device_kind(segments[i]);
                                devices[i] = shard_segment_device(segments[i]);
                        }
                }
                shard_segment_unref(segments[i]);
        }
        if (r < 0) {
                for (size_t i = 0; i < n_fds; i++)
                        safe_close(fds[i]);
                if (r == -EACCES) {
                        (void) snprintf(message, sizeof message,
                                        "shard %zu of %zu is read-only: its build was not made "
                                        "writable, and a shared writable mapping of it would "
                                        "change every user's bytes; map it private "
                                        "(copy-on-write), or build with writable set",
                                        bad + 1, n);
                        return connection_queue_error(c, FAMILY_STATUS_PERMISSION_DENIED,
                                                      message);
                }
                if (r == -EPERM) {
                        /* Only unsealed segments refuse it: files kept under --state-dir. */
                        (void) snprintf(message, sizeof message,
                                        "shard %zu of %zu is read-only: it is kept in a "
                                        "--state-dir file, which cannot be sealed against "
                                        "resizing, so it is never handed out writable",
                                        bad + 1, n);
                        return connection_queue_error(c, FAMILY_STATUS_FAILED_PRECONDITION,
                                                      message);
                }
                if (r == -EMFILE || r == -ENFILE || r == -ENOMEM) {
                        log_warning_errno(r, "Failed to open shard descriptors, refusing a "
                                             "request: %m");
                        return connection_queue_error(c, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                      r == -ENOMEM
                                                              ? "the daemon is out of memory"
                                                              : "the daemon is out of file "
                                                                "descriptors");
                }
                log_error_errno(r, "Failed to open a shard descriptor: %m");
                return connection_queue_error(c, FAMILY_STATUS_INTERNAL,
                                              "failed to open a shard descriptor");
        }

        ShardReply reply = {
                .code = FAMILY_STATUS_OK,
                .message = "",
                .n = n,
                .sizes = sizes,
                .device_kinds = kinds,
                .devices = devices,
        };
        return connection_queue_reply(c, &reply, fds, n_fds);
}

/* A checkpoint deposit (checkpoint-deposit.h): the frame's descriptors, one per name, kept
 * under a new token. The descriptors are taken (closed on every refusal). */
static int connection_deposit(ShardServer *s, Connection *c, const ShardRequest *req) {
        CheckpointDeposits *deposits = atomic_load(&s->deposits);
        _cleanup_(checkpoint_files_done) CheckpointFiles files = {};
        size_t n = c->n_in_fds;
        char message[320];
        ShardToken token;
        int r;

        files.fds = calloc(n ? n : 1, sizeof(int));
        files.names = calloc(n ? n : 1, sizeof(char *));
        if (!files.fds || !files.names) {
                connection_drop_in_fds(c);
                return connection_queue_error(c, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                              "the daemon is out of memory");
        }
        memcpy(files.fds, c->in_fds, n * sizeof(int));
        files.n = n;
        c->server->n_in_fds -= n;
        c->n_in_fds = 0;

        if (!deposits)
                return connection_queue_error(c, FAMILY_STATUS_FAILED_PRECONDITION,
                                              "this shard socket takes no checkpoint deposits");
        if (req->n_tokens > 0 || req->writable || req->n_checkpoint_files != n) {
                (void) snprintf(message, sizeof message,
                                "a checkpoint deposit names %zu files and carries %zu "
                                "descriptors%s; send one descriptor per name, and no tokens",
                                req->n_checkpoint_files, n,
                                req->n_tokens > 0 ? " with shard tokens" : "");
                return connection_queue_error(c, FAMILY_STATUS_INVALID_ARGUMENT, message);
        }
        for (size_t i = 0; i < n; i++) {
                r = checkpoint_deposit_check_file(files.fds[i], req->checkpoint_files[i],
                                                  message, sizeof message);
                if (r < 0)
                        return connection_queue_error(c, FAMILY_STATUS_INVALID_ARGUMENT,
                                                      message);
                files.names[i] = strdup(req->checkpoint_files[i]);
                if (!files.names[i])
                        return connection_queue_error(c, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                                      "the daemon is out of memory");
        }
        r = checkpoint_deposits_add(deposits, c->uid, &files, &token);
        if (r == -EUSERS) {
                (void) snprintf(message, sizeof message,
                                "this user holds as many checkpoint deposits as one user may "
                                "(%u, with %u descriptors in all); they are dropped %u s "
                                "after their last Build",
                                CHECKPOINT_DEPOSITS_PER_UID, CHECKPOINT_DEPOSIT_MAX_FDS_PER_UID,
                                CHECKPOINT_DEPOSIT_IDLE_MS / 1000u);
                return connection_queue_error(c, FAMILY_STATUS_RESOURCE_EXHAUSTED, message);
        }
        if (r == -ENOSPC)
                return connection_queue_error(c, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                              "the daemon holds as many checkpoint deposits "
                                              "as it takes; try again later");
        if (r < 0)
                return connection_queue_error(c, FAMILY_STATUS_INTERNAL,
                                              "failed to keep the checkpoint deposit");
        ShardReply reply = { .code = FAMILY_STATUS_OK, .message = "",
                             .checkpoint_token = token.hex };
        return connection_queue_reply(c, &reply, NULL, 0);
}

/* Handles one complete frame: 0, with a reply queued. */
static int connection_handle_frame(ShardServer *s, Connection *c, const uint8_t *data,
                                   size_t size) {
        _cleanup_(codec_shard_request_done) ShardRequest req = {};
        int r;

        r = codec_shard_request_decode(data, size, &req);
        if (r < 0) {
                log_debug("Shard socket: a frame is not a ShardFdRequest, closing the connection");
                c->close_after_reply = true;
                connection_drop_in_fds(c);
                return connection_queue_error(c, FAMILY_STATUS_INVALID_ARGUMENT,
                                              "frame could not be decoded as "
                                              "familyd.v1.ShardFdRequest");
        }
        if (req.n_checkpoint_files > 0 || c->n_in_fds > 0)
                return connection_deposit(s, c, &req);
        return connection_answer(s, c, &req);
}

static bool errno_is_fd_limit(int e) {
        return e == ETOOMANYREFS || e == EMFILE || e == ENFILE;
}

/* Sends what is queued. 0: all sent, or the socket is full (the rest waits for EPOLLOUT). */
static int connection_flush(ShardServer *s, Connection *c) {
        while (c->n_sent < c->n_out) {
                union {
                        struct cmsghdr align;
                        char buf[CMSG_SPACE(sizeof(int) * SHARD_SOCKET_MAX_TOKENS)];
                } control;
                struct iovec iov = {
                        .iov_base = c->out + c->n_sent,
                        .iov_len = c->n_out - c->n_sent,
                };
                struct msghdr mh = {
                        .msg_iov = &iov,
                        .msg_iovlen = 1,
                };

                if (c->n_fds > 0) {
                        memset(&control, 0, sizeof control);
                        mh.msg_control = control.buf;
                        mh.msg_controllen = CMSG_SPACE(sizeof(int) * c->n_fds);
                        struct cmsghdr *cmsg = CMSG_FIRSTHDR(&mh);
                        cmsg->cmsg_level = SOL_SOCKET;
                        cmsg->cmsg_type = SCM_RIGHTS;
                        cmsg->cmsg_len = CMSG_LEN(sizeof(int) * c->n_fds);
                        memcpy(CMSG_DATA(cmsg), c->fds, sizeof(int) * c->n_fds);
                }

                ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
                if (k < 0) {
                        int e = errno;
                        unsigned suppressed;

                        if (e == EINTR)
                                continue;
                        if (e == EAGAIN)
                                return 0;
                        /* Descriptors ride with the first byte only, so nothing has left. */
                        if (!errno_is_fd_limit(e) || c->n_fds == 0 || c->n_sent > 0)
                                return -e;
                        if (ratelimit_pass(s, &s->inflight_log, &suppressed))
                                log_warning_errno(-e, "Shard socket: failed to send %zu shard "
                                                      "descriptors, answering "
                                                      "RESOURCE_EXHAUSTED (%u more since the "
                                                      "last message): %m",
                                                  c->n_fds, suppressed);
                        connection_drop_reply(c);
                        int r = connection_queue_error(
                                c, FAMILY_STATUS_RESOURCE_EXHAUSTED,
                                e == ETOOMANYREFS ? "too many descriptors are in flight to "
                                                    "unread replies; try again later"
                                                  : "the daemon is out of file descriptors");
                        if (r < 0)
                                return r;
                        continue;
                }
                if (c->n_fds > 0) {
                        atomic_fetch_add_explicit(&s->handouts_total, 1, memory_order_relaxed);
                        atomic_fetch_add_explicit(&s->descriptors_total, c->n_fds,
                                                  memory_order_relaxed);
                        /* The kernel holds the descriptors now, attached to the first byte,
                         * charged to us until the client reads them (see DESIGN). */
                        for (size_t i = 0; i < c->n_fds; i++)
                                safe_close(c->fds[i]);
                        c->n_fds = 0;
                        c->unread_fds = true;
                        connection_set_deadline(s, c, atomic_load(&s->unread_timeout_ms));
                        if (!timer_on(s->recheck))
                                timer_set(s->recheck, loop_now(s) + UNREAD_RECHECK_USEC);
                }
                c->n_sent += (size_t) k;
        }
        connection_drop_reply(c);
        if (!c->unread_fds)
                connection_touch(s, c);
        return 0;
}

/* Reads and handles frames until the socket is empty, a reply is waiting for room, or the
 * per-wakeup quota is used. 0; -ECONNRESET on EOF; another negative errno: close. */
/*
 * read() of a frame's bytes, keeping the descriptors that ride with them (a checkpoint
 * deposit's): at most SHARD_SOCKET_MAX_TOKENS per frame. More, or a control message cut short
 * (the kernel closed what did not fit), is -EPROTO: the connection is closed. Otherwise as
 * read(), with errno set.
 */
static ssize_t connection_recv(Connection *c, void *buf, size_t len) {
        union {
                struct cmsghdr align;
                char buf[CMSG_SPACE(sizeof(int) * SHARD_SOCKET_MAX_TOKENS)];
        } control;
        struct iovec iov = { .iov_base = buf, .iov_len = len };
        struct msghdr mh = {
                .msg_iov = &iov,
                .msg_iovlen = 1,
                .msg_control = control.buf,
                .msg_controllen = sizeof control.buf,
        };
        bool bad = false;
        ssize_t k;

        k = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (k < 0)
                return k;
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
                if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
                        continue;
                size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < n; i++) {
                        int fd;
                        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                        if (c->n_in_fds < SHARD_SOCKET_MAX_TOKENS &&
                            c->server->n_in_fds < SHARD_SOCKET_MAX_IN_FDS) {
                                c->in_fds[c->n_in_fds++] = fd;
                                c->server->n_in_fds++;
                        } else {
                                safe_close(fd);
                                bad = true;
                        }
                }
        }
        if (bad || (mh.msg_flags & MSG_CTRUNC)) {
                log_debug("Shard socket: more descriptors came with a frame than %u, or than "
                          "%u with every unfinished frame, closing the connection",
                          SHARD_SOCKET_MAX_TOKENS, SHARD_SOCKET_MAX_IN_FDS);
                return -EPROTO;
        }
        return k;
}

static int connection_read(ShardServer *s, Connection *c) {
        for (unsigned frames = 0; frames < SHARD_SOCKET_FRAMES_PER_WAKEUP;) {
                ssize_t k;

                if (c->n_out > 0 || c->close_after_reply || connection_check_unread(s, c))
                        return 0;

                if (c->n_header < SHARD_SOCKET_FRAME_HEADER)
                        k = connection_recv(c, c->header + c->n_header,
                                            SHARD_SOCKET_FRAME_HEADER - c->n_header);
                else
                        k = connection_recv(c, c->body + c->n_body, c->body_size - c->n_body);
                if (k == -EPROTO)
                        return -EPROTO;
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        if (errno == EAGAIN)
                                return 0;
                        return -errno;
                }
                if (k == 0)
                        return -ECONNRESET;

                if (c->n_header < SHARD_SOCKET_FRAME_HEADER) {
                        c->n_header += (size_t) k;
                        if (c->n_header < SHARD_SOCKET_FRAME_HEADER)
                                continue;
                        uint32_t len = (uint32_t) c->header[0] | (uint32_t) c->header[1] << 8 |
                                       (uint32_t) c->header[2] << 16 |
                                       (uint32_t) c->header[3] << 24;
                        if (len > SHARD_SOCKET_MAX_FRAME_BYTES) {
                                log_debug("Shard socket: a frame of %" PRIu32 " bytes is over "
                                          "the limit of %u, closing the connection",
                                          len, SHARD_SOCKET_MAX_FRAME_BYTES);
                                return -EMSGSIZE;
                        }
                        c->body_size = len;
                        c->n_body = 0;
                        if (len > 0) {
                                c->body = malloc(len);
                                if (!c->body)
                                        return -ENOMEM;
                                continue;
                        }
                } else {
                        c->n_body += (size_t) k;
                        if (c->n_body < c->body_size)
                                continue;
                }

                /* A whole frame. */
                _cleanup_free_ uint8_t *body = TAKE_PTR(c->body);
                size_t size = c->body_size;
                c->n_header = c->n_body = c->body_size = 0;
                frames++;
                connection_touch(s, c);

                int r = connection_handle_frame(s, c, body, size);
                if (r < 0)
                        return r;
                r = connection_flush(s, c);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* events: what the I/O source reported; 0 for a re-check of a connection with unread
 * descriptors. Returns false when the connection was closed (and freed). */
static bool connection_dispatch(ShardServer *s, Connection *c, uint32_t events) {
        int r = 0;

        if (c->n_out > 0)
                r = connection_flush(s, c);
        if (r == 0 && c->shut_down && !connection_check_unread(s, c))
                r = -ECONNRESET;
        /* Reading waits while descriptors may be unread: then EOF or a hangup closes nothing
         * either, since the client's queue still holds them (see DESIGN). The wait ends with an
         * EPOLLOUT edge or a re-check, with no EPOLLIN: frames may be waiting, so try. */
        if (r == 0 && c->n_out == 0 && !c->shut_down &&
            (events & (EPOLLIN | EPOLLHUP | EPOLLERR) || c->unread_fds))
                r = connection_read(s, c);
        if (r == 0 && c->n_out == 0 && c->close_after_reply)
                r = -ECONNRESET;
        if (r == 0)
                r = connection_watch(c);
        if (r < 0) {
                if (r != -ECONNRESET && r != -EPIPE)
                        log_debug_errno(r, "Shard socket: closing a connection: %m");
                connection_free(s, c);
                return false;
        }
        return true;
}

static int on_connection_io(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        Connection *c = userdata;

        (void) connection_dispatch(c->server, c, revents);
        return 0;
}

/* At the unread timeout: no more requests or replies, but the slot stays (see DESIGN).
 * Returns false when the connection was closed (and freed). */
static bool connection_shut_down(ShardServer *s, Connection *c) {
        log_debug("Shard socket: a reply with descriptors is unread after %u ms, shutting the "
                  "connection down",
                  atomic_load(&s->unread_timeout_ms));
        connection_drop_reply(c);
        free(c->body);
        c->body = NULL;
        c->n_header = c->n_body = c->body_size = 0;
        (void) shutdown(c->fd, SHUT_RDWR);
        c->shut_down = true;
        c->deadline = UINT64_MAX;
        /* Edge-triggered from here on: the hangup we just made would be reported forever. */
        int r = connection_watch(c);
        if (r < 0) {
                log_debug_errno(r, "Shard socket: closing a connection: %m");
                connection_free(s, c);
                return false;
        }
        return true;
}

/* Closes the connections past their deadline (shuts down those with unread descriptors), then
 * waits for the next deadline. */
static int on_expire(sd_event_source *source, uint64_t usec, void *userdata) {
        ShardServer *s = userdata;
        uint64_t now = loop_now(s), next = UINT64_MAX;

        for (Connection *c = s->connections, *n; c; c = n) {
                n = c->next;
                if (now >= c->deadline && !c->unread_fds) {
                        log_debug("Shard socket: closing a connection idle for %u ms",
                                  atomic_load(&s->idle_timeout_ms));
                        connection_free(s, c);
                        continue;
                }
                if (now >= c->deadline && !connection_shut_down(s, c))
                        continue;
                next = MIN(next, c->deadline);
        }
        if (next != UINT64_MAX)
                timer_set(source, next);
        return 0;
}

/* Every SHARD_SOCKET_DEPOSIT_SWEEP_MS: idle checkpoint deposits go (checkpoint-deposit.h). */
static int on_sweep(sd_event_source *source, uint64_t usec, void *userdata) {
        ShardServer *s = userdata;
        CheckpointDeposits *deposits = atomic_load(&s->deposits);

        if (deposits)
                checkpoint_deposits_sweep(deposits);
        timer_set(source, loop_now(s) + SHARD_SOCKET_DEPOSIT_SWEEP_MS * 1000u);
        return 0;
}

/* Every SHARD_SOCKET_UNREAD_RECHECK_MS while descriptors may be unread (see DESIGN). */
static int on_recheck(sd_event_source *source, uint64_t usec, void *userdata) {
        ShardServer *s = userdata;
        bool waiting = false;

        for (Connection *c = s->connections, *n; c; c = n) {
                n = c->next;
                /* Frees c when it was shut down and is read now. */
                if (c->unread_fds && connection_dispatch(s, c, 0))
                        waiting = waiting || c->unread_fds;
        }
        if (waiting)
                timer_set(source, loop_now(s) + UNREAD_RECHECK_USEC);
        return 0;
}

static unsigned server_count_uid(ShardServer *s, uid_t uid) {
        unsigned n = 0;

        for (Connection *c = s->connections; c; c = c->next)
                if (c->uid == uid)
                        n++;
        return n;
}

/* Watches a connection that passed the caps; closes fd on failure. */
static int connection_new(ShardServer *s, int fd, const struct ucred *cred, bool admin) {
        Connection *c = calloc(1, sizeof *c);
        int r;

        if (!c) {
                safe_close(fd);
                return -ENOMEM;
        }
        c->server = s;
        c->fd = fd;
        c->uid = cred->uid;
        c->admin = admin;
        /* A process that cannot be named is nobody's: bound tokens are refused to it. */
        if (socket_cred_process(fd, cred, &c->start_time) >= 0)
                c->pid = cred->pid;
        c->watched = EPOLLIN;
        c->next = s->connections;
        if (c->next)
                c->next->prev = c;
        s->connections = c;
        s->n_connections++;
        atomic_store_explicit(&s->open_connections, s->n_connections, memory_order_relaxed);
        r = sd_event_add_io(s->event, &c->io, fd, EPOLLIN, on_connection_io, c);
        if (r < 0) {
                connection_free(s, c);
                return r;
        }
        atomic_fetch_add_explicit(&s->connections_total, 1, memory_order_relaxed);
        connection_touch(s, c);
        return 0;
}

static int on_listener_io(sd_event_source *source, int listen_fd, uint32_t revents,
                          void *userdata) {
        ShardServer *s = userdata;

        for (unsigned i = 0; i < 64; i++) {
                int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
                if (fd < 0) {
                        if (errno == EAGAIN)
                                return 0;
                        if (errno == EINTR || errno == ECONNABORTED)
                                continue;
                        log_warning_errno(-errno, "Shard socket: failed to accept a connection, "
                                                  "pausing: %m");
                        (void) sd_event_source_set_enabled(s->listener, SD_EVENT_OFF);
                        timer_set(s->accept_resume,
                                  loop_now(s) + SHARD_SOCKET_ACCEPT_PAUSE_MS * 1000u);
                        return 0;
                }

                unsigned max = atomic_load(&s->max_connections), suppressed;
                if (s->n_connections >= max) {
                        if (ratelimit_pass(s, &s->cap_log, &suppressed))
                                log_warning("Shard socket: %u connections open, the maximum; "
                                            "closing a new one (%u more closed since the last "
                                            "message)",
                                            max, suppressed);
                        atomic_fetch_add_explicit(&s->refused_total, 1, memory_order_relaxed);
                        safe_close(fd);
                        continue;
                }

                struct ucred cred;
                socklen_t len = sizeof cred;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
                        log_debug_errno(-errno, "Shard socket: failed to read the client's "
                                                "credentials, closing the connection: %m");
                        safe_close(fd);
                        continue;
                }
                unsigned max_uid = atomic_load(&s->max_connections_per_uid);
                if (server_count_uid(s, cred.uid) >= max_uid) {
                        if (ratelimit_pass(s, &s->uid_cap_log, &suppressed))
                                log_warning("Shard socket: uid %u has %u connections "
                                            "open, the maximum per user; closing a new one "
                                            "(%u more closed since the last message)",
                                            (unsigned) cred.uid, max_uid, suppressed);
                        atomic_fetch_add_explicit(&s->refused_total, 1, memory_order_relaxed);
                        safe_close(fd);
                        continue;
                }

                bool admin = socket_cred_is_admin(fd, &cred, (gid_t) atomic_load(&s->admin_gid));
                int r = connection_new(s, fd, &cred, admin);
                if (r < 0)
                        log_warning_errno(r, "Shard socket: failed to watch a connection, "
                                             "closing it: %m");
        }
        return 0;
}

static int on_accept_resume(sd_event_source *source, uint64_t usec, void *userdata) {
        ShardServer *s = userdata;

        (void) sd_event_source_set_enabled(s->listener, SD_EVENT_ON);
        return 0;
}

static int on_stop(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        return sd_event_exit(sd_event_source_get_event(source), 0);
}

static void *server_thread(void *userdata) {
        ShardServer *s = userdata;

        int r = sd_event_loop(s->event);
        if (r < 0)
                log_error_errno(r, "Shard socket: the event loop failed, stopping: %m");
        return NULL;
}

static ShardServer *shard_server_alloc(ShardTable *table) {
        ShardServer *s = calloc(1, sizeof *s);
        if (!s)
                return NULL;
        s->listen_fd = s->stop_fd = -1;
        s->table = shard_table_ref(table);
        atomic_init(&s->idle_timeout_ms, SHARD_SOCKET_IDLE_TIMEOUT_MS);
        atomic_init(&s->max_connections, SHARD_SOCKET_MAX_CONNECTIONS);
        atomic_init(&s->max_connections_per_uid, SHARD_SOCKET_MAX_CONNECTIONS_PER_UID);
        atomic_init(&s->unread_timeout_ms, SHARD_SOCKET_UNREAD_TIMEOUT_MS);
        atomic_init(&s->admin_gid, (unsigned) (gid_t) -1);
        return s;
}

static int shard_server_start(ShardServer *s);

int shard_server_adopt(int fd, ShardTable *table, ShardServer **ret) {
        _cleanup_(shard_server_freep) ShardServer *s = NULL;
        int r;

        s = shard_server_alloc(table);
        if (!s) {
                safe_close(fd);
                return -ENOMEM;
        }
        s->listen_fd = fd; /* s->path stays NULL: the socket file is not ours to remove */
        r = shard_server_start(s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s);
        return 0;
}

int shard_server_new(const char *path, ShardTable *table, ShardServer **ret) {
        _cleanup_(shard_server_freep) ShardServer *s = NULL;
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int r;

        if (strlen(path) >= sizeof sa.sun_path)
                return log_error_errno(-ENAMETOOLONG, "Shard socket path %s is too long", path);
        memcpy(sa.sun_path, path, strlen(path));

        s = shard_server_alloc(table);
        if (!s)
                return -ENOMEM;

        s->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (s->listen_fd < 0)
                return log_error_errno(-errno, "Failed to create the shard socket: %m");
        /* The API socket's lock makes us the only daemon: whatever is here is stale. */
        (void) unlink(path);
        if (bind(s->listen_fd, (struct sockaddr *) &sa, sizeof sa) < 0)
                return log_error_errno(-errno, "Failed to bind %s: %m", path);
        s->path = strdup(path);
        if (!s->path)
                return -ENOMEM;
        if (chmod(path, 0660) < 0)
                return log_error_errno(-errno, "Failed to set the mode of %s: %m", path);
        if (listen(s->listen_fd, SOMAXCONN) < 0)
                return log_error_errno(-errno, "Failed to listen on %s: %m", path);

        r = shard_server_start(s);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(s);
        return 0;
}

/* The listening socket is in place: the loop, its sources and the thread that runs it. */
static int shard_server_start(ShardServer *s) {
        sigset_t all, old;
        int r;

        s->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (s->stop_fd < 0)
                return log_error_errno(-errno, "Failed to create an eventfd: %m");
        r = sd_event_new(&s->event);
        if (r < 0)
                return log_error_errno(r, "Failed to create the shard socket's event loop: %m");
        r = sd_event_add_io(s->event, &s->listener, s->listen_fd, EPOLLIN, on_listener_io, s);
        if (r < 0)
                return log_error_errno(r, "Failed to watch the shard socket: %m");
        r = sd_event_add_io(s->event, &s->stopper, s->stop_fd, EPOLLIN, on_stop, s);
        if (r < 0)
                return log_error_errno(r, "Failed to watch an eventfd: %m");
        r = timer_new(s, &s->expire, on_expire);
        if (r >= 0)
                r = timer_new(s, &s->recheck, on_recheck);
        if (r >= 0)
                r = timer_new(s, &s->accept_resume, on_accept_resume);
        if (r >= 0)
                r = timer_new(s, &s->sweep, on_sweep);
        if (r >= 0)
                timer_set(s->sweep, SHARD_SOCKET_DEPOSIT_SWEEP_MS * 1000u);
        if (r < 0)
                return log_error_errno(r, "Failed to create the shard socket's timers: %m");

        /* Signals belong to the main loop's signalfd: the thread starts with all blocked. */
        (void) sigfillset(&all);
        r = -pthread_sigmask(SIG_BLOCK, &all, &old);
        if (r < 0)
                return log_error_errno(r, "Failed to block signals: %m");
        r = -pthread_create(&s->thread, NULL, server_thread, s);
        (void) pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (r < 0)
                return log_error_errno(r, "Failed to start the shard socket thread: %m");
        s->thread_started = true;
        return 0;
}

ShardServer *shard_server_free(ShardServer *s) {
        if (!s)
                return NULL;

        if (s->thread_started) {
                uint64_t one = 1;
                /* An eventfd write of 1 cannot fail short of a counter at its maximum. */
                (void) write(s->stop_fd, &one, sizeof one);
                (void) pthread_join(s->thread, NULL);
        }
        /* The thread is gone: its loop and connections are ours to free. */
        while (s->connections)
                connection_free(s, s->connections);
        sd_event_source_disable_unref(s->listener);
        sd_event_source_disable_unref(s->stopper);
        sd_event_source_disable_unref(s->expire);
        sd_event_source_disable_unref(s->recheck);
        sd_event_source_disable_unref(s->accept_resume);
        sd_event_source_disable_unref(s->sweep);
        sd_event_unref(s->event);
        if (s->path)
                (void) unlink(s->path);
        safe_close(s->listen_fd);
        safe_close(s->stop_fd);
        shard_table_unref(s->table);
        free(s->path);
        return mfree(s);
}

void shard_server_set_idle_timeout(ShardServer *s, unsigned msec) {
        atomic_store(&s->idle_timeout_ms, msec > 0 ? msec : SHARD_SOCKET_IDLE_TIMEOUT_MS);
}

void shard_server_set_max_connections(ShardServer *s, unsigned n) {
        atomic_store(&s->max_connections, n > 0 ? n : SHARD_SOCKET_MAX_CONNECTIONS);
}

void shard_server_set_max_connections_per_uid(ShardServer *s, unsigned n) {
        atomic_store(&s->max_connections_per_uid, n > 0 ? n : SHARD_SOCKET_MAX_CONNECTIONS_PER_UID);
}

void shard_server_set_unread_timeout(ShardServer *s, unsigned msec) {
        atomic_store(&s->unread_timeout_ms, msec > 0 ? msec : SHARD_SOCKET_UNREAD_TIMEOUT_MS);
}

void shard_server_set_checkpoint_deposits(ShardServer *s, CheckpointDeposits *deposits) {
        atomic_store(&s->deposits, deposits);
}

void shard_server_set_admin_gid(ShardServer *s, gid_t gid) {
        atomic_store(&s->admin_gid, (unsigned) gid);
}

void shard_server_counters(ShardServer *s, ShardServerCounters *ret) {
        *ret = (ShardServerCounters) {
                .connections = atomic_load_explicit(&s->open_connections, memory_order_relaxed),
                .connections_total = atomic_load_explicit(&s->connections_total,
                                                          memory_order_relaxed),
                .refused_total = atomic_load_explicit(&s->refused_total, memory_order_relaxed),
                .handouts_total = atomic_load_explicit(&s->handouts_total, memory_order_relaxed),
                .descriptors_total = atomic_load_explicit(&s->descriptors_total,
                                                          memory_order_relaxed),
        };
}

/* rogue-peer.c: the attacks on the peer protocol that docs/security.md lists, one per subcommand, against a real familyd. */

/*
 * DESIGN: a member that errs or lies, or an outsider, built from the daemon's own peer layer
 * (peer-ucx.c: the bootstrap handshake, with --key the cluster key's proofs and every frame's
 * MAC) and codec (codec-peer.c), so everything it sends is what a real daemon could send; only
 * the contents lie. Each subcommand dials --target once, sends its messages, runs the worker
 * for --wait-ms to take the answers (printed one a line: "answer: REFUSE reason", "answer:
 * WHO"; with --key, a hello's sender as "record: NAME proven" when its record MAC verifies
 * under the key, else "record: NAME unproven"), and exits: 0 when the link came up and the messages went out, 3 when the handshake
 * failed (a wrong key, no key against a keyed daemon), 1 on a usage error. `flood` holds idle
 * TCP connections to the peer port instead, from --bind.
 *
 *   rogue-peer join     --target A [--key F] [--name N] [--rank R] [--devices D] [--version V]
 *                       [--address A --listen-port P: the daemon dials us back, with its hello]
 *   rogue-peer refuse   --target A [--key F] --victim N --victim-address A
 *   rogue-peer version  --target A [--key F] --version V [--name N] [--join]
 *   rogue-peer restart  --target A [--key F] --victim N --victim-address A [--devices D]
 *   rogue-peer members  --target A [--key F] --count N [--devices D]
 *   rogue-peer replay   --target A --key F
 *   rogue-peer relink   --target A --key F --victim N --victim-address A
 *   rogue-peer pair     --target A [--key F] [--name N] [--address A] [--wait-ms W]
 *   rogue-peer flood    --target A --count N --hold-ms H [--bind HOST]
 */

#include <arpa/inet.h>
#include <getopt.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include "codec/codec-peer.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/random.h"
#include "peer/peer-key.h"
#include "peer/peer-record.h"
#include "peer/peer-ucx.h"

typedef struct Options {
        const char *command;
        const char *target;
        const char *key;
        const char *name;
        const char *victim;
        const char *victim_address;
        const char *address;
        const char *bind;
        unsigned listen_port; /* 0: any */
        int64_t rank;
        unsigned devices;
        unsigned count;
        uint64_t version;
        unsigned wait_ms;
        unsigned hold_ms;
        bool join;
} Options;

typedef struct Rogue {
        sd_event *event;
        PeerUcx *ucx;
        PeerEndpoint *ep;
        bool failed;
        unsigned answers;
        PeerKeys keys; /* --key's: hellos' records checked with them */
} Rogue;

static const char *body_name(PeerBody b) {
        static const char *const names[_PEER_BODY_MAX] = {
                [PEER_HEARTBEAT] = "HEARTBEAT", [PEER_HELLO] = "HELLO",
                [PEER_ANNOUNCE] = "ANNOUNCE",   [PEER_FORGET] = "FORGET",
                [PEER_REFUSE] = "REFUSE",       [PEER_WHO] = "WHO",
                [PEER_PING] = "PING",           [PEER_ACK] = "ACK",
                [PEER_PING_REQ] = "PING_REQ",   [PEER_VERDICTS] = "VERDICTS",
        };
        return b >= 0 && b < _PEER_BODY_MAX ? names[b] : "?";
}

static void on_message(void *userdata, const uint8_t *data, size_t size, void *reply) {
        _cleanup_(peer_message_done) PeerMessage m = {};
        Rogue *r = userdata;

        if (codec_peer_decode(data, size, &m) < 0)
                return;
        if (m.body == PEER_HELLO && r->keys.n > 0 && !m.sender.partial) {
                printf("record: %s %s\n", m.sender.name,
                       peer_record_verify(&r->keys, &m.sender) ? "proven" : "unproven");
                fflush(stdout);
        }
        if (m.body != PEER_REFUSE && m.body != PEER_WHO)
                return; /* a daemon's own heartbeats and hellos, when we joined */
        r->answers++;
        printf("answer: %s %s\n", body_name(m.body), strempty(m.reason));
        fflush(stdout);
}

static void on_failure(void *userdata, PeerEndpoint *ep, const char *cause) {
        Rogue *r = userdata;

        if (ep != r->ep)
                return;
        r->failed = true;
        r->ep = NULL;
        printf("link failed: %s\n", cause);
        fflush(stdout);
}

static int on_wakeup(sd_event_source *source, int fd, uint32_t revents, void *userdata) {
        return 0;
}

static void rogue_run(Rogue *r, unsigned ms) {
        int64_t end = now_ms() + ms;

        do {
                peer_ucx_dispatch(r->ucx);
                (void) sd_event_run(r->event, 5000);
        } while (now_ms() < end);
        peer_ucx_dispatch(r->ucx);
}

static int rogue_open(Rogue *r, const Options *o) {
        PeerUcxCallbacks cb = { .on_message = on_message, .on_failure = on_failure,
                                .userdata = r };
        _cleanup_free_ char *listen = NULL;
        int ret;

        if (o->key && peer_keys_load(o->key, &r->keys) < 0)
                return 1;
        if (asprintf(&listen, "%s:%u", o->bind, o->listen_port) < 0)
                return 1;
        if (sd_event_new(&r->event) < 0)
                return 1;
        ret = peer_ucx_new(r->event, listen, &r->keys, &cb, &r->ucx);
        if (ret < 0)
                return 1;
        if (sd_event_add_io(r->event, NULL, peer_ucx_fd(r->ucx), POLLIN, on_wakeup, NULL) < 0)
                return 1;
        if (peer_ucx_connect(r->ucx, o->target, r, &r->ep) < 0) {
                printf("link failed: cannot dial %s\n", o->target);
                return 3;
        }
        for (int64_t end = now_ms() + 6000; now_ms() < end && !r->failed &&
                                            !peer_ucx_endpoint_ready(r->ep);)
                rogue_run(r, 15);
        if (!peer_ucx_endpoint_ready(r->ep)) {
                printf("handshake refused\n");
                return 3;
        }
        printf("handshake ok\n");
        return 0;
}

static void rogue_close(Rogue *r) {
        if (r->ucx) {
                peer_ucx_close(r->ucx, r->ep);
                peer_ucx_free(r->ucx);
        }
        sd_event_unref(r->event);
        peer_keys_wipe(&r->keys);
}

/* Devices as a node would describe its GPUs: n of them (the attack's 256). */
static Device *fake_devices(unsigned n, uint64_t seed) {
        Device *d = calloc(n ? n : 1, sizeof(Device));

        for (unsigned i = 0; d && i < n; i++) {
                d[i].local_index = (int32_t) i;
                d[i].kind = strdup("cuda");
                d[i].numa_node = (int32_t) (i % 2);
                d[i].memory_bytes = UINT64_C(80) << 30;
                if (asprintf(&d[i].name, "NVIDIA H100 80GB HBM3 #%u", i) < 0)
                        d[i].name = NULL;
                if (asprintf(&d[i].uuid, "GPU-%016" PRIx64 "-%04x", seed, i) < 0)
                        d[i].uuid = NULL;
                if (asprintf(&d[i].pci_bus_id, "0000:%02x:00.0", i % 256) < 0)
                        d[i].pci_bus_id = NULL;
        }
        return d;
}

static void fake_member(MemberInfo *m, const char *name, const char *address, int64_t rank,
                        unsigned devices, int64_t started) {
        *m = (MemberInfo) { .name = strdup(name), .address = strdup(address),
                            .node_rank = rank, .started_unix_ms = started };
        (void) random_bytes(&m->boot_id, sizeof m->boot_id);
        m->devices = fake_devices(devices, m->boot_id);
        m->n_devices = devices;
}

static int rogue_send(Rogue *r, PeerMessage *m) {
        uint8_t *buf;
        size_t size;

        if (codec_peer_encode(m, &buf, &size) < 0 || !r->ep)
                return -EIO;
        return peer_ucx_send(r->ucx, r->ep, buf, size);
}

/* A node of our own: a hello (which makes it a member, given the key), then heartbeats. */
static int attack_join(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo self = {};
        PeerMessage hello = { .body = PEER_HELLO, .version = o->version };

        fake_member(&self, o->name, o->address, o->rank, o->devices, now_unix_ms());
        hello.sender = self;
        if (rogue_send(r, &hello) < 0)
                return 3;
        for (unsigned t = 0; t < o->wait_ms; t += 100) {
                PeerMessage hb = { .body = PEER_HEARTBEAT, .sender = self, .version = o->version };
                hb.sender.partial = true;
                hb.sender.n_devices = 0;
                (void) rogue_send(r, &hb);
                rogue_run(r, 100);
        }
        return 0;
}

/* Two nodes of our own say hello 15 ms apart on one link, then nothing: the daemon's second
 * change falls within its publish gap (PROTOCOL_PUBLISH_GAP_MS) and is published soon all the
 * same, with nothing else to wake it. The second is NAME-2 at --address's port + 1. */
static int attack_pair(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo first = {}, second = {};
        _cleanup_free_ char *name = NULL, *address = NULL, *host = NULL, *port = NULL;

        if (peer_address_split(o->address, &host, &port) < 0 ||
            asprintf(&name, "%s-2", o->name) < 0 ||
            asprintf(&address, "%s:%lu", host, strtoul(port, NULL, 10) + 1) < 0)
                return 1;
        fake_member(&first, o->name, o->address, -1, o->devices, now_unix_ms());
        fake_member(&second, name, address, -1, o->devices, now_unix_ms());
        if (rogue_send(r, &(PeerMessage) { .body = PEER_HELLO, .sender = first,
                                           .version = o->version }) < 0)
                return 3;
        rogue_run(r, 15);
        if (rogue_send(r, &(PeerMessage) { .body = PEER_HELLO, .sender = second,
                                           .version = o->version }) < 0)
                return 3;
        printf("sent: %s %s\n", o->name, name);
        fflush(stdout);
        rogue_run(r, o->wait_ms);
        return 0;
}

/* A refusal in the victim's name, on our own link: it must close nothing of the victim's. */
static int attack_refuse(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo victim = {};
        PeerMessage m = { .body = PEER_REFUSE, .version = 1,
                          .reason = (char *) "node rank 0 is already taken" };

        fake_member(&victim, o->victim, o->victim_address, -1, 0, now_unix_ms());
        m.sender = victim;
        if (rogue_send(r, &m) < 0)
                return 3;
        rogue_run(r, o->wait_ms);
        return 0;
}

/* A heartbeat of a start nobody knows with a huge version; --join: as a member first. */
static int attack_version(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo self = {};
        PeerMessage m = { .body = PEER_HEARTBEAT, .version = o->version };

        fake_member(&self, o->name, o->address, -1, o->join ? 1 : 0, now_unix_ms());
        if (o->join) {
                PeerMessage hello = { .body = PEER_HELLO, .sender = self, .version = 1 };
                if (rogue_send(r, &hello) < 0)
                        return 3;
                rogue_run(r, 300);
                hello.version = o->version;
                (void) rogue_send(r, &hello);
        }
        m.sender = self;
        m.sender.partial = true;
        m.sender.n_devices = 0;
        for (unsigned i = 0; i < 5; i++) {
                if (rogue_send(r, &m) < 0)
                        return 3;
                rogue_run(r, 50);
        }
        rogue_run(r, o->wait_ms);
        return 0;
}

/* A later start of a live node (same name and address, 256 devices), an announce of it, and
 * a forget of the node. */
static int attack_restart(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo forged = {}, self = {};
        PeerKnown known = { .age_ms = 0 };

        fake_member(&forged, o->victim, o->victim_address, -1, o->devices,
                    now_unix_ms() + 3600 * 1000);
        fake_member(&self, o->name, o->address, -1, 0, now_unix_ms());
        PeerMessage hello = { .body = PEER_HELLO, .sender = forged, .version = 1 };
        if (rogue_send(r, &hello) < 0)
                return 3;
        known.info = forged;
        PeerMessage announce = { .body = PEER_ANNOUNCE, .sender = self, .version = 1,
                                 .members = &known, .n_members = 1 };
        (void) rogue_send(r, &announce);
        PeerMessage forget = { .body = PEER_FORGET, .sender = self, .version = 1,
                               .forget_name = (char *) o->victim };
        (void) rogue_send(r, &forget);
        rogue_run(r, o->wait_ms);
        return 0;
}

/* A member's own link, once believed, then used for another node's later start. */
static int attack_relink(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo self = {}, forged = {};

        fake_member(&self, o->name, o->address, -1, 0, now_unix_ms());
        fake_member(&forged, o->victim, o->victim_address, -1, 1, now_unix_ms() + 3600 * 1000);
        PeerMessage hello = { .body = PEER_HELLO, .sender = self, .version = 1 };
        if (rogue_send(r, &hello) < 0)
                return 3;
        rogue_run(r, 300);
        hello.sender = forged;
        if (rogue_send(r, &hello) < 0)
                return 3;
        rogue_run(r, o->wait_ms);
        return 0;
}

/* A hello listing --count made-up members of --devices devices each. */
static int attack_members(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo self = {};
        PeerKnown *known = calloc(o->count ? o->count : 1, sizeof(PeerKnown));
        int ret = 0;

        if (!known)
                return 1;
        fake_member(&self, o->name, o->address, -1, 0, now_unix_ms());
        for (unsigned i = 0; i < o->count; i++) {
                char name[64], address[64];
                (void) snprintf(name, sizeof name, "%s-fake%u", o->name, i);
                (void) snprintf(address, sizeof address, "127.0.0.3:%u", 20000 + i);
                fake_member(&known[i].info, name, address, -1, o->devices, now_unix_ms());
        }
        PeerMessage hello = { .body = PEER_HELLO, .sender = self, .version = 1,
                              .members = known, .n_members = o->count };
        if (rogue_send(r, &hello) < 0)
                ret = 3;
        else
                rogue_run(r, o->wait_ms);
        for (unsigned i = 0; i < o->count; i++)
                member_info_done(&known[i].info);
        free(known);
        return ret;
}

/* Frames numbered as a replay would be: 1 (the hello) again, then 10, then 5 (reordered, out
 * of order but new: taken) and 10 again (a replay). */
static int attack_replay(Rogue *r, const Options *o) {
        _cleanup_(member_info_done) MemberInfo self = {};
        static const uint64_t seqs[] = { 1, 1, 10, 5, 10, 1 };
        uint8_t *buf;
        size_t size;

        fake_member(&self, o->name, o->address, -1, 0, now_unix_ms());
        for (size_t i = 0; i < ELEMENTSOF(seqs); i++) {
                PeerMessage m = { .body = i == 0 ? PEER_HELLO : PEER_HEARTBEAT, .sender = self,
                                  .version = 1 };
                m.sender.partial = i > 0;
                if (codec_peer_encode(&m, &buf, &size) < 0 ||
                    peer_ucx_send_numbered(r->ucx, r->ep, buf, size, seqs[i]) < 0)
                        return 3;
                rogue_run(r, 50);
        }
        rogue_run(r, o->wait_ms);
        return 0;
}

static int flood_connect(const struct sockaddr_in *from, const struct sockaddr_in *to) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

        if (fd < 0)
                return -1;
        if (bind(fd, (const struct sockaddr *) from, sizeof *from) < 0 ||
            connect(fd, (const struct sockaddr *) to, sizeof *to) < 0) {
                close(fd);
                return -1;
        }
        return fd;
}

/* --count idle TCP connections to the peer port from --bind, for --hold-ms: each one the
 * daemon closes is opened again (at most every 50 ms a round), as the flood attack does. */
static int attack_flood(const Options *o) {
        _cleanup_free_ struct pollfd *fds = calloc(o->count ? o->count : 1, sizeof(struct pollfd));
        _cleanup_free_ char *host = NULL, *port = NULL;
        struct sockaddr_in to = { .sin_family = AF_INET }, from = { .sin_family = AF_INET };
        unsigned opened = 0, closed = 0;

        if (!fds || peer_address_split(o->target, &host, &port) < 0 ||
            inet_pton(AF_INET, host, &to.sin_addr) != 1 ||
            inet_pton(AF_INET, o->bind, &from.sin_addr) != 1) {
                fprintf(stderr, "flood: --target and --bind must be IPv4 addresses\n");
                return 1;
        }
        to.sin_port = htons((uint16_t) atoi(port));
        for (unsigned i = 0; i < o->count; i++)
                fds[i] = (struct pollfd) { .fd = -1, .events = POLLIN };
        for (int64_t end = now_ms() + o->hold_ms; now_ms() < end;) {
                for (unsigned i = 0; i < o->count; i++)
                        if (fds[i].fd < 0) {
                                fds[i].fd = flood_connect(&from, &to);
                                opened += fds[i].fd >= 0;
                        }
                (void) poll(fds, o->count, 50);
                for (unsigned i = 0; i < o->count; i++)
                        if (fds[i].fd >= 0 && fds[i].revents) {
                                close(fds[i].fd);
                                fds[i].fd = -1;
                                closed++;
                        }
                usleep(50 * 1000);
        }
        for (unsigned i = 0; i < o->count; i++)
                if (fds[i].fd >= 0)
                        close(fds[i].fd);
        printf("flood: opened %u, closed by the daemon %u\n", opened, closed);
        return 0;
}

static int parse(int argc, char **argv, Options *o) {
        static const struct option longopts[] = {
                { "target", required_argument, NULL, 't' },
                { "key", required_argument, NULL, 'k' },
                { "name", required_argument, NULL, 'n' },
                { "rank", required_argument, NULL, 'r' },
                { "devices", required_argument, NULL, 'd' },
                { "count", required_argument, NULL, 'c' },
                { "version", required_argument, NULL, 'v' },
                { "victim", required_argument, NULL, 'V' },
                { "victim-address", required_argument, NULL, 'A' },
                { "address", required_argument, NULL, 'a' },
                { "bind", required_argument, NULL, 'b' },
                { "listen-port", required_argument, NULL, 'p' },
                { "wait-ms", required_argument, NULL, 'w' },
                { "hold-ms", required_argument, NULL, 'h' },
                { "join", no_argument, NULL, 'j' },
                {}
        };
        int c;

        *o = (Options) { .name = "rogue", .address = "127.0.0.2:1", .bind = "127.0.0.2",
                         .rank = -1, .devices = 8, .version = 1, .wait_ms = 1000,
                         .hold_ms = 5000 };
        if (argc < 2)
                return -EINVAL;
        o->command = argv[1];
        optind = 2;
        while ((c = getopt_long(argc, argv, "", longopts, NULL)) >= 0)
                switch (c) {
                case 't': o->target = optarg; break;
                case 'k': o->key = optarg; break;
                case 'n': o->name = optarg; break;
                case 'r': o->rank = strtoll(optarg, NULL, 10); break;
                case 'd': o->devices = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'c': o->count = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'v': o->version = strtoull(optarg, NULL, 0); break;
                case 'V': o->victim = optarg; break;
                case 'A': o->victim_address = optarg; break;
                case 'a': o->address = optarg; break;
                case 'b': o->bind = optarg; break;
                case 'p': o->listen_port = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'w': o->wait_ms = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'h': o->hold_ms = (unsigned) strtoul(optarg, NULL, 10); break;
                case 'j': o->join = true; break;
                default: return -EINVAL;
                }
        if (!o->target || ((streq(o->command, "refuse") || streq(o->command, "restart") ||
                            streq(o->command, "relink")) &&
                           (!o->victim || !o->victim_address)))
                return -EINVAL;
        return 0;
}

int main(int argc, char **argv) {
        static const struct {
                const char *name;
                int (*attack)(Rogue *r, const Options *o);
        } attacks[] = {
                { "join", attack_join },       { "refuse", attack_refuse },
                { "version", attack_version }, { "restart", attack_restart },
                { "members", attack_members }, { "replay", attack_replay },
                { "relink", attack_relink },   { "pair", attack_pair },
        };
        Rogue r = {};
        Options o;
        int ret = 1;

        log_set_max_level(LOG_WARNING);
        if (parse(argc, argv, &o) < 0) {
                fprintf(stderr, "usage: rogue-peer join|refuse|version|restart|members|replay|relink|"
                                "pair|flood --target HOST:PORT [options] (see the source's "
                                "DESIGN)\n");
                return 1;
        }
        if (streq(o.command, "flood"))
                return attack_flood(&o);
        for (size_t i = 0; i < ELEMENTSOF(attacks); i++) {
                if (!streq(o.command, attacks[i].name))
                        continue;
                ret = rogue_open(&r, &o);
                if (ret == 0)
                        ret = attacks[i].attack(&r, &o);
                if (ret == 0)
                        rogue_run(&r, 200); /* what is in flight leaves */
                printf("answers: %u\n", r.answers);
                rogue_close(&r);
                return ret;
        }
        fprintf(stderr, "rogue-peer: unknown attack '%s'\n", o.command);
        return 1;
}

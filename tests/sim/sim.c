/* sim.c: familyd-sim, the membership protocol measured at 10 to 10,000 simulated members. */

/*
 * For each size: N nodes start from one seed (node i at i/N of --start-spread-ms), and run until
 * they agree; then at rest; one node joins the settled cluster; one crashes (first suspect, all
 * see it down; under --crash-loss percent of loss) and restarts; the cluster splits in two halves for twice --down-ms and heals;
 * then --loss-s seconds at 1% and at 5% loss, counting suspicions of live members. One markdown
 * table per run on stdout. With --check, exit 1 when a run does not agree or a crash is seen
 * later than the timeouts allow (the CI test sim-small).
 */

#include <getopt.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sim-net.h"

typedef struct SimOptions {
        SimConfig config;
        size_t sizes[16];
        size_t n_sizes;
        unsigned start_spread_ms, rest_s, loss_s, partition_s;
        unsigned crash_loss_percent; /* loss while a crash is being detected */
        bool check;
        bool heal_trace; /* a stderr line per simulated second of a heal */
} SimOptions;

typedef struct SimRow {
        size_t n;
        double converge_s, converge_rounds;
        double start_msgs_per_node, start_kib_per_node;
        double mem_kib_per_node;
        double rest_bytes, rest_msgs; /* per node per second */
        double join_s, join_msgs, join_kib;
        double first_suspect_s, all_down_s, restart_s, heal_s;
        uint64_t false_1, false_5, down_1, down_5;
        double wall_s;
        bool ok;
} SimRow;

#define SIM_AGREE_LIMIT_US (INT64_C(600) * 1000000)

static double wall_now(void) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static size_t heap_in_use(void) {
        struct mallinfo2 mi = mallinfo2();
        return mi.uordblks + mi.hblkhd;
}

static size_t rss_bytes(void) {
        FILE *f = fopen("/proc/self/statm", "re");
        unsigned long size = 0, resident = 0;

        if (!f)
                return 0;
        if (fscanf(f, "%lu %lu", &size, &resident) != 2)
                resident = 0;
        fclose(f);
        return resident * 4096;
}

/* Memory in use: the heap as malloc counts it, or the resident size where a sanitizer's
 * allocator hides it. */
static size_t memory_in_use(void) {
        size_t h = heap_in_use();
        return h > 0 ? h : rss_bytes();
}

static double seconds(int64_t us) {
        return us < 0 ? -1 : (double) us / 1e6;
}

/* N nodes start from node 0, spread over start_spread_ms; they run until they agree. */
static void phase_start(Sim *s, const SimOptions *o, size_t n, SimRow *row) {
        size_t mem0 = memory_in_use();
        int64_t spread = (int64_t) o->start_spread_ms * 1000, last_start, at;

        for (size_t i = 0; i < n; i++) {
                sim_run_until(s, (int64_t) i * spread / (int64_t) n);
                if (sim_start(s, i, i == 0 ? -1 : 0) < 0) {
                        fprintf(stderr, "familyd-sim: cannot start node %zu\n", i);
                        exit(EXIT_FAILURE);
                }
        }
        last_start = s->now_us;
        at = sim_run_to_agreement(s, last_start + SIM_AGREE_LIMIT_US, 100000);
        row->converge_s = at < 0 ? -1 : seconds(at - last_start);
        row->converge_rounds = at < 0 ? -1 : (double) (at - last_start) /
                                                     (o->config.heartbeat_ms * 1000.0);
        row->start_msgs_per_node = (double) s->total.messages / (double) n;
        row->start_kib_per_node = (double) s->total.bytes / 1024.0 / (double) n;
        row->mem_kib_per_node = ((double) memory_in_use() - (double) mem0) / 1024.0 / (double) n;
        row->ok = at >= 0;
}

static void phase_rest(Sim *s, const SimOptions *o, size_t n, SimRow *row) {
        SimCounters c0 = s->total;

        sim_run_until(s, s->now_us + (int64_t) o->rest_s * 1000000);
        row->rest_msgs = (double) (s->total.messages - c0.messages) / (double) n / o->rest_s;
        row->rest_bytes = (double) (s->total.bytes - c0.bytes) / (double) n / o->rest_s;
}

/* Node n joins through node 0: the traffic beyond the cluster's rest, and the time. */
static void phase_join(Sim *s, size_t n, SimRow *row) {
        SimCounters c0 = s->total;
        int64_t t0 = s->now_us, at;

        if (sim_start(s, n, 0) < 0)
                exit(EXIT_FAILURE);
        at = sim_run_to_agreement(s, t0 + SIM_AGREE_LIMIT_US, 10000);
        row->ok = row->ok && at >= 0;
        row->join_s = seconds(at - t0);
        double rest_msgs = row->rest_msgs * (double) n * seconds(s->now_us - t0);
        double rest_bytes = row->rest_bytes * (double) n * seconds(s->now_us - t0);
        row->join_msgs = MAX(0.0, (double) (s->total.messages - c0.messages) - rest_msgs);
        row->join_kib = MAX(0.0, (double) (s->total.bytes - c0.bytes) - rest_bytes) / 1024.0;
}

/* A node other than the seed crashes; it restarts once every other node sees it down. */
static void phase_crash(Sim *s, const SimOptions *o, size_t n, SimRow *row) {
        size_t victim = 1 + (size_t) (sim_random(s) % n);
        int64_t t0 = s->now_us, limit = t0 + (int64_t) o->config.down_ms * 1000 * 10, at;

        sim_watch(s, (int64_t) victim);
        sim_crash(s, victim);
        s->config.loss = o->crash_loss_percent / 100.0;
        while (s->watch.all_down_us < 0 && s->now_us < limit)
                sim_run_until(s, s->now_us + 50000);
        s->config.loss = 0;
        row->first_suspect_s = s->watch.first_suspect_us < 0 ? -1 :
                                       seconds(s->watch.first_suspect_us - t0);
        row->all_down_s = s->watch.all_down_us < 0 ? -1 : seconds(s->watch.all_down_us - t0);
        sim_watch(s, -1);
        at = sim_run_to_agreement(s, s->now_us + SIM_AGREE_LIMIT_US, 100000);
        row->ok = row->ok && at >= 0;
        t0 = s->now_us;
        if (sim_start(s, victim, 0) < 0)
                exit(EXIT_FAILURE);
        at = sim_run_to_agreement(s, t0 + SIM_AGREE_LIMIT_US, 10000);
        row->restart_s = seconds(at - t0);
        row->ok = row->ok && at >= 0;
}

/* How many pairs of a running node and a member it holds down, and suspect. */
static void held_pairs(const Sim *s, uint64_t *ret_down, uint64_t *ret_suspect) {
        *ret_down = *ret_suspect = 0;
        for (size_t i = 0; i < s->n_nodes; i++) {
                unsigned c[_NODE_STATE_MAX] = {};
                if (!s->nodes[i].up)
                        continue;
                membership_count_states(protocol_membership(s->nodes[i].protocol), c);
                *ret_down += c[NODE_DOWN];
                *ret_suspect += c[NODE_SUSPECT];
        }
}

/* sim_run_to_agreement(), with a line on stderr per simulated second: how the heal goes. */
static int64_t run_to_agreement_traced(Sim *s, size_t n, int64_t until_us) {
        int64_t t0 = s->now_us, next = t0;

        while (s->now_us < until_us) {
                if (s->now_us >= next) {
                        uint64_t down, suspect;
                        held_pairs(s, &down, &suspect);
                        fprintf(stderr, "familyd-sim: %zu members: heal +%.0f s: %" PRIu64
                                        " pairs held down, %" PRIu64 " suspect, %.0f MB sent\n",
                                n, (double) (s->now_us - t0) / 1e6, down, suspect,
                                (double) s->total.bytes / 1e6);
                        next += 1000000;
                }
                sim_run_until(s, MIN(s->now_us + 10000, until_us));
                if (sim_agreed(s))
                        return s->now_us;
        }
        return -1;
}

/* Two halves apart for partition_s, then together: the time until they agree again. */
static void phase_partition(Sim *s, const SimOptions *o, size_t n, SimRow *row) {
        int64_t t0, at;

        for (size_t i = 0; i < s->n_nodes; i++)
                s->nodes[i].group = i < s->n_nodes / 2;
        sim_run_until(s, s->now_us + (int64_t) o->partition_s * 1000000);
        for (size_t i = 0; i < s->n_nodes; i++)
                s->nodes[i].group = 0;
        t0 = s->now_us;
        at = o->heal_trace ? run_to_agreement_traced(s, n, t0 + SIM_AGREE_LIMIT_US)
                           : sim_run_to_agreement(s, t0 + SIM_AGREE_LIMIT_US, 10000);
        row->heal_s = seconds(at - t0);
        row->ok = row->ok && at >= 0;
}

/* Suspicions (and downs, *ret_downs) of live members seen at some node under `loss`. */
static uint64_t phase_loss(Sim *s, const SimOptions *o, double loss, uint64_t *ret_downs) {
        s->config.loss = loss;
        s->false_suspicions = 0;
        s->false_downs = 0;
        s->count_suspicions = true;
        sim_run_until(s, s->now_us + (int64_t) o->loss_s * 1000000);
        s->count_suspicions = false;
        s->config.loss = 0;
        *ret_downs = s->false_downs;
        return s->false_suspicions;
}

/* Bytes per member entry per simulated node, measured (docs/scale.md): every node holds an
 * entry for every member (Member, its name and rank index slots: about 100 bytes), swim its
 * links of the moment (a newcomer greets every member it knows: the links of a cold start), and
 * all-to-all a link to every member for good (ProtocolLink, its address, its index slots and
 * the simulated endpoint: about 190 bytes); each member record itself once with shared records,
 * or once per table with --own-records (about 1 KiB with 8 GPUs). */
#define SIM_ENTRY_BYTES_SWIM 175.0
#define SIM_ENTRY_BYTES_ALL_TO_ALL 350.0
#define SIM_RECORD_BYTES_PER_DEVICE 220.0

static double estimated_bytes(const SimOptions *o, size_t n) {
        double entry = o->config.mode == PROTOCOL_SWIM ? SIM_ENTRY_BYTES_SWIM
                                                       : SIM_ENTRY_BYTES_ALL_TO_ALL;

        if (o->config.own_records)
                entry += SIM_RECORD_BYTES_PER_DEVICE * o->config.devices;
        return (double) n * (double) n * entry;
}

static double available_bytes(void) {
        FILE *f = fopen("/proc/meminfo", "re");
        char line[256];
        double kib = 0;

        if (!f)
                return 1e18;
        while (fgets(line, sizeof line, f))
                if (sscanf(line, "MemAvailable: %lf kB", &kib) == 1)
                        break;
        fclose(f);
        return kib > 0 ? kib * 1024.0 : 1e18;
}

/* Whether a size fits in the memory free now; when not, its row says so. */
static bool size_fits(const SimOptions *o, size_t n) {
        double need = estimated_bytes(o, n), have = available_bytes();

        if (need <= 0.8 * have)
                return true;
        printf("| %zu | not run: needs about %.1f GiB (%zu^2 member entries and links of about "
               "%.0f bytes), %.1f GiB free | | | | | | | | | | | | | | | |\n",
               n, need / 1073741824.0, n, need / ((double) n * (double) n),
               have / 1073741824.0);
        fflush(stdout);
        return false;
}

/* A line on stderr per phase, with its figures: a 10,000-member run takes an hour before its
 * row, and a run stopped early keeps what it measured. */
static void progress(const Sim *s, size_t n, const char *what, double w0) {
        fprintf(stderr, "familyd-sim: %zu members: %s at %.2f simulated s, %.0f s of wall time\n",
                n, what, (double) s->now_us / 1e6, wall_now() - w0);
}

static int run_size(const SimOptions *o, size_t n, SimRow *row) {
        SimConfig config = o->config;
        Sim *s;
        double w0 = wall_now();

        config.max_nodes = n + 1;
        if (sim_new(&config, &s) < 0)
                return -ENOMEM;
        *row = (SimRow) { .n = n };
        char what[256];

        phase_start(s, o, n, row);
        snprintf(what, sizeof what, "started (agreed %.2f s after the last start, %.0f msgs and "
                                    "%.0f KiB a node, %.1f KiB of memory a node)",
                 row->converge_s, row->start_msgs_per_node, row->start_kib_per_node,
                 row->mem_kib_per_node);
        progress(s, n, what, w0);
        phase_rest(s, o, n, row);
        phase_join(s, n, row);
        snprintf(what, sizeof what, "joined (rest %.0f B and %.1f msgs a node a second; join "
                                    "%.2f s, %.0f msgs, %.0f KiB)",
                 row->rest_bytes, row->rest_msgs, row->join_s, row->join_msgs, row->join_kib);
        progress(s, n, what, w0);
        phase_crash(s, o, n, row);
        snprintf(what, sizeof what, "crash detected, restarted (first suspect %.2f s, all down "
                                    "%.2f s, restart %.2f s)",
                 row->first_suspect_s, row->all_down_s, row->restart_s);
        progress(s, n, what, w0);
        phase_partition(s, o, n, row);
        snprintf(what, sizeof what, "partition healed (agreed %.2f s after the heal)",
                 row->heal_s);
        progress(s, n, what, w0);
        row->false_1 = phase_loss(s, o, 0.01, &row->down_1);
        snprintf(what, sizeof what, "1%% loss done (%" PRIu64 " false suspicions, %" PRIu64
                                    " false downs)", row->false_1, row->down_1);
        progress(s, n, what, w0);
        row->false_5 = phase_loss(s, o, 0.05, &row->down_5);
        row->wall_s = wall_now() - w0;
        sim_free(s);
        return 0;
}

static void print_header(const SimOptions *o) {
        const SimConfig *c = &o->config;

        printf("familyd-sim: membership %s; heartbeat %u ms, suspect %u ms, down %u ms; latency "
               "%u us + jitter < %u us; %u devices per node; start spread %u ms; rest %u s; "
               "partition %u s; loss windows %u s; loss while a crash is detected %u%%; seed %"
               PRIu64 "\n\n",
               protocol_mode_to_string(c->mode), c->heartbeat_ms, c->suspect_ms, c->down_ms,
               c->latency_us, c->jitter_us, c->devices, o->start_spread_ms, o->rest_s,
               o->partition_s, o->loss_s, o->crash_loss_percent, c->seed);
        printf("| members | agree s (rounds) | start msgs/node | start KiB/node | mem KiB/node "
               "| rest B/node/s | rest msgs/node/s | join s | join msgs | join KiB "
               "| first suspect s | all down s | restart s | heal s | false susp. 1%% "
               "| false susp. 5%% | false down 1%% | false down 5%% | wall s |\n");
        printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
               "|---:|---:|---:|\n");
}

static void print_row(const SimRow *r) {
        printf("| %zu | %.2f (%.1f) | %.0f | %.0f | %.1f | %.0f | %.1f | %.2f | %.0f | %.0f "
               "| %.2f | %.2f | %.2f | %.2f | %" PRIu64 " | %" PRIu64 " | %" PRIu64 " | %" PRIu64
               " | %.1f |\n",
               r->n, r->converge_s, r->converge_rounds, r->start_msgs_per_node,
               r->start_kib_per_node, r->mem_kib_per_node, r->rest_bytes, r->rest_msgs,
               r->join_s, r->join_msgs, r->join_kib, r->first_suspect_s, r->all_down_s,
               r->restart_s, r->heal_s, r->false_1, r->false_5, r->down_1, r->down_5, r->wall_s);
        fflush(stdout);
}

static double log2_ceil(size_t n) {
        double k = 0;

        while (((size_t) 1 << (size_t) k) < n)
                k++;
        return k;
}

/* Every run agreed, a crash was suspected and seen down within a tick of the timeouts (plus a
 * flush and the latency), and a join cost O(N) messages, not one per pair of members. swim: a
 * crash is suspected within 5 s (docs/scale.md's goal), and down everywhere within the
 * suspicion (membership_suspicion_ms()) after 3 log2 N heartbeats for the suspicion to
 * spread. */
static bool row_within_bounds(const SimOptions *o, const SimRow *r) {
        const SimConfig *c = &o->config;
        double tick = c->heartbeat_ms / 1000.0, slack = 0.1;
        double log_n = log2_ceil(r->n + 1), suspect_by = c->suspect_ms / 1000.0 + tick + slack;
        double down_by = c->down_ms / 1000.0 + tick + slack;
        bool ok = r->ok;

        if (c->mode == PROTOCOL_SWIM) {
                suspect_by = 5.0;
                down_by = r->first_suspect_s + 4 * log_n * tick + slack +
                          MAX((c->down_ms - c->suspect_ms) / 1000.0, log_n * tick);
        }
        ok = ok && r->first_suspect_s >= 0 && r->first_suspect_s <= suspect_by;
        ok = ok && r->all_down_s >= 0 && r->all_down_s <= down_by;
        ok = ok && r->converge_s >= 0 && r->converge_s <= 30;
        ok = ok && r->join_msgs <= 20.0 * (double) r->n;
        if (!ok)
                fprintf(stderr, "familyd-sim: %zu members: out of bounds (agreed: %s, first "
                        "suspect %.2f s, all down %.2f s, agree %.2f s, join %.0f messages)\n",
                        r->n, r->ok ? "yes" : "no", r->first_suspect_s, r->all_down_s,
                        r->converge_s, r->join_msgs);
        return ok;
}

static int parse_sizes(const char *arg, SimOptions *o) {
        _cleanup_free_ char *copy = strdup(arg);
        char *save = NULL;

        if (!copy)
                return -ENOMEM;
        o->n_sizes = 0;
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                char *end;
                unsigned long v = strtoul(t, &end, 10);
                if (*end || v < 2 || v > 100000 || o->n_sizes == ELEMENTSOF(o->sizes))
                        return -EINVAL;
                o->sizes[o->n_sizes++] = v;
        }
        return o->n_sizes > 0 ? 0 : -EINVAL;
}

static int parse_unsigned(const char *arg, unsigned *ret) {
        char *end;
        unsigned long v = strtoul(arg, &end, 10);

        if (*arg == 0 || *end || v > 100000000)
                return -EINVAL;
        *ret = (unsigned) v;
        return 0;
}

static void usage(void) {
        printf("familyd-sim [--sizes N[,N...]] [--heartbeat-ms N] [--suspect-ms N] "
               "[--down-ms N]\n"
               "            [--latency-us N] [--jitter-us N] [--flush-us N] [--devices N]\n"
               "            [--start-spread-ms N] [--rest-s N] [--partition-s N] [--loss-s N]\n"
               "            [--seed N] [--own-records] [--membership all-to-all|swim]\n"
               "            [--crash-loss PERCENT] [--check] [--heal-trace]\n");
}

static int parse_options(int argc, char **argv, SimOptions *o) {
        static const struct option options[] = {
                { "sizes", required_argument, NULL, 'n' },
                { "heartbeat-ms", required_argument, NULL, 'h' },
                { "suspect-ms", required_argument, NULL, 's' },
                { "down-ms", required_argument, NULL, 'd' },
                { "latency-us", required_argument, NULL, 'l' },
                { "jitter-us", required_argument, NULL, 'j' },
                { "flush-us", required_argument, NULL, 'f' },
                { "devices", required_argument, NULL, 'g' },
                { "start-spread-ms", required_argument, NULL, 'S' },
                { "rest-s", required_argument, NULL, 'r' },
                { "partition-s", required_argument, NULL, 'p' },
                { "loss-s", required_argument, NULL, 'L' },
                { "seed", required_argument, NULL, 'x' },
                { "own-records", no_argument, NULL, 'o' },
                { "membership", required_argument, NULL, 'm' },
                { "crash-loss", required_argument, NULL, 'C' },
                { "check", no_argument, NULL, 'c' },
                { "heal-trace", no_argument, NULL, 'T' },
                { "help", no_argument, NULL, 'H' },
                {},
        };
        unsigned seed = 1;
        int c, r = 0;

        while (r == 0 && (c = getopt_long(argc, argv, "", options, NULL)) >= 0) {
                switch (c) {
                case 'n': r = parse_sizes(optarg, o); break;
                case 'h': r = parse_unsigned(optarg, &o->config.heartbeat_ms); break;
                case 's': r = parse_unsigned(optarg, &o->config.suspect_ms); break;
                case 'd': r = parse_unsigned(optarg, &o->config.down_ms); break;
                case 'l': r = parse_unsigned(optarg, &o->config.latency_us); break;
                case 'j': r = parse_unsigned(optarg, &o->config.jitter_us); break;
                case 'f': r = parse_unsigned(optarg, &o->config.flush_us); break;
                case 'g': r = parse_unsigned(optarg, &o->config.devices); break;
                case 'S': r = parse_unsigned(optarg, &o->start_spread_ms); break;
                case 'r': r = parse_unsigned(optarg, &o->rest_s); break;
                case 'p': r = parse_unsigned(optarg, &o->partition_s); break;
                case 'L': r = parse_unsigned(optarg, &o->loss_s); break;
                case 'x': r = parse_unsigned(optarg, &seed); break;
                case 'o': o->config.own_records = true; break;
                case 'C': r = parse_unsigned(optarg, &o->crash_loss_percent); break;
                case 'm':
                        o->config.mode = protocol_mode_from_string(optarg);
                        r = o->config.mode < 0 ? -EINVAL : 0;
                        break;
                case 'c': o->check = true; break;
                case 'T': o->heal_trace = true; break;
                case 'H': usage(); exit(EXIT_SUCCESS);
                default: return -EINVAL;
                }
        }
        o->config.seed = seed;
        if (r == 0 && (optind < argc || o->config.heartbeat_ms == 0 || o->rest_s == 0 ||
                       o->crash_loss_percent > 50 ||
                       o->config.suspect_ms >= o->config.down_ms))
                r = -EINVAL;
        return r;
}

int main(int argc, char **argv) {
        SimOptions o = {
                .config = { .heartbeat_ms = 1000, .suspect_ms = 3000, .down_ms = 10000,
                            .latency_us = 200, .jitter_us = 100, .flush_us = 1000,
                            .devices = 8 },
                .sizes = { 10, 100, 1000 },
                .n_sizes = 3,
                .start_spread_ms = 1000,
                .rest_s = 10,
                .partition_s = 20,
                .loss_s = 600,
        };
        bool ok = true;

        if (parse_options(argc, argv, &o) < 0) {
                usage();
                return 2;
        }
        print_header(&o);
        for (size_t i = 0; i < o.n_sizes; i++) {
                SimRow row;
                if (!size_fits(&o, o.sizes[i])) {
                        ok = false;
                        continue;
                }
                if (run_size(&o, o.sizes[i], &row) < 0) {
                        fprintf(stderr, "familyd-sim: out of memory\n");
                        return EXIT_FAILURE;
                }
                print_row(&row);
                if (o.check)
                        ok = row_within_bounds(&o, &row) && ok;
        }
        return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}

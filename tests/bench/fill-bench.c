/* fill-bench.c: materialisation throughput (constant, uniform, normal float32) against memset. */

/*
 * Each init fills a fresh anonymous mapping of --size-mib MiB with fill_run() on all cores (or
 * --threads), so page faults count as they do for a fresh shm segment; the baseline is one
 * memset() of a fresh mapping of the same size, in the same run. A second pass over the now
 * faulted buffers ("warm") shows the generators' own speed. After the timed runs every element
 * is compared with a single-threaded recomputation (fill_values), and an FNV-1a checksum of the
 * whole buffer is printed, so a skipped or misplaced chunk fails the run.
 *
 * Then normal(0,1) into fresh shared memory as a segment is (a memfd mapped shared), the pages
 * faulted in by the fill's writes against made present per chunk first (FillSlice.populate,
 * common/populate.h), alternating, five rounds, medians of wall and of CPU time; both verified.
 *
 * Then many small fills (--small-fills of --small-kib KiB, uniform, warm buffer), as a busy
 * daemon's Builds are: with threads started and joined per call, against the fill pool
 * (core/fill-pool.h) started once, same thread count, same run.
 */

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/fill.h"
#include "core/fill-pool.h"

static double now(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

static void *map_fresh(size_t size) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
}

/* Compares buf with a serial recomputation, block by block; returns the checksum or sets *ok. */
static uint32_t verify(const FillSpec *spec, const float *buf, size_t n, bool *ok) {
        enum { STEP = 1 << 16 };
        static float ref[STEP];
        uint32_t h = UINT32_C(0x811c9dc5);

        *ok = true;
        for (size_t i = 0; i < n; i += STEP) {
                size_t m = n - i < STEP ? n - i : STEP;
                fill_values(spec, i, m, ref);
                if (memcmp(ref, buf + i, m * sizeof(float)) != 0)
                        *ok = false;
                const unsigned char *p = (const unsigned char *) (buf + i);
                for (size_t j = 0; j < m * sizeof(float); j++) {
                        h ^= p[j];
                        h *= UINT32_C(0x01000193);
                }
        }
        return h;
}

/* Seconds for n fills of a kib KiB slice; with pool bound to this thread when not NULL. */
static double small_fills(FillPool *pool, unsigned threads, unsigned long n, unsigned long kib,
                          bool *ok) {
        size_t elements = kib * 1024 / sizeof(float);
        int64_t shape = (int64_t) elements, off = 0;
        float *buf = malloc(elements * sizeof(float));
        FillSpec spec;

        *ok = buf && fill_spec_init(&spec, INIT_UNIFORM, -1.0, 1.0, 5, "small.bias",
                                    DTYPE_FLOAT32) >= 0;
        if (!*ok) {
                free(buf);
                return 0;
        }
        FillSlice s = { .spec = &spec, .rank = 1, .shape = &shape, .local_shape = &shape,
                        .global_offset = &off, .dst = buf };
        memset(buf, 0, elements * sizeof(float));
        fill_context_bind(pool ? &(FillContext) { .pool = pool, .group = -1 } : NULL);
        double t0 = now();
        for (unsigned long i = 0; i < n && *ok; i++)
                *ok = fill_run(&s, 1, pool ? 0 : threads) >= 0;
        double t = now() - t0;
        fill_context_bind(NULL);
        *ok = *ok && fill_value(&spec, elements - 1) == buf[elements - 1];
        free(buf);
        return t;
}

/* The slice filled on fresh pages, then again (warm): seconds each. */
static int time_fill(const FillSlice *s, unsigned threads, double *ret_fresh, double *ret_warm) {
        double t0 = now();
        int r = fill_run(s, 1, threads);

        *ret_fresh = now() - t0;
        if (r < 0)
                return r;
        t0 = now();
        r = fill_run(s, 1, threads);
        *ret_warm = now() - t0;
        return r;
}

/* Baseline: memset of a fresh buffer, then of the same buffer again (warm): seconds each. */
static int memset_baseline(size_t size, double *ret_fresh, double *ret_warm) {
        unsigned char *m = map_fresh(size);
        if (!m) {
                fprintf(stderr, "mmap: %s\n", strerror(errno));
                return -ENOMEM;
        }
        double t0 = now();
        memset(m, 0x3f, size);
        *ret_fresh = now() - t0;
        t0 = now();
        memset(m, 0x40, size);
        *ret_warm = now() - t0;
        bool ok = m[0] == 0x40 && m[size - 1] == 0x40;
        (void) munmap(m, size);
        return ok ? 0 : -EIO;
}

static double cpu_now(void) {
        struct timespec ts;
        (void) clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return (double) ts.tv_sec + (double) ts.tv_nsec * 1e-9;
}

/* One fill of normal(0,1) into a fresh memfd mapping of size bytes: seconds, and the process's
 * CPU seconds in *cpu (both threads: robust to other load), verified in *ok. */
static double shared_fill(size_t size, unsigned threads, bool populate, double *cpu, bool *ok) {
        int64_t shape = (int64_t) (size / sizeof(float)), off = 0;
        FillSpec spec;
        int fd = memfd_create("fill-bench", MFD_CLOEXEC);
        float *buf = MAP_FAILED;
        double t = 0;

        *ok = false;
        if (fd >= 0 && ftruncate(fd, (off_t) size) == 0)
                buf = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (buf != MAP_FAILED &&
            fill_spec_init(&spec, INIT_NORMAL, 0.0, 1.0, 0, "bench.weight", DTYPE_FLOAT32) >= 0) {
                FillSlice s = { .spec = &spec, .rank = 1, .shape = &shape, .local_shape = &shape,
                                .global_offset = &off, .dst = buf, .populate = populate };
                double t0 = now(), c0 = cpu_now();
                int r = fill_run(&s, 1, threads);
                t = now() - t0;
                *cpu = cpu_now() - c0;
                if (r >= 0)
                        (void) verify(&spec, buf, (size_t) shape, ok);
        }
        if (buf != MAP_FAILED)
                (void) munmap(buf, size);
        if (fd >= 0)
                (void) close(fd);
        return t;
}

static int cmp_double(const void *a, const void *b) {
        double x = *(const double *) a, y = *(const double *) b;
        return (x > y) - (x < y);
}

/* Faulted against populated fills of fresh shared memory: 1 verified (or not asked for by
 * --only), 0 a mismatch. */
static int populated_report(size_t size, unsigned threads, const char *only) {
        enum { ROUNDS = 5 };
        double faulted[ROUNDS], populated[ROUNDS], cpu_f[ROUNDS], cpu_p[ROUNDS];
        double gb = (double) size / 1e9;
        bool all = true, ok;

        if (only && strcmp(only, "populated") != 0)
                return 1;
        for (int i = 0; i < ROUNDS; i++) {
                faulted[i] = shared_fill(size, threads, false, &cpu_f[i], &ok);
                all = all && ok;
                populated[i] = shared_fill(size, threads, true, &cpu_p[i], &ok);
                all = all && ok;
        }
        qsort(faulted, ROUNDS, sizeof(double), cmp_double);
        qsort(populated, ROUNDS, sizeof(double), cmp_double);
        qsort(cpu_f, ROUNDS, sizeof(double), cmp_double);
        qsort(cpu_p, ROUNDS, sizeof(double), cmp_double);
        printf("normal(0,1) into fresh shared memory: faulted %.2f GB/s (%.3f CPU s), populated "
               "per chunk %.2f GB/s (%.3f CPU s): time %.2fx, CPU %.2fx %s\n",
               gb / faulted[ROUNDS / 2], cpu_f[ROUNDS / 2], gb / populated[ROUNDS / 2],
               cpu_p[ROUNDS / 2], populated[ROUNDS / 2] / faulted[ROUNDS / 2],
               cpu_p[ROUNDS / 2] / cpu_f[ROUNDS / 2], all ? "verified" : "MISMATCH");
        return all;
}

/* Many small fills, threads per call against the pool: 1 verified, 0 a mismatch, <0 error. */
static int small_fills_report(unsigned t, unsigned long small_n, unsigned long small_kib) {
        FillPool *pool = NULL;
        bool ok_calls, ok_pool;

        if (fill_pool_new(t, NULL, 0, &pool) < 0)
                return -ENOMEM;
        double t_calls = small_fills(NULL, t, small_n, small_kib, &ok_calls);
        double t_pool = small_fills(pool, t, small_n, small_kib, &ok_pool);
        fill_pool_free(pool);
        printf("%lu fills of %lu KiB on %u threads: per-call threads %.1f us/fill, pool "
               "%.1f us/fill (%.2fx) %s\n",
               small_n, small_kib, t, t_calls * 1e6 / (double) small_n,
               t_pool * 1e6 / (double) small_n, t_calls / t_pool,
               ok_calls && ok_pool ? "verified" : "MISMATCH");
        return ok_calls && ok_pool;
}

int main(int argc, char *argv[]) {
        static const struct option options[] = {
                { "size-mib", required_argument, NULL, 's' },
                { "threads", required_argument, NULL, 't' },
                { "only", required_argument, NULL, 'o' },
                { "small-fills", required_argument, NULL, 'n' },
                { "small-kib", required_argument, NULL, 'k' },
                { "help", no_argument, NULL, 'h' },
                {},
        };
        static const struct {
                const char *name;
                InitKind kind;
                double a, b;
                double goal;
        } inits[] = {
                { "constant(1.0)", INIT_CONSTANT, 1.0, 0, 0.8 },
                { "uniform(-1,1)", INIT_UNIFORM, -1.0, 1.0, 0.5 },
                { "normal(0,1)", INIT_NORMAL, 0.0, 1.0, 0.3 },
        };
        unsigned long size_mib = 1024, threads = 0, small_n = 2000, small_kib = 768;
        const char *only = NULL;
        int c;
        bool all_ok = true, all_goals = true;

        while ((c = getopt_long(argc, argv, "s:t:o:n:k:h", options, NULL)) >= 0)
                switch (c) {
                case 'o':
                        only = optarg;
                        break;
                case 'n':
                        small_n = strtoul(optarg, NULL, 10);
                        break;
                case 'k':
                        small_kib = strtoul(optarg, NULL, 10);
                        break;
                case 's':
                        size_mib = strtoul(optarg, NULL, 10);
                        break;
                case 't':
                        threads = strtoul(optarg, NULL, 10);
                        break;
                case 'h':
                        printf("%s [--size-mib N (1024)] [--threads N (all cores)] [--only INIT|populated]\n"
                               "    [--small-fills N (2000; 0: none)] [--small-kib N (768)]\n",
                               argv[0]);
                        return EXIT_SUCCESS;
                default:
                        return EXIT_FAILURE;
                }
        if (size_mib == 0 || size_mib > (SIZE_MAX >> 20) / 2 || small_kib == 0 ||
            small_kib > (1ul << 20)) {
                fprintf(stderr, "bad --size-mib\n");
                return EXIT_FAILURE;
        }

        size_t size = (size_t) size_mib << 20, n = size / sizeof(float);
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        double gb = (double) size / 1e9;

        printf("fill-bench: %lu MiB float32, %lu threads (%ld online CPUs)\n", size_mib,
               threads ? threads : (unsigned long) cpus, cpus);

        double t_memset, t_memset_warm;
        if (memset_baseline(size, &t_memset, &t_memset_warm) < 0)
                return EXIT_FAILURE;
        printf("%-15s fresh %6.2f GB/s              warm %6.2f GB/s\n", "memset", gb / t_memset,
               gb / t_memset_warm);

        for (size_t k = 0; k < ELEMENTSOF(inits); k++) {
                FillSpec spec;
                int64_t shape = (int64_t) n, off = 0;
                float *buf = map_fresh(size);
                bool ok;
                int r;

                if (only && strncmp(inits[k].name, only, strlen(only)) != 0) {
                        (void) munmap(buf, size);
                        continue;
                }
                if (!buf) {
                        fprintf(stderr, "mmap: %s\n", strerror(errno));
                        return EXIT_FAILURE;
                }
                r = fill_spec_init(&spec, inits[k].kind, inits[k].a, inits[k].b, 0, "bench.weight",
                                   DTYPE_FLOAT32);
                if (r < 0)
                        return EXIT_FAILURE;
                FillSlice s = { .spec = &spec, .rank = 1, .shape = &shape, .local_shape = &shape,
                                .global_offset = &off, .dst = buf };

                double t, t_warm;
                r = time_fill(&s, (unsigned) threads, &t, &t_warm);
                if (r < 0) {
                        fprintf(stderr, "fill_run: %s\n", strerror(-r));
                        return EXIT_FAILURE;
                }

                uint32_t sum = verify(&spec, buf, n, &ok);
                double ratio = t_memset / t, ratio_warm = t_memset_warm / t_warm;
                bool goal = ratio >= inits[k].goal;
                printf("%-15s fresh %6.2f GB/s (%.2fx, goal >= %.1fx %s)  warm %6.2f GB/s (%.2fx)  "
                       "checksum %08x %s\n",
                       inits[k].name, gb / t, ratio, inits[k].goal, goal ? "met" : "MISSED", gb / t_warm,
                       ratio_warm, sum, ok ? "verified" : "MISMATCH");
                all_ok = all_ok && ok;
                all_goals = all_goals && goal;
                (void) munmap(buf, size);
        }
        all_ok = populated_report(size, (unsigned) threads, only) > 0 && all_ok;
        if (small_n > 0 && !only) {
                unsigned t = threads ? (unsigned) threads : (unsigned) (cpus > 0 ? cpus : 1);
                int r = small_fills_report(t, small_n, small_kib);
                if (r < 0)
                        return EXIT_FAILURE;
                all_ok = all_ok && r > 0;
        }
        printf("goals %s\n", all_goals ? "met" : "missed");
        return all_ok ? EXIT_SUCCESS : EXIT_FAILURE;
}

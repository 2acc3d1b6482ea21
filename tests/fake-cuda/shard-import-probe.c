/* shard-import-probe.c: a trainer's second process, in C: fetches a build's shards through
 * libfamilyd and reads them back, importing GPU shards through the CUDA driver. Not installed.
 *
 *   shard-import-probe SOCKET BUILD_ID OUTDIR [--writable] [--private] [--release]
 *
 * --private: the `private` mapping mode (familyd_cuda_shard_import_private(): a copy in an
 * allocation of the probe's own; host shards MAP_PRIVATE).
 *
 * GetBuild, then one familyd_shard_fetch_info() for every rank with a token; host shards are
 * mapped (familyd_shard_map), cuda shards imported (familyd_cuda_shard_import) and the fetched
 * descriptors closed at once (the mappings keep the memory). With --release, a forced
 * ReleaseBuild before anything is read (mappings outlive it). Then each shard's whole memory (its size,
 * allocation padding included) goes to OUTDIR/rank-R.bin, read with familyd_cuda_shard_read
 * for cuda. One line per rank:
 *   rank R kind K device D size S allocation A pointer 0xP writable W import-ms T
 * then "result ok". A failure prints "error STEP: ERRNO_TEXT (CODE_NAME: message)" and exits
 * 2 (import) or 1 (anything else). Used by tests/integration/test_cuda_fake.py against the
 * fake driver and by tests/gpu/ on a real GPU.
 */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "familyd.h"

#define MAX_RANKS FAMILYD_SHARD_MAX_TOKENS

static double now_ms(void) {
        struct timespec ts;

        (void) clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static int fail(int status, const char *step, int r, const FamilydError *e) {
        printf("error %s: %s (%s: %s)\n", step, strerror(-r),
               e && e->code ? familyd_status_name(e->code) : "-",
               e && e->message ? e->message : "");
        fflush(stdout);
        return status;
}

static int write_file(const char *dir, int64_t rank, const void *data, size_t n) {
        char path[4096];
        const uint8_t *p = data;

        (void) snprintf(path, sizeof path, "%s/rank-%" PRId64 ".bin", dir, rank);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
                return -errno;
        while (n > 0) {
                ssize_t k = write(fd, p, n);
                if (k < 0) {
                        int r = -errno;
                        (void) close(fd);
                        return r;
                }
                p += k;
                n -= (size_t) k;
        }
        return close(fd) < 0 ? -errno : 0;
}

/* SOCKET BUILD_ID OUTDIR, then the flags: -EINVAL (said on stderr) for anything else. */
static int parse_options(int argc, char **argv, bool *writable, bool *release, bool *private_) {
        if (argc < 4) {
                fprintf(stderr, "usage: %s SOCKET BUILD_ID OUTDIR [--writable] [--private] "
                                "[--release]\n",
                        argv[0]);
                return -EINVAL;
        }
        for (int i = 4; i < argc; i++) {
                if (strcmp(argv[i], "--writable") == 0)
                        *writable = true;
                else if (strcmp(argv[i], "--release") == 0)
                        *release = true;
                else if (strcmp(argv[i], "--private") == 0)
                        *private_ = true;
                else {
                        fprintf(stderr, "unknown option %s\n", argv[i]);
                        return -EINVAL;
                }
        }
        return 0;
}

int main(int argc, char **argv) {
        FamilydClientParams params = {
                .field_mask = FAMILYD_CLIENT_PARAM_FIELD_SOCKET_PATH,
        };
        FamilydClient *client = NULL;
        Familyd__V1__Build *build = NULL;
        FamilydError e = FAMILYD_ERROR_NULL;
        const char *tokens[MAX_RANKS];
        int64_t ranks[MAX_RANKS];
        uint64_t size_bytes[MAX_RANKS];
        int fds[MAX_RANKS];
        FamilydShardInfo info[MAX_RANKS];
        FamilydCudaShard *cuda[MAX_RANKS] = {};
        void *host[MAX_RANKS] = {};
        double import_ms[MAX_RANKS] = {};
        bool writable = false, release = false, private_ = false;
        size_t n = 0;
        int r, status = 0;

        if (parse_options(argc, argv, &writable, &release, &private_) < 0)
                return 1;
        params.socket_path = argv[1];
        r = familyd_client_new(&params, &client);
        if (r < 0)
                return fail(1, "client", r, NULL);
        r = familyd_get_build(client, argv[2], &build, &e);
        if (r < 0)
                return fail(1, "GetBuild", r, &e);
        for (size_t i = 0; i < build->n_shards && n < MAX_RANKS; i++)
                if (build->shards[i]->token && build->shards[i]->token[0]) {
                        tokens[n] = build->shards[i]->token;
                        size_bytes[n] = build->shards[i]->size_bytes;
                        ranks[n++] = build->shards[i]->rank;
                }
        if (n == 0)
                return fail(1, "build", -ENOENT, NULL);

        r = familyd_shard_fetch_info(client, build->shard_socket, tokens, n, writable, fds, info,
                                     &e);
        if (r < 0)
                return fail(1, "fetch", r, &e);

        for (size_t i = 0; i < n; i++) {
                double t0 = now_ms();
                if (strcmp(info[i].device_kind, "cuda") == 0 && private_)
                        r = familyd_cuda_shard_import_private(fds[i], info[i].size,
                                                              info[i].device, &cuda[i], &e);
                else if (strcmp(info[i].device_kind, "cuda") == 0)
                        r = familyd_cuda_shard_import(fds[i], info[i].size, info[i].device,
                                                      writable, &cuda[i], &e);
                else
                        r = familyd_shard_map_mode(fds[i], info[i].size,
                                                   private_ ? FAMILYD_MAP_PRIVATE
                                                   : writable ? FAMILYD_MAP_SHARED
                                                              : FAMILYD_MAP_READ_ONLY,
                                                   &host[i]);
                import_ms[i] = now_ms() - t0;
                (void) close(fds[i]); /* the mappings keep the memory */
                if (r < 0) {
                        status = fail(2, "import", r, &e);
                        familyd_error_clear(&e);
                }
        }

        if (status == 0 && release) {
                /* Forced: this process did not build it, so it holds no reference. */
                r = familyd_release_build_full(client, argv[2], true, NULL, &e);
                if (r < 0)
                        status = fail(1, "ReleaseBuild", r, &e);
        }

        for (size_t i = 0; status == 0 && i < n; i++) {
                uint8_t *buf = NULL;
                uint64_t pointer;

                if (cuda[i]) {
                        buf = malloc(info[i].size);
                        if (!buf) {
                                status = fail(1, "read", -ENOMEM, NULL);
                                break;
                        }
                        r = familyd_cuda_shard_read(cuda[i], 0, buf, info[i].size, &e);
                        if (r < 0) {
                                free(buf);
                                status = fail(1, "read", r, &e);
                                break;
                        }
                        pointer = familyd_cuda_shard_pointer(cuda[i]);
                        r = write_file(argv[3], ranks[i], buf, info[i].size);
                        free(buf);
                } else {
                        pointer = (uint64_t) (uintptr_t) host[i];
                        r = write_file(argv[3], ranks[i], host[i], info[i].size);
                }
                if (r < 0) {
                        status = fail(1, "write", r, NULL);
                        break;
                }
                printf("rank %" PRId64 " kind %s device %" PRId32 " size %" PRIu64
                       " allocation %" PRIu64 " pointer 0x%" PRIx64 " writable %d import-ms %.3f\n",
                       ranks[i], info[i].device_kind, info[i].device,
                       size_bytes[i], info[i].size,
                       pointer,
                       cuda[i] ? familyd_cuda_shard_writable(cuda[i]) : writable || private_,
                       import_ms[i]);
        }
        if (status == 0)
                printf("result ok\n");
        fflush(stdout);

        for (size_t i = 0; i < n; i++) {
                familyd_cuda_shard_free(cuda[i]);
                if (host[i])
                        (void) familyd_shard_unmap(host[i], info[i].size);
        }
        familyd_error_clear(&e);
        familyd__v1__build__free_unpacked(build, NULL);
        familyd_client_free(client);
        return status;
}

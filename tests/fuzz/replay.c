/* replay.c: runs a libFuzzer-style harness over a corpus directory, then over deterministic
 * mutations of it (fixed seed), for gcc builds and `meson test`. A crash is the sanitizer's. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REPLAY_MUTATIONS_DEFAULT 3000u
#define REPLAY_MAX_INPUT         65536u

typedef struct Input {
        uint8_t *data;
        size_t size;
} Input;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng(void) {
        /* xorshift64* */
        rng_state ^= rng_state >> 12;
        rng_state ^= rng_state << 25;
        rng_state ^= rng_state >> 27;
        return rng_state * 0x2545f4914f6cdd1dull;
}

static size_t rng_below(size_t n) {
        return n ? (size_t) (rng() % n) : 0;
}

static int read_file(const char *path, Input *ret) {
        FILE *f = fopen(path, "rb");
        if (!f)
                return -errno;
        uint8_t *buf = malloc(REPLAY_MAX_INPUT);
        if (!buf) {
                fclose(f);
                return -ENOMEM;
        }
        size_t n = fread(buf, 1, REPLAY_MAX_INPUT, f);
        fclose(f);
        ret->data = buf;
        ret->size = n;
        return 0;
}

static int name_cmp(const void *a, const void *b) {
        return strcmp(*(char *const *) a, *(char *const *) b);
}

/* One mutated copy of a, maybe spliced with b, in buf (capacity REPLAY_MAX_INPUT). */
static size_t mutate(const Input *a, const Input *b, uint8_t *buf) {
        size_t n = a->size;
        memcpy(buf, a->data, n);
        /* Mostly one small change, so structured inputs (protobuf) still parse; sometimes more. */
        unsigned rounds = rng_below(2) ? 1 : 1 + (unsigned) rng_below(8);
        for (unsigned i = 0; i < rounds; i++) {
                size_t pos = rng_below(n + 1);
                switch (rng_below(8)) {
                case 0: /* flip a bit */
                        if (n)
                                buf[rng_below(n)] ^= (uint8_t) (1u << rng_below(8));
                        break;
                case 1: { /* an interesting byte */
                        static const uint8_t interesting[] = { 0x00, 0x01, 0x7f, 0x80, 0xff, 0x0a,
                                                               0x12, 0x1a, 0x22, ':', '-', '[',
                                                               '{', '"', '\'', ' ', '&', '*' };
                        if (n)
                                buf[rng_below(n)] = interesting[rng_below(sizeof(interesting))];
                        break;
                }
                case 2: /* insert a random byte */
                        if (n < REPLAY_MAX_INPUT) {
                                memmove(buf + pos + 1, buf + pos, n - pos);
                                buf[pos] = (uint8_t) rng();
                                n++;
                        }
                        break;
                case 3: { /* delete a run */
                        if (pos < n) {
                                size_t len = 1 + rng_below(n - pos < 16 ? n - pos : 16);
                                memmove(buf + pos, buf + pos + len, n - pos - len);
                                n -= len;
                        }
                        break;
                }
                case 4: /* truncate */
                        n = pos;
                        break;
                case 5: { /* duplicate a chunk at pos */
                        if (n) {
                                size_t from = rng_below(n);
                                size_t len = 1 + rng_below(n - from < 64 ? n - from : 64);
                                if (n + len <= REPLAY_MAX_INPUT) {
                                        uint8_t tmp[64];
                                        memcpy(tmp, buf + from, len);
                                        memmove(buf + pos + len, buf + pos, n - pos);
                                        memcpy(buf + pos, tmp, len);
                                        n += len;
                                }
                        }
                        break;
                }
                case 6: { /* splice: a tail of b at pos */
                        size_t from = rng_below(b->size + 1);
                        size_t len = b->size - from;
                        if (pos + len > REPLAY_MAX_INPUT)
                                len = REPLAY_MAX_INPUT - pos;
                        memcpy(buf + pos, b->data + from, len);
                        n = pos + len;
                        break;
                }
                default: /* overwrite a byte with a random one */
                        if (n)
                                buf[rng_below(n)] = (uint8_t) rng();
                        break;
                }
        }
        return n;
}

/* With FUZZ_REPLAY_SAVE=PATH each input is written there before it runs: after a crash, PATH
 * holds the input that caused it (replay it with `fuzz-NAME DIR-HOLDING-IT 0`). */
static void run_one(const uint8_t *data, size_t size) {
        const char *save = getenv("FUZZ_REPLAY_SAVE");
        if (save && *save) {
                FILE *f = fopen(save, "wb");
                if (f) {
                        fwrite(data, 1, size, f);
                        fclose(f);
                }
        }
        /* A copy of exactly size bytes, so ASan catches reads past the end. */
        uint8_t *exact = malloc(size ? size : 1);
        if (!exact)
                abort();
        memcpy(exact, data, size);
        LLVMFuzzerTestOneInput(exact, size);
        free(exact);
}

int main(int argc, char **argv) {
        if (argc < 2) {
                fprintf(stderr, "usage: %s CORPUS_DIR [MUTATIONS]\n", argv[0]);
                return 2;
        }
        unsigned long mutations = argc > 2 ? strtoul(argv[2], NULL, 10) : REPLAY_MUTATIONS_DEFAULT;

        DIR *d = opendir(argv[1]);
        if (!d) {
                fprintf(stderr, "%s: %s\n", argv[1], strerror(errno));
                return 2;
        }
        char **names = NULL;
        size_t n_names = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (de->d_name[0] == '.')
                        continue;
                char **p = realloc(names, (n_names + 1) * sizeof(*names));
                if (!p)
                        return 2;
                names = p;
                if (asprintf(&names[n_names], "%s/%s", argv[1], de->d_name) < 0)
                        return 2;
                n_names++;
        }
        closedir(d);
        if (n_names == 0) {
                fprintf(stderr, "%s: empty corpus\n", argv[1]);
                return 2;
        }
        /* readdir order is the file system's: sort, so the mutations are reproducible. */
        qsort(names, n_names, sizeof(*names), name_cmp);

        Input *inputs = calloc(n_names, sizeof(*inputs));
        if (!inputs)
                return 2;
        for (size_t i = 0; i < n_names; i++) {
                int r = read_file(names[i], &inputs[i]);
                if (r < 0) {
                        fprintf(stderr, "%s: %s\n", names[i], strerror(-r));
                        return 2;
                }
                fprintf(stderr, "seed %s (%zu bytes)\n", names[i], inputs[i].size);
                run_one(inputs[i].data, inputs[i].size);
        }

        uint8_t *buf = malloc(REPLAY_MAX_INPUT);
        if (!buf)
                return 2;
        for (unsigned long m = 0; m < mutations; m++) {
                const Input *a = &inputs[rng_below(n_names)];
                const Input *b = &inputs[rng_below(n_names)];
                run_one(buf, mutate(a, b, buf));
        }
        fprintf(stderr, "%zu seeds, %lu mutations: ok\n", n_names, mutations);

        free(buf);
        for (size_t i = 0; i < n_names; i++) {
                free(inputs[i].data);
                free(names[i]);
        }
        free(inputs);
        free(names);
        return 0;
}

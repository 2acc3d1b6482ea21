/* test-build-checkpoint.c: daemon/build/build-checkpoint*.c: a checkpoint opened from
 * descriptors, and shard slices read from it (stacked, concatenated, transposed, converted),
 * compared element by element with the values the test wrote. */
#include <setjmp.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "build/build-checkpoint.h"
#include "hw/read-ahead.h"

enum { E = 3, H = 5, I = 4 };

/* A file: tensors laid out in order; element values f(tensor, flat) in the tensor's dtype. */
typedef struct Spec {
        const char *name;
        const char *dtype; /* F32 or BF16 */
        int64_t rows, cols;
} Spec;

static float element(size_t tensor, uint64_t flat) {
        /* Small integers, exact in bfloat16 (8 significant bits): at most 255. */
        return (float) ((tensor * 37 + flat) % 256);
}

static uint16_t bf16(float f) {
        uint32_t b;
        memcpy(&b, &f, 4);
        return (uint16_t) (b >> 16); /* the values used are exact in bfloat16 */
}

static int write_file(const Spec *t, size_t n, size_t first_id) {
        char header[4096];
        size_t at = 0;
        uint64_t off = 0;
        int fd = memfd_create("ckpt", MFD_CLOEXEC);

        assert_true(fd >= 0);
        at += (size_t) snprintf(header + at, sizeof header - at, "{\"__metadata__\":{\"format\":\"pt\"}");
        for (size_t i = 0; i < n; i++) {
                uint64_t bytes = (uint64_t) (t[i].rows * t[i].cols) * (streq(t[i].dtype, "F32") ? 4 : 2);
                at += (size_t) snprintf(header + at, sizeof header - at,
                                        ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%" PRId64 ",%" PRId64
                                        "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                        t[i].name, t[i].dtype, t[i].rows, t[i].cols, off, off + bytes);
                off += bytes;
        }
        at += (size_t) snprintf(header + at, sizeof header - at, "}");
        uint64_t len = at;
        assert_int_equal(write(fd, &len, 8), 8);
        assert_int_equal(write(fd, header, at), (ssize_t) at);
        for (size_t i = 0; i < n; i++)
                for (int64_t f = 0; f < t[i].rows * t[i].cols; f++) {
                        float v = element(first_id + i, (uint64_t) f);
                        if (streq(t[i].dtype, "F32"))
                                assert_int_equal(write(fd, &v, 4), 4);
                        else {
                                uint16_t h = bf16(v);
                                assert_int_equal(write(fd, &h, 2), 2);
                        }
                }
        return fd;
}

/* Mixtral's experts in two files: w1, w3 ([I, H], BF16) in the first, w2 ([H, I], F32) in the
 * second. Tensor ids: w1 of e = 2e, w3 of e = 2e + 1 (file 0), w2 of e = 2E + e (file 1). */
static BuildCheckpoint *open_mixtral(void) {
        static char names[3 * E][64];
        Spec a[2 * E], b[E];
        for (int e = 0; e < E; e++) {
                (void) snprintf(names[2 * e], 64, "m.experts.%d.w1.weight", e);
                (void) snprintf(names[2 * e + 1], 64, "m.experts.%d.w3.weight", e);
                (void) snprintf(names[2 * E + e], 64, "m.experts.%d.w2.weight", e);
                a[2 * e] = (Spec) { names[2 * e], "BF16", I, H };
                a[2 * e + 1] = (Spec) { names[2 * e + 1], "BF16", I, H };
                b[e] = (Spec) { names[2 * E + e], "F32", H, I };
        }
        int fds[2] = { write_file(a, 2 * E, 0), write_file(b, E, 2 * E) };
        const char *file_names[2] = { "model-00001-of-00002.safetensors",
                                      "model-00002-of-00002.safetensors" };
        BuildCheckpoint *c = NULL;
        FamilyError err = FAMILY_ERROR_NULL;
        assert_int_equal(build_checkpoint_open(fds, file_names, 2, &c, &err), 0);
        assert_int_equal(c->n_tensors, 3 * E);
        return c;
}

static uint8_t staging[64 << 10];

static void read_gate_up(Dtype dtype, const int64_t *off, const int64_t *loc) {
        _cleanup_(build_checkpoint_freep) BuildCheckpoint *c = open_mixtral();
        CheckpointPart parts[2] = { { "{prefix}.experts.{expert}.w1.weight", true },
                                    { "{prefix}.experts.{expert}.w3.weight", true } };
        CheckpointSource src = { .parts = parts, .n_parts = 2, .concat = true, .concat_dim = 2,
                                 .stack = true, .stack_dim = 0, .stack_key = (char *) "expert" };
        int64_t shape[3] = { E, H, 2 * I }, o[3], l[3];
        memcpy(o, off, sizeof o);
        memcpy(l, loc, sizeof l);
        ParameterLayout p = { .name = (char *) "gate_up_proj", .shape = shape, .n_dims = 3,
                              .dtype = dtype };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 3 };
        size_t n = (size_t) (l[0] * l[1] * l[2]), es = dtype_size(dtype);
        _cleanup_free_ uint8_t *out = calloc(n, es);
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};

        assert_int_equal(build_checkpoint_read_slice(c, &src, "m", &p, &s, out, staging,
                                                     sizeof staging, &read, &err), 0);
        /* Every byte read is one the slice needs (a transposed box reads whole runs of it). */
        assert_int_equal(read.bytes, (uint64_t) n * 2);
        for (int64_t e = 0; e < l[0]; e++)
                for (int64_t h = 0; h < l[1]; h++)
                        for (int64_t j = 0; j < l[2]; j++) {
                                int64_t ge = o[0] + e, gh = o[1] + h, gj = o[2] + j;
                                size_t id = (size_t) (2 * ge + (gj >= I));
                                float want = element(id, (uint64_t) ((gj % I) * H + gh)), got;
                                size_t at = (size_t) ((e * l[1] + h) * l[2] + j);
                                if (dtype == DTYPE_FLOAT32)
                                        memcpy(&got, out + at * 4, 4);
                                else {
                                        uint16_t g;
                                        memcpy(&g, out + at * 2, 2);
                                        got = bfloat16_to_float(g);
                                }
                                if (got != want)
                                        fail_msg("[%" PRId64 ",%" PRId64 ",%" PRId64 "]: %g, not %g",
                                                 ge, gh, gj, got, want);
                        }
}

static void test_gate_up(void **state) {
        read_gate_up(DTYPE_FLOAT32, (int64_t[]) { 0, 0, 0 }, (int64_t[]) { E, H, 2 * I });
        read_gate_up(DTYPE_BFLOAT16, (int64_t[]) { 1, 0, 0 }, (int64_t[]) { 2, H, 2 * I });
        read_gate_up(DTYPE_FLOAT32, (int64_t[]) { 0, 2, 3 }, (int64_t[]) { E, 2, 2 });
}

/* Untransposed F32 rows (w2 as [H, I] itself): contiguous runs, converted to bfloat16. */
static void test_rows_and_bytes_read(void **state) {
        _cleanup_(build_checkpoint_freep) BuildCheckpoint *c = open_mixtral();
        CheckpointPart part = { "m.experts.1.w2.weight", false };
        CheckpointSource src = { .parts = &part, .n_parts = 1 };
        int64_t shape[2] = { H, I }, o[2] = { 1, 0 }, l[2] = { 3, I };
        ParameterLayout p = { .name = (char *) "w", .shape = shape, .n_dims = 2,
                              .dtype = DTYPE_BFLOAT16 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 2 };
        uint16_t out[3 * I];
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};

        assert_int_equal(build_checkpoint_read_slice(c, &src, "", &p, &s, (uint8_t *) out, staging,
                                                     sizeof staging, &read, &err), 0);
        assert_int_equal(read.bytes, 3 * I * 4); /* three whole rows: one run of F32, one read */
        assert_int_equal(read.calls, 1);
        for (int64_t i = 0; i < 3 * I; i++)
                assert_true(bfloat16_to_float(out[i]) == element(2 * E + 1, (uint64_t) (I + i)));
}

static void test_refusals(void **state) {
        _cleanup_(build_checkpoint_freep) BuildCheckpoint *c = open_mixtral();
        CheckpointPart part = { "m.experts.0.w1.weight", false };
        CheckpointSource src = { .parts = &part, .n_parts = 1 };
        int64_t shape[2] = { I, H }, o[2] = {}, l[2] = { I, H };
        ParameterLayout p = { .name = (char *) "w", .shape = shape, .n_dims = 2,
                              .dtype = DTYPE_FLOAT16 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 2 };
        uint16_t out[I * H];
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};

        assert_int_equal(build_checkpoint_read_slice(c, &src, "", &p, &s, (uint8_t *) out, staging,
                                                     sizeof staging, &read, &err), -EINVAL);
        assert_string_equal(err.reason, "CHECKPOINT_DTYPE");
        assert_string_equal(err.message, "parameter 'w': checkpoint tensor 'm.experts.0.w1.weight': "
                                         "a BF16 tensor cannot become float16: float16's range is "
                                         "smaller than bfloat16's");
        family_error_done(&err);

        /* A file cut short after it was opened: the read says which file and where. */
        p.dtype = DTYPE_FLOAT32;
        assert_int_equal(ftruncate(c->files[0].fd, (off_t) c->files[0].header->data_offset + 8), 0);
        float f32[I * H];
        assert_int_equal(build_checkpoint_read_slice(c, &src, "", &p, &s, (uint8_t *) f32, staging,
                                                     sizeof staging, &read, &err), -EINVAL);
        assert_string_equal(err.reason, "CHECKPOINT_READ");
        assert_non_null(strstr(err.message, "checkpoint file model-00001-of-00002.safetensors: it "
                                            "ended early"));
        family_error_done(&err);
}

static void test_open_refusals(void **state) {
        Spec a = { "x", "F32", 2, 2 };
        int fds[2] = { write_file(&a, 1, 0), write_file(&a, 1, 0) };
        const char *names[2] = { "a.safetensors", "b.safetensors" };
        BuildCheckpoint *c = NULL;
        FamilyError err = FAMILY_ERROR_NULL;

        assert_int_equal(build_checkpoint_open(fds, names, 2, &c, &err), -EINVAL);
        assert_null(c);
        assert_string_equal(err.message, "checkpoint tensor 'x' is in both a.safetensors and "
                                         "b.safetensors");
        family_error_done(&err);

        int bad = memfd_create("bad", MFD_CLOEXEC);
        assert_int_equal(write(bad, "\x02\0\0\0\0\0\0\0[]", 10), 10);
        const char *one[1] = { "bad.safetensors" };
        assert_int_equal(build_checkpoint_open(&bad, one, 1, &c, &err), -EINVAL);
        assert_string_equal(err.reason, "CHECKPOINT_INVALID");
        assert_string_equal(err.message, "checkpoint file bad.safetensors: its header does not "
                                         "begin with '{'");
        family_error_done(&err);
}

/* The node reads a tensor whole when its distinct boxes add up to it: two halves do, one half
 * does not, nor does the same half read by two ranks. Halves of every row (columns) are banded
 * where bands are allowed; halves of the rows are not. The bytes the node reads: each rank's
 * boxes, but a banded tensor once (three halves noted, one tensor read). */
static void test_read_whole_marking(void **state) {
        _cleanup_(build_checkpoint_freep) BuildCheckpoint *c = open_mixtral();
        char *name = (char *) "m.experts.1.w2.weight";
        CheckpointBlock left = { .tensor = name, .n_src_dims = 2, .src_offset = { 0, 0 },
                                 .src_extent = { H, I / 2 } };
        CheckpointBlock right = { .tensor = name, .n_src_dims = 2, .src_offset = { 0, I / 2 },
                                  .src_extent = { H, I - I / 2 } };
        CheckpointBlock unknown = { .tensor = (char *) "m.nothing", .n_src_dims = 1 };
        const SafetensorsTensor *w2 = build_checkpoint_find(c, name)->tensor;
        uint64_t whole = w2->end - w2->begin, half = whole / 2 /* I even */, bytes = 0;

        assert_int_equal(build_checkpoint_note_read(c, &left), 0);
        assert_int_equal(build_checkpoint_mark_read_whole(c, true, &bytes), 0);
        assert_int_equal(bytes, half);
        assert_false(build_checkpoint_find(c, name)->read_whole);

        assert_int_equal(build_checkpoint_note_read(c, &left), 0);
        assert_int_equal(build_checkpoint_note_read(c, &left), 0);
        assert_int_equal(build_checkpoint_mark_read_whole(c, true, &bytes), 0);
        assert_int_equal(bytes, 2 * half);
        assert_false(build_checkpoint_find(c, name)->read_whole);
        assert_false(build_checkpoint_has_bands(c));

        assert_int_equal(build_checkpoint_note_read(c, &right), 0);
        assert_int_equal(build_checkpoint_note_read(c, &left), 0);
        assert_int_equal(build_checkpoint_note_read(c, &right), 0);
        assert_int_equal(build_checkpoint_mark_read_whole(c, true, &bytes), 0);
        assert_int_equal(bytes, whole);
        for (size_t i = 0; i < c->n_tensors; i++) {
                assert_int_equal(c->tensors[i].read_whole,
                                 streq(c->tensors[i].tensor->name, name));
                assert_int_equal(c->tensors[i].banded, streq(c->tensors[i].tensor->name, name));
        }
        assert_true(build_checkpoint_has_bands(c));

        /* Not where a rank is on a GPU; nor halves of the rows (each rank's part contiguous). */
        assert_int_equal(build_checkpoint_note_read(c, &right), 0);
        assert_int_equal(build_checkpoint_note_read(c, &left), 0);
        assert_int_equal(build_checkpoint_mark_read_whole(c, false, &bytes), 0);
        assert_int_equal(bytes, whole);
        assert_true(build_checkpoint_find(c, name)->read_whole);
        assert_false(build_checkpoint_has_bands(c));
        CheckpointBlock top = { .tensor = name, .n_src_dims = 2, .src_offset = { 0, 0 },
                                .src_extent = { H / 2, I } };
        CheckpointBlock bottom = { .tensor = name, .n_src_dims = 2, .src_offset = { H / 2, 0 },
                                   .src_extent = { H - H / 2, I } };
        assert_int_equal(build_checkpoint_note_read(c, &top), 0);
        assert_int_equal(build_checkpoint_note_read(c, &bottom), 0);
        assert_int_equal(build_checkpoint_mark_read_whole(c, true, &bytes), 0);
        assert_int_equal(bytes, whole);
        assert_true(build_checkpoint_find(c, name)->read_whole);
        assert_false(build_checkpoint_has_bands(c));
        assert_int_equal(build_checkpoint_note_read(c, &unknown), -EINVAL);
}

/* Of the file's data bytes [from, to): the fraction of its whole pages in the page cache. */
static double cached(int fd, uint64_t from, uint64_t to) {
        size_t page = (size_t) sysconf(_SC_PAGESIZE);
        uint64_t first = (from + page - 1) / page, last = to / page;
        size_t n = (size_t) (last + 1);
        _cleanup_free_ unsigned char *vec = calloc(n, 1);
        void *p = mmap(NULL, n * page, PROT_READ, MAP_SHARED, fd, 0);
        size_t in = 0;

        assert_non_null(vec);
        assert_true(p != MAP_FAILED);
        assert_int_equal(mincore(p, n * page, vec), 0);
        for (uint64_t i = first; i < last; i++)
                in += vec[i] & 1;
        assert_int_equal(munmap(p, n * page), 0);
        return (double) in / (double) (last - first);
}

/* The memfd's bytes in an unlinked file of /var/tmp, a disk's page cache (not a tmpfs). */
static int on_disk(int memfd) {
        char path[] = "/var/tmp/test-build-checkpoint-XXXXXX";
        struct statfs sfs;
        struct stat st;
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(unlink(path), 0);
        assert_int_equal(fstatfs(fd, &sfs), 0);
        if (sfs.f_type == 0x01021994 /* TMPFS_MAGIC */)
                fail_msg("/var/tmp is a tmpfs: the read-ahead test needs a disk's page cache");
        assert_int_equal(fstat(memfd, &st), 0);
        for (off_t done = 0; done < st.st_size;) {
                char buf[65536];
                ssize_t n = pread(memfd, buf, sizeof buf, done);
                assert_true(n > 0);
                assert_int_equal(pwrite(fd, buf, (size_t) n, done), n);
                done += n;
        }
        assert_int_equal(close(memfd), 0);
        return fd;
}

/* Waits up to 5 s for [from, to) of fd to be cached (hinted pages come asynchronously). */
static double cached_soon(int fd, uint64_t from, uint64_t to) {
        double in = cached(fd, from, to);

        for (int i = 0; in < 1.0 && i < 500; i++) {
                (void) nanosleep(&(struct timespec) { .tv_nsec = 10000000 }, NULL);
                in = cached(fd, from, to);
        }
        return in;
}

/* An F32 tensor w [rows, cols] in a file on disk (on_disk), opened as a checkpoint. */
static BuildCheckpoint *open_on_disk(uint64_t rows, uint64_t cols) {
        Spec t = { "w", "F32", rows, cols };
        int fd = on_disk(write_file(&t, 1, 0));
        const char *names[1] = { "w.safetensors" };
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpoint *c = NULL;

        assert_int_equal(build_checkpoint_open(&fd, names, 1, &c, &err), 0);
        return c;
}

/* fd's pages out of the page cache, [from, to) checked: read first, so that no page is still
 * being read in (those stay). */
static void evict(int fd, uint64_t from, uint64_t to) {
        static char buf[1 << 20];

        for (off_t at = 0; pread(fd, buf, sizeof buf, at) > 0; at += (off_t) sizeof buf)
                ;
        assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        assert_true(cached(fd, from, to) == 0.0);
}

/* A 16 MiB tensor, all of it asked ahead: every window comes in (one POSIX_FADV_WILLNEED
 * reads only the device's readahead size, 128 KiB by default), and one hint of the file's
 * window comes in whole (the window is not too large). A row shard's box (one run) is
 * asked ahead whole before its first read: a read that fails at once (its destination not
 * writable) leaves the box's pages cached, the file's own read-ahead off. */
static void test_will_need_every_window(void **state) {
        enum { R = 512, C = 8192 };
        BuildCheckpoint *c = open_on_disk(R, C);
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};
        const BuildCheckpointFile *f = &c->files[0];
        uint64_t from = f->header->data_offset, to = f->size, half = (to - from) / 2;
        uint64_t window = f->read_ahead < to - from ? f->read_ahead : to - from;
        assert_int_equal(fdatasync(f->fd), 0);
        evict(f->fd, from, to);
        /* The window is one the kernel honours whole: one hint of it brings all of it in. */
        assert_int_equal(posix_fadvise(f->fd, (off_t) from, (off_t) window,
                                       POSIX_FADV_WILLNEED),
                         0);
        assert_true(cached_soon(f->fd, from, from + window) == 1.0);
        evict(f->fd, from, to);
        read_ahead(f->fd, from, to - from, f->read_ahead);
        assert_true(cached_soon(f->fd, from, to) == 1.0);

        CheckpointPart part = { "w", false };
        CheckpointSource src = { .parts = &part, .n_parts = 1 };
        int64_t shape[2] = { R, C }, o[2] = { R / 2, 0 }, l[2] = { R / 2, C };
        ParameterLayout p = { .name = (char *) "w", .shape = shape, .n_dims = 2,
                              .dtype = DTYPE_FLOAT32 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 2 };
        void *dst = mmap(NULL, (size_t) half, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        assert_true(dst != MAP_FAILED);
        evict(f->fd, from, to);
        assert_int_equal(posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM), 0);
        assert_int_equal(build_checkpoint_read_slice(c, &src, "", &p, &s, dst, staging,
                                                     sizeof staging, &read, &err),
                         -EINVAL);
        assert_string_equal(err.reason, "CHECKPOINT_READ");
        family_error_done(&err);
        assert_int_equal(read.calls, 1);
        assert_true(cached(f->fd, from, from + half) < 0.1); /* the top half: not asked */
        assert_true(cached_soon(f->fd, from + half, to) == 1.0);
        assert_int_equal(munmap(dst, (size_t) half), 0);
        build_checkpoint_free(c);
}

/* A column shard (half of every row) of a tensor: read ahead as a whole span when the node
 * reads the tensor whole (the other half's pages come with it), alone otherwise. The file's
 * own read-ahead is off (POSIX_FADV_RANDOM), so only the reader's hint brings pages in. */
static void test_read_ahead(void **state) {
        enum { R = 64, C = 8192 };
        BuildCheckpoint *c = open_on_disk(R, C);
        FamilyError err = FAMILY_ERROR_NULL;
        CheckpointPart part = { "w", false };
        CheckpointSource src = { .parts = &part, .n_parts = 1 };
        int64_t shape[2] = { R, C }, o[2] = { 0, 0 }, l[2] = { R, C / 2 };
        ParameterLayout p = { .name = (char *) "w", .shape = shape, .n_dims = 2,
                              .dtype = DTYPE_FLOAT32 };
        ShardSlice s = { .local_shape = l, .global_offset = o, .n_dims = 2 };
        _cleanup_free_ float *out = calloc(R * C / 2, sizeof(float));
        const BuildCheckpointFile *f = &c->files[0];
        uint64_t from = f->header->data_offset, to = f->size;

        assert_non_null(out);
        for (int whole = 0; whole < 2; whole++) {
                BuildCheckpointReads read = {};
                assert_int_equal(fdatasync(f->fd), 0);
                evict(f->fd, from, to);
                assert_int_equal(posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM), 0);
                c->tensors[0].read_whole = whole;
                assert_int_equal(build_checkpoint_read_slice(c, &src, "", &p, &s,
                                                             (uint8_t *) out, staging,
                                                             sizeof staging, &read, &err), 0);
                assert_int_equal(read.bytes, (uint64_t) R * C / 2 * 4);
                assert_int_equal(read.calls, R); /* a row's half each */
                for (int64_t r = 0; r < R; r++)
                        for (int64_t k = 0; k < C / 2; k += 997)
                                assert_true(out[r * C / 2 + k] ==
                                            element(0, (uint64_t) (r * C + k)));
                double in = whole ? cached_soon(f->fd, from, to) : cached(f->fd, from, to);
                if (whole ? in < 1.0 : in > 0.8)
                        fail_msg("read_whole %d: %.3f of the tensor's pages cached", whole, in);
        }
        build_checkpoint_free(c);
}

/* A banded tensor w [R, C], F32: its column halves as float32 slices, and a transposed
 * bfloat16 parameter's half (its rows are w's columns), with their buffers. */
enum { BR = 64, BC = 256, STEP = 10 };
typedef struct Bands {
        BuildCheckpoint *c;
        CheckpointPart part, transposed;
        CheckpointSource src, src_t;
        int64_t shape[2], shape_t[2], l[2], l_t[2], o_left[2], o_right[2], o_t[2];
        ParameterLayout p, p_t;
        ShardSlice left, right, half_t;
        BuildCheckpointTargets targets; /* left into a, right into b, half_t into tt */
        float a[BR * BC / 2], b[BR * BC / 2];
        uint16_t tt[BR * BC / 2];
        uint8_t band[STEP * BC * 4];
} Bands;

static Bands *bands_open(void) {
        Spec t = { "w", "F32", BR, BC };
        int fd = write_file(&t, 1, 0);
        const char *names[1] = { "w.safetensors" };
        FamilyError err = FAMILY_ERROR_NULL;
        Bands *x = calloc(1, sizeof *x);

        assert_non_null(x);
        assert_int_equal(build_checkpoint_open(&fd, names, 1, &x->c, &err), 0);
        x->c->tensors[0].read_whole = x->c->tensors[0].banded = true;
        x->part = (CheckpointPart) { "w", false };
        x->transposed = (CheckpointPart) { "w", true };
        x->src = (CheckpointSource) { .parts = &x->part, .n_parts = 1 };
        x->src_t = (CheckpointSource) { .parts = &x->transposed, .n_parts = 1 };
        memcpy(x->shape, (int64_t[]) { BR, BC }, sizeof x->shape);
        memcpy(x->shape_t, (int64_t[]) { BC, BR }, sizeof x->shape_t);
        memcpy(x->l, (int64_t[]) { BR, BC / 2 }, sizeof x->l);
        memcpy(x->l_t, (int64_t[]) { BC / 2, BR }, sizeof x->l_t);
        memcpy(x->o_right, (int64_t[]) { 0, BC / 2 }, sizeof x->o_right);
        memcpy(x->o_t, (int64_t[]) { BC / 2, 0 }, sizeof x->o_t);
        x->p = (ParameterLayout) { .name = (char *) "w", .shape = x->shape, .n_dims = 2,
                                   .dtype = DTYPE_FLOAT32 };
        x->p_t = (ParameterLayout) { .name = (char *) "wt", .shape = x->shape_t, .n_dims = 2,
                                     .dtype = DTYPE_BFLOAT16 };
        x->left = (ShardSlice) { .local_shape = x->l, .global_offset = x->o_left, .n_dims = 2,
                                 .byte_length = BR * BC / 2 * 4 };
        x->right = (ShardSlice) { .local_shape = x->l, .global_offset = x->o_right,
                                  .n_dims = 2, .byte_length = BR * BC / 2 * 4 };
        x->half_t = (ShardSlice) { .local_shape = x->l_t, .global_offset = x->o_t, .n_dims = 2,
                                   .byte_length = BR * BC / 2 * 2 };
        /* Each slice's one block of the banded w, planned once, in the order asked. */
        assert_int_equal(build_checkpoint_band_targets(x->c, &x->src, "", &x->p, &x->left,
                                                       (uint8_t *) x->a, &x->targets, &err),
                         0);
        assert_int_equal(build_checkpoint_band_targets(x->c, &x->src, "", &x->p, &x->right,
                                                       (uint8_t *) x->b, &x->targets, &err),
                         0);
        assert_int_equal(build_checkpoint_band_targets(x->c, &x->src_t, "", &x->p_t,
                                                       &x->half_t, (uint8_t *) x->tt,
                                                       &x->targets, &err),
                         0);
        assert_int_equal(x->targets.n, 3);
        for (size_t i = 0; i < 3; i++)
                assert_int_equal(x->targets.targets[i].tensor, 0);
        assert_ptr_equal(x->targets.targets[1].dst, (uint8_t *) x->b);
        assert_ptr_equal(x->targets.targets[1].slice, &x->right);
        return x;
}

static void bands_free(Bands *x) {
        build_checkpoint_targets_done(&x->targets);
        assert_null(x->targets.targets);
        build_checkpoint_free(x->c);
        free(x);
}

/* Both float32 halves hold w's values. */
static void bands_check_halves(const Bands *x) {
        for (int64_t r = 0; r < BR; r++)
                for (int64_t k = 0; k < BC / 2; k++)
                        if (x->a[r * BC / 2 + k] != element(0, (uint64_t) (r * BC + k)) ||
                            x->b[r * BC / 2 + k] != element(0, (uint64_t) (r * BC + BC / 2 + k)))
                                fail_msg("[%" PRId64 ",%" PRId64 "]: %g %g", r, k,
                                         x->a[r * BC / 2 + k], x->b[r * BC / 2 + k]);
}

/* The slices' reads skip a banded tensor; bands of whole rows, read once each, scattered from
 * memory, fill both column halves and the transposed half, band by band. */
static void test_bands_through_memory(void **state) {
        Bands *x = bands_open();
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};

        assert_int_equal(build_checkpoint_row_bytes(x->c, 0), BC * 4);
        assert_int_equal(build_checkpoint_read_slice(x->c, &x->src, "", &x->p, &x->left,
                                                     (uint8_t *) x->a, staging, sizeof staging,
                                                     &read, &err),
                         0);
        assert_int_equal(read.calls, 0);
        assert_int_equal(read.bytes, 0);
        assert_true(x->a[0] == 0.0f && x->a[BR * BC / 2 - 1] == 0.0f);
        for (int64_t row = 0; row < BR; row += STEP) {
                int64_t rows = BR - row < STEP ? BR - row : STEP;
                assert_int_equal(build_checkpoint_read_band(x->c, 0, row, rows, x->band, &read,
                                                            &err),
                                 0);
                for (size_t i = 0; i < x->targets.n; i++)
                        assert_int_equal(build_checkpoint_scatter_band(x->c,
                                                                       &x->targets.targets[i],
                                                                       x->band, row, rows, &err),
                                         0);
        }
        assert_int_equal(read.calls, (BR + STEP - 1) / STEP); /* a band, a read */
        assert_int_equal(read.bytes, (uint64_t) BR * BC * 4); /* every byte once */
        bands_check_halves(x);
        for (int64_t r = 0; r < BR; r++)
                for (int64_t k = 0; k < BC / 2; k++) {
                        /* wt[C/2 + k][r] = w[r][C/2 + k], rounded to bfloat16 */
                        float want = element(0, (uint64_t) (r * BC + BC / 2 + k));
                        if (bfloat16_to_float(x->tt[k * BR + r]) !=
                            bfloat16_to_float(float_to_bfloat16(want)))
                                fail_msg("wt[%" PRId64 ",%" PRId64 "]", BC / 2 + k, r);
                }
        bands_free(x);
}

/* The same halves read straight into place: both halves' runs tile each band, one preadv a
 * band; one half alone, or a converting parameter, is refused with nothing read. */
static void test_bands_straight(void **state) {
        Bands *x = bands_open();
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};

        for (int64_t row = 0; row < BR; row += STEP) {
                int64_t rows = BR - row < STEP ? BR - row : STEP;
                const BuildCheckpointTarget *t = x->targets.targets;
                BuildCheckpointRuns runs = { .max = (size_t) (2 * rows) };
                assert_int_equal(build_checkpoint_band_runs(x->c, &t[0], row, rows, &runs, &err),
                                 0);
                assert_int_equal(build_checkpoint_read_runs(x->c, 0, row, rows, &runs, &read,
                                                            &err),
                                 -EOPNOTSUPP);
                assert_int_equal(read.calls, (uint64_t) (row / STEP));
                assert_int_equal(build_checkpoint_band_runs(x->c, &t[1], row, rows, &runs, &err),
                                 0);
                assert_int_equal(runs.n, (size_t) (2 * rows));
                assert_true(runs.allocated >= runs.n && runs.allocated <= runs.max);
                assert_int_equal(build_checkpoint_read_runs(x->c, 0, row, rows, &runs, &read,
                                                            &err),
                                 0);
                /* One run fewer allowed than the halves need: refused, to go through memory. */
                runs.n = 0;
                runs.max = (size_t) (2 * rows - 1);
                assert_int_equal(build_checkpoint_band_runs(x->c, &t[0], row, rows, &runs, &err),
                                 0);
                assert_int_equal(build_checkpoint_band_runs(x->c, &t[1], row, rows, &runs, &err),
                                 -EOPNOTSUPP);
                free(runs.runs);
                runs = (BuildCheckpointRuns) { .max = SIZE_MAX };
                assert_int_equal(build_checkpoint_band_runs(x->c, &t[2], row, rows, &runs, &err),
                                 -EOPNOTSUPP);
                free(runs.runs);
        }
        assert_int_equal(read.calls, (BR + STEP - 1) / STEP);
        assert_int_equal(read.bytes, (uint64_t) BR * BC * 4);
        bands_check_halves(x);
        bands_free(x);
}

/* The file cut short after it was opened: both ways say which file and where. */
static void test_bands_cut_short(void **state) {
        Bands *x = bands_open();
        const BuildCheckpointFile *f = &x->c->files[0];
        FamilyError err = FAMILY_ERROR_NULL;
        BuildCheckpointReads read = {};
        BuildCheckpointRuns runs = { .max = SIZE_MAX };

        assert_int_equal(ftruncate(f->fd, (off_t) (f->header->data_offset + BC * 4)), 0);
        for (size_t i = 0; i < 2; i++)
                assert_int_equal(build_checkpoint_band_runs(x->c, &x->targets.targets[i], 0, STEP,
                                                            &runs, &err),
                                 0);
        assert_int_equal(build_checkpoint_read_runs(x->c, 0, 0, STEP, &runs, &read, &err),
                         -EINVAL);
        free(runs.runs);
        assert_string_equal(err.reason, "CHECKPOINT_READ");
        assert_non_null(strstr(err.message, "checkpoint file w.safetensors: it ended early"));
        family_error_done(&err);
        assert_int_equal(build_checkpoint_read_band(x->c, 0, 0, STEP, x->band, &read, &err),
                         -EINVAL);
        assert_string_equal(err.reason, "CHECKPOINT_READ");
        family_error_done(&err);
        bands_free(x);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_gate_up),
                cmocka_unit_test(test_rows_and_bytes_read),
                cmocka_unit_test(test_refusals),
                cmocka_unit_test(test_open_refusals),
                cmocka_unit_test(test_read_whole_marking),
                cmocka_unit_test(test_bands_through_memory),
                cmocka_unit_test(test_bands_straight),
                cmocka_unit_test(test_bands_cut_short),
                cmocka_unit_test(test_read_ahead),
                cmocka_unit_test(test_will_need_every_window),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

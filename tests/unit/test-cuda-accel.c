/* test-cuda-accel.c: the accelerator backends in-process: host and CUDA (the tests' fake driver,
 * named by FAMILYD_CUDA_DRIVER, loaded through the daemon's own dlopen path), GPU budgets,
 * granularity, fills against the host reference, and driver failures. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "core/fill.h"
#include "common/macro.h"
#include "shm/accel.h"
#include "shm/segment.h"

#define MiB (UINT64_C(1) << 20)

static char state_file[PATH_MAX];

/* The fake driver's count of what this process holds ("allocations=N ..."). */
static long fake_count(const char *what) {
        char buf[512], key[64];
        FILE *f = fopen(state_file, "r");
        long v = -1;

        if (!f)
                return -1;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        (void) snprintf(key, sizeof key, "%s=", what);
        char *p = strstr(buf, key);
        if (p)
                v = strtol(p + strlen(key), NULL, 10);
        return v;
}

static void devices_init(Device *d, size_t n, const char *kind, uint64_t memory) {
        for (size_t i = 0; i < n; i++)
                d[i] = (Device) {
                        .local_index = (int32_t) i,
                        .kind = (char *) kind,
                        .name = (char *) "dev",
                        .uuid = (char *) "",
                        .memory_bytes = memory,
                        .pci_bus_id = (char *) "",
                };
}

static int setup(void **state) {
        (void) snprintf(state_file, sizeof state_file, "/tmp/test-cuda-accel-%d.state",
                        (int) getpid());
        (void) setenv("FAKE_CUDA_STATE_FILE", state_file, 1);
        (void) setenv("FAKE_CUDA_DEVICES", "2", 1);
        (void) unsetenv("FAKE_CUDA_FAIL_ALLOC");
        (void) unsetenv("FAKE_CUDA_NO_VMM");
        (void) unsetenv("FAMILYD_CUDA_FILL");
        return 0;
}

static int teardown(void **state) {
        (void) unlink(state_file);
        return 0;
}

static void test_host_devices(void **state) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        _cleanup_(shard_segment_unrefp) ShardSegment *s = NULL;
        AccelReservation *res = (AccelReservation *) 1;
        FamilyError e = FAMILY_ERROR_NULL;
        Device d[2];

        devices_init(d, 2, "host", 1u << 30);
        assert_int_equal(accel_new(d, 2, &a), 0);
        assert_false(accel_device_is_gpu(a, 0));
        assert_string_equal(accel_device_kind(a, 1), "host");
        assert_string_equal(accel_device_kind(a, 7), "host");
        assert_int_equal(accel_allocation_size(a, 0, 12345), 12345);
        assert_int_equal(accel_check_device(a, 0, &e), 0);
        assert_int_equal(accel_reserve(a, NULL, NULL, 0, &res, &e), 0);
        assert_null(res);
        assert_int_equal(accel_segment_new(a, 1, "h", 4096, &s, &e), 0);
        assert_true(shard_segment_is_host(s));
        assert_true(shard_segment_is_sealed(s));
        /* No GPU, so no driver was opened. */
        assert_true(fake_count("contexts") <= 0);
}

static void test_gpu_budgets(void **state) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        AccelReservation *r1 = NULL, *r2 = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        Device d[3];

        devices_init(d, 2, "cuda", 64 * MiB);
        devices_init(d + 2, 1, "host", 64 * MiB);
        d[2].local_index = 2;
        assert_int_equal(accel_new(d, 3, &a), 0);
        assert_true(accel_device_is_gpu(a, 1));
        assert_false(accel_device_is_gpu(a, 2));
        /* An eighth stays free. */
        assert_int_equal(accel_budget(a, 0), 56 * MiB);
        assert_int_equal(accel_budget(a, 2), 0);

        int32_t devs[] = { 0, 1, 0 };
        uint64_t bytes[] = { 20 * MiB, 10 * MiB, 10 * MiB };
        assert_int_equal(accel_reserve(a, devs, bytes, 3, &r1, &e), 0);
        assert_non_null(r1);
        assert_int_equal(accel_in_use(a, 0), 30 * MiB);
        assert_int_equal(accel_in_use(a, 1), 10 * MiB);

        /* All or nothing: cuda:1 fits, cuda:0 does not, so neither is taken. */
        int32_t devs2[] = { 1, 0 };
        uint64_t bytes2[] = { 10 * MiB, 30 * MiB };
        assert_int_equal(accel_reserve(a, devs2, bytes2, 2, &r2, &e), -EINVAL);
        assert_null(r2);
        assert_int_equal(e.status, FAMILY_STATUS_RESOURCE_EXHAUSTED);
        assert_string_equal(e.reason, "DEVICE_BUDGET");
        assert_string_equal(e.message, "GPU memory budget exceeded on cuda:0: build needs "
                                       "31457280 bytes, 31457280 of 58720256 in use");
        family_error_done(&e);
        assert_int_equal(accel_in_use(a, 1), 10 * MiB);

        /* A host device has no GPU budget to take from. */
        int32_t host[] = { 2 };
        assert_int_equal(accel_reserve(a, host, bytes, 1, &r2, &e), -EINVAL);

        r1 = accel_reservation_free(r1);
        assert_int_equal(accel_in_use(a, 0), 0);
        assert_int_equal(accel_in_use(a, 1), 0);
        assert_int_equal(accel_reserve(a, devs2, bytes2, 2, &r2, &e), 0);
        /* The reservation keeps the Accel: freed after it, the count still goes back. */
        accel_unref(TAKE_PTR(a));
        accel_reservation_free(r2);
}

/* A few slices of every init kind, in a rank's bytes with gaps between them. */
static size_t make_slices(MaterializeSlice *m, int64_t *shape, int64_t *local, int64_t *offset,
                          Dtype dtype) {
        static const struct {
                InitKind kind;
                double a, b, c, d;
        } inits[] = {
                { INIT_UNIFORM, -1, 1 }, { INIT_CONSTANT, 1.5, 0 }, { INIT_NORMAL, 0.5, 2 },
                { INIT_ONES, 0, 0 },     { INIT_ZEROS, 0, 0 },
                /* not in the kernel: staged through host memory like normal */
                { INIT_TRUNC_NORMAL, 0, 0.02, -0.03, 0.04 },
        };
        uint64_t at = 64;

        for (size_t i = 0; i < ELEMENTSOF(inits); i++) {
                int64_t *sh = shape + 3 * i, *lo = local + 3 * i, *of = offset + 3 * i;
                sh[0] = 40, sh[1] = 7, sh[2] = 9;
                lo[0] = 13, lo[1] = 7, lo[2] = 4;
                of[0] = 5, of[1] = 0, of[2] = 3;
                assert_int_equal(fill_spec_init4(&m[i].spec, inits[i].kind,
                                                 (const double[4]) { inits[i].a, inits[i].b, inits[i].c,
                                                                     inits[i].d },
                                                 42, i % 2 ? "experts.w1" : "experts.w2", dtype),
                                 0);
                m[i].fill = (FillSlice) { .spec = &m[i].spec, .rank = 3, .shape = sh,
                                          .local_shape = lo, .global_offset = of };
                m[i].byte_offset = at;
                m[i].byte_length = 13 * 7 * 4 * dtype_size(dtype);
                at += (m[i].byte_length + 127) / 64 * 64;
        }
        return ELEMENTSOF(inits);
}

/* The bytes of a device segment: the fake's allocations are memfds, so its descriptor maps. */
static uint8_t *segment_bytes(ShardSegment *s) {
        int fd;
        assert_int_equal(shard_segment_seal(s), 0); /* a host one's, after its fill */
        assert_int_equal(shard_segment_open(s, false, &fd), 0);
        void *p = mmap(NULL, shard_segment_size(s), PROT_READ, MAP_SHARED, fd, 0);
        close(fd);
        assert_true(p != MAP_FAILED);
        return p;
}

static void check_gpu_fill(bool kernel) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        _cleanup_(shard_segment_unrefp) ShardSegment *g = NULL, *h = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        MaterializeSlice m[6];
        int64_t shape[18], local[18], offset[18];
        Device d[2];

        if (!kernel)
                (void) setenv("FAMILYD_CUDA_FILL", "host", 1);
        devices_init(d, 2, "cuda", 80u * 1024 * MiB);
        assert_int_equal(accel_new(d, 2, &a), 0);
        (void) unsetenv("FAMILYD_CUDA_FILL");

        for (Dtype dt = 0; dt < _DTYPE_MAX; dt++) {
                size_t n = make_slices(m, shape, local, offset, dt);
                uint64_t size = m[n - 1].byte_offset + m[n - 1].byte_length;
                long launches = fake_count("launches");

                assert_int_equal(accel_segment_new(a, 1, "g", size, &g, &e), 0);
                assert_false(shard_segment_is_host(g));
                assert_false(shard_segment_is_sealed(g));
                assert_string_equal(shard_segment_device_kind(g), "cuda");
                assert_int_equal(shard_segment_device(g), 1);
                /* Rounded up to the fake's 2 MiB granularity. */
                assert_int_equal(shard_segment_size(g), 2 * MiB);
                assert_int_equal(accel_allocation_size(a, 1, size), 2 * MiB);
                assert_int_equal(accel_allocation_size(a, 1, 2 * MiB + 1), 4 * MiB);
                assert_int_equal(fake_count("allocations"), 1);

                assert_int_equal(shard_segment_new_host("h", size, 0, &h), 0);
                assert_int_equal(accel_fill_slices(a, h, m, n, &e), 0);
                assert_int_equal(accel_fill_slices(a, g, m, n, &e), 0);
                /* The daemon's own mapping and reservation are gone. */
                assert_int_equal(fake_count("mappings"), 0);
                assert_int_equal(fake_count("reservations"), 0);
                /* uniform, constant, ones, zeros by the kernel; normal and trunc_normal through
                 * host memory */
                assert_int_equal(fake_count("launches") - launches, kernel ? 4 : 0);

                uint8_t *gb = segment_bytes(g), *hb = segment_bytes(h);
                assert_memory_equal(gb, hb, size);
                /* The rest of the allocation is cleared, not what the GPU held before. */
                for (uint64_t i = size; i < 2 * MiB; i++)
                        if (gb[i] != 0)
                                fail_msg("byte %llu of the allocation is 0x%02x",
                                         (unsigned long long) i, gb[i]);
                munmap(gb, 2 * MiB);
                munmap(hb, size);

                g = shard_segment_unref(g);
                h = shard_segment_unref(h);
                assert_int_equal(fake_count("allocations"), 0);
        }
        assert_int_equal(fake_count("contexts"), 2);
        a = accel_unref(a);
        assert_int_equal(fake_count("contexts"), 0);
}

static void test_gpu_fill_kernel(void **state) {
        check_gpu_fill(true);
}

static void test_gpu_fill_through_host(void **state) {
        check_gpu_fill(false);
}

static void test_gpu_alloc_failures(void **state) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        ShardSegment *g = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        Device d[2];

        devices_init(d, 2, "cuda", 80u * 1024 * MiB);
        assert_int_equal(accel_new(d, 2, &a), 0);

        (void) setenv("FAKE_CUDA_FAIL_ALLOC", "2", 1);
        assert_int_equal(accel_segment_new(a, 0, "g", 100, &g, &e), -EINVAL);
        assert_null(g);
        assert_int_equal(e.status, FAMILY_STATUS_RESOURCE_EXHAUSTED);
        assert_string_equal(e.reason, "DEVICE_MEMORY");
        assert_string_equal(e.message, "GPU memory exhausted on cuda:0 (cuMemCreate: out of "
                                       "memory); nothing was kept");
        family_error_done(&e);

        (void) setenv("FAKE_CUDA_FAIL_ALLOC", "999", 1);
        assert_int_equal(accel_segment_new(a, 1, "g", 100, &g, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_UNAVAILABLE);
        assert_string_equal(e.reason, "CUDA");
        assert_string_equal(e.message, "the CUDA driver failed on cuda:1: cuMemCreate: fake CUDA "
                                       "error (CUresult 999); nothing was kept");
        family_error_done(&e);
        (void) unsetenv("FAKE_CUDA_FAIL_ALLOC");
        assert_int_equal(fake_count("allocations"), 0);

        /* An index past the node's devices is host memory, like any non-GPU device. */
        assert_int_equal(accel_segment_new(a, 5, "g", 100, &g, &e), 0);
        assert_true(shard_segment_is_host(g));
        g = shard_segment_unref(g);
}

static void test_gpu_without_vmm(void **state) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        ShardSegment *g = NULL;
        Device d[1];

        (void) setenv("FAKE_CUDA_NO_VMM", "1", 1);
        devices_init(d, 1, "cuda", 80u * 1024 * MiB);
        assert_int_equal(accel_new(d, 1, &a), 0);
        (void) unsetenv("FAKE_CUDA_NO_VMM");
        assert_int_equal(accel_check_device(a, 0, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_FAILED_PRECONDITION);
        assert_string_equal(e.message, "cannot hold shards on cuda:0: the GPU does not support "
                                       "virtual memory management");
        family_error_done(&e);
        assert_int_equal(accel_segment_new(a, 0, "g", 100, &g, &e), -EINVAL);
        assert_null(g);
        family_error_done(&e);
}

static void test_gpu_without_driver(void **state) {
        _cleanup_(accel_unrefp) Accel *a = NULL;
        FamilyError e = FAMILY_ERROR_NULL;
        char *saved = strdup(getenv("FAMILYD_CUDA_DRIVER") ? getenv("FAMILYD_CUDA_DRIVER") : "");
        Device d[1];

        (void) setenv("FAMILYD_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
        devices_init(d, 1, "cuda", 80u * 1024 * MiB);
        assert_int_equal(accel_new(d, 1, &a), 0);
        (void) setenv("FAMILYD_CUDA_DRIVER", saved, 1);
        free(saved);
        assert_true(accel_device_is_gpu(a, 0));
        assert_int_equal(accel_check_device(a, 0, &e), -EINVAL);
        assert_int_equal(e.status, FAMILY_STATUS_FAILED_PRECONDITION);
        assert_string_equal(e.message, "cannot hold shards on cuda:0: the CUDA driver "
                                       "(libcuda.so.1) is not installed");
        family_error_done(&e);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test_setup_teardown(test_host_devices, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gpu_budgets, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gpu_fill_kernel, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gpu_fill_through_host, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gpu_alloc_failures, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gpu_without_vmm, setup, teardown),
                cmocka_unit_test_setup_teardown(test_gpu_without_driver, setup, teardown),
        };
        if (!getenv("FAMILYD_CUDA_DRIVER")) {
                fprintf(stderr, "FAMILYD_CUDA_DRIVER must name the fake driver\n");
                return 77;
        }
        return cmocka_run_group_tests(tests, NULL, NULL);
}

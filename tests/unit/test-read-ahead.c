/* test-read-ahead.c: a file's read-ahead window from a sysfs tree (a disk, a partition, nothing
 * known), and hints that bring in every window of a range. */

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "hw/read-ahead.h"

static char root[] = "/tmp/test-read-ahead-XXXXXX";

static void put(const char *rel, const char *text) {
        char path[512];
        FILE *f;

        (void) snprintf(path, sizeof path, "%s/%s", root, rel);
        f = fopen(path, "we");
        assert_non_null(f);
        assert_true(fputs(text, f) >= 0);
        assert_int_equal(fclose(f), 0);
}

static void dir(const char *rel) {
        char path[512];

        (void) snprintf(path, sizeof path, "%s/%s", root, rel);
        assert_int_equal(mkdir(path, 0755), 0);
}

static void link_to(const char *target, const char *rel) {
        char path[512];

        (void) snprintf(path, sizeof path, "%s/%s", root, rel);
        assert_int_equal(symlink(target, path), 0);
}

/* As /sys/dev/block: "M:m" links to the device's folder; a partition's queue is its disk's. */
static int tree_make(void **state) {
        assert_non_null(mkdtemp(root));
        dir("devices");
        dir("devices/vda");
        dir("devices/vda/queue");
        put("devices/vda/queue/read_ahead_kb", "8192\n");
        put("devices/vda/queue/max_sectors_kb", "4096\n");
        dir("devices/vda/vda1");
        put("devices/vda/vda1/partition", "1\n");
        dir("devices/nvme0n1");
        dir("devices/nvme0n1/queue");
        put("devices/nvme0n1/queue/read_ahead_kb", "128\n");
        put("devices/nvme0n1/queue/max_sectors_kb", "1280\n");
        dir("devices/huge");
        dir("devices/huge/queue");
        put("devices/huge/queue/read_ahead_kb", "1048576\n");
        put("devices/huge/queue/max_sectors_kb", "garbage\n");
        dir("devices/small");
        dir("devices/small/queue");
        put("devices/small/queue/read_ahead_kb", "64\n");
        put("devices/small/queue/max_sectors_kb", "60\n");
        dir("devices/off");
        dir("devices/off/queue");
        put("devices/off/queue/read_ahead_kb", "0\n");
        put("devices/off/queue/max_sectors_kb", "0\n");
        dir("block");
        link_to("../devices/vda", "block/253:0");
        link_to("../devices/vda/vda1", "block/253:1");
        link_to("../devices/nvme0n1", "block/259:0");
        link_to("../devices/huge", "block/8:0");
        link_to("../devices/off", "block/8:16");
        link_to("../devices/small", "block/8:32");
        return 0;
}

static int tree_remove(void **state) {
        char cmd[600];

        (void) snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        return system(cmd) == 0 ? 0 : -1;
}

/* The larger of read_ahead_kb and max_sectors_kb, a partition's from its disk, at most
 * READ_AHEAD_MAX, a device's own even below the kernel's default; the default where nothing
 * is known. */
static void test_window_from_sysfs(void **state) {
        char block[600];

        (void) snprintf(block, sizeof block, "%s/block", root);
        assert_int_equal(read_ahead_window_at(block, makedev(253, 0)), 8u << 20);
        assert_int_equal(read_ahead_window_at(block, makedev(253, 1)), 8u << 20);
        assert_int_equal(read_ahead_window_at(block, makedev(259, 0)), 1280u << 10);
        assert_int_equal(read_ahead_window_at(block, makedev(8, 0)), READ_AHEAD_MAX);
        assert_int_equal(read_ahead_window_at(block, makedev(8, 16)), READ_AHEAD_DEFAULT);
        assert_int_equal(read_ahead_window_at(block, makedev(8, 32)), 64u << 10);
        assert_int_equal(read_ahead_window_at(block, makedev(0, 42)), READ_AHEAD_DEFAULT);
        assert_int_equal(read_ahead_window_at("/nonexistent", makedev(253, 0)),
                         READ_AHEAD_DEFAULT);
}

/* This machine's /var/tmp: a window of whole pages, at most READ_AHEAD_MAX (that the kernel
 * honours it whole is test-build-checkpoint's test_will_need_every_window); a descriptor
 * that is not open: the default. */
static void test_window_of_a_file(void **state) {
        char path[] = "/var/tmp/test-read-ahead-XXXXXX";
        int fd = mkstemp(path);

        assert_true(fd >= 0);
        assert_int_equal(unlink(path), 0);
        uint64_t w = read_ahead_window(fd);
        assert_true(w >= 4096 && w % 1024 == 0 && w <= READ_AHEAD_MAX);
        assert_int_equal(close(fd), 0);
        assert_int_equal(read_ahead_window(-1), READ_AHEAD_DEFAULT);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_window_from_sysfs),
                cmocka_unit_test(test_window_of_a_file),
        };
        return cmocka_run_group_tests(tests, tree_make, tree_remove);
}

/* read-ahead.c: a file's read-ahead window from its block device's queue in sysfs, and hints in windows of it. */

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include "read-ahead.h"

/* The number in dir/name (a sysfs attribute in KiB), or 0. */
static uint64_t kib_at(const char *dir, const char *name) {
        char path[512];
        uint64_t v = 0;

        if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int) sizeof path)
                return 0;
        FILE *f = fopen(path, "re");
        if (!f)
                return 0;
        if (fscanf(f, "%" SCNu64, &v) != 1)
                v = 0;
        (void) fclose(f);
        return v > READ_AHEAD_MAX >> 10 ? READ_AHEAD_MAX >> 10 : v;
}

uint64_t read_ahead_window_at(const char *sys_dev_block, dev_t dev) {
        static const char *const queues[] = { "queue", "../queue" }; /* a disk, a partition */
        char dir[512];

        for (size_t i = 0; i < sizeof queues / sizeof *queues; i++) {
                if (snprintf(dir, sizeof dir, "%s/%u:%u/%s", sys_dev_block, major(dev),
                             minor(dev), queues[i]) >= (int) sizeof dir)
                        return READ_AHEAD_DEFAULT;
                uint64_t ra = kib_at(dir, "read_ahead_kb"), io = kib_at(dir, "max_sectors_kb");
                uint64_t kib = ra > io ? ra : io;
                if (kib > 0)
                        return kib << 10; /* a device's own: honoured whole, however small */
        }
        return READ_AHEAD_DEFAULT;
}

uint64_t read_ahead_window(int fd) {
        struct stat st;

        if (fstat(fd, &st) < 0)
                return READ_AHEAD_DEFAULT;
        return read_ahead_window_at("/sys/dev/block", st.st_dev);
}

void read_ahead(int fd, uint64_t at, uint64_t len, uint64_t window) {
        if (window == 0)
                window = READ_AHEAD_DEFAULT;
        if (at > INT64_MAX || len > INT64_MAX - at)
                return;
        for (uint64_t done = 0; done < len; done += window) {
                uint64_t n = len - done < window ? len - done : window;
                (void) posix_fadvise(fd, (off_t) (at + done), (off_t) n, POSIX_FADV_WILLNEED);
        }
}

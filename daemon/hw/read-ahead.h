/* read-ahead.h: how much of a file one read-ahead hint brings in (its block device's readahead size), and hints in windows of it. */
#pragma once

#include <stdint.h>
#include <sys/types.h>

/*
 * DESIGN: POSIX_FADV_WILLNEED reads at most the device's readahead size a call, whatever
 * length it is given: the larger of the queue's read_ahead_kb and max_sectors_kb (Linux's
 * force_page_cache_ra(); 128 KiB by default). A hint of a whole tensor on a disk of 128 KiB
 * brings in 128 KiB. The window is read once per file from sysfs (the block device's queue,
 * a partition's disk's), and a hint goes as one call per window, each queued at once, so the
 * disk has many requests in flight. Where sysfs says nothing (a network or stacked
 * filesystem, no /sys), the window is the kernel's default; a device whose own is smaller
 * (an operator's setting) gets its own.
 */

/* The kernel's default readahead: the window when nothing better is known. */
#define READ_AHEAD_DEFAULT (UINT64_C(128) << 10)
/* The largest window used, whatever a device says. */
#define READ_AHEAD_MAX (UINT64_C(16) << 20)

/* The window of the file open as fd: its device's, from /sys/dev/block. */
uint64_t read_ahead_window(int fd);

/* The same for device dev, from the sysfs folder sys_dev_block (/sys/dev/block: one entry
 * "MAJOR:MINOR" per block device, a partition's "queue" in its parent's folder). */
uint64_t read_ahead_window_at(const char *sys_dev_block, dev_t dev);

/* Asks the kernel to read [at, at + len) of fd ahead, all of it: one POSIX_FADV_WILLNEED per
 * window bytes (READ_AHEAD_DEFAULT when window is 0). */
void read_ahead(int fd, uint64_t at, uint64_t len, uint64_t window);

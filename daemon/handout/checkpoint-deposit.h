/* checkpoint-deposit.h: checkpoint files clients opened and handed over on the shard socket, kept under random tokens until Builds read them. */
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/macro.h"
#include "token.h"

/*
 * DESIGN
 *
 * The daemon never opens a checkpoint: a client opens the files with its own rights and sends
 * the descriptors over the shard socket (ShardFdRequest.checkpoint_files); they are kept here
 * under a fresh token (token.h) that only Builds of the depositing uid can name. A Build takes
 * its own duplicates of the descriptors and reads the headers itself, each time: a deposit is
 * no more than descriptors and names, so a file changed between two Builds is read afresh.
 *
 * Limits, against a client that deposits and never builds (each descriptor is the daemon's):
 * CHECKPOINT_DEPOSITS_PER_UID deposits and CHECKPOINT_DEPOSIT_MAX_FDS_PER_UID descriptors per
 * uid, CHECKPOINT_DEPOSITS_MAX deposits and CHECKPOINT_DEPOSIT_MAX_FDS descriptors in all (each
 * descriptor is one of the daemon's, against RLIMIT_NOFILE); a deposit is dropped (its descriptors closed,
 * so a deleted checkpoint's space comes back) CHECKPOINT_DEPOSIT_IDLE_MS after it was made or
 * last named by a Build. The table is shared by the shard socket's thread and the Build
 * threads under one mutex; nothing is read from a file under it.
 */

#define CHECKPOINT_DEPOSITS_PER_UID 64u
#define CHECKPOINT_DEPOSITS_MAX 512u
#define CHECKPOINT_DEPOSIT_MAX_FDS 8192u
#define CHECKPOINT_DEPOSIT_MAX_FDS_PER_UID (CHECKPOINT_DEPOSIT_MAX_FDS / 2u)
#define CHECKPOINT_DEPOSIT_MAX_FILES 253u /* SCM_MAX_FD: one frame's descriptors */
#define CHECKPOINT_DEPOSIT_IDLE_MS 120000u
#define CHECKPOINT_FILE_NAME_MAX 255u

typedef struct CheckpointDeposits CheckpointDeposits;

/* What a Build gets of a deposit: duplicates of its descriptors and copies of its names. */
typedef struct CheckpointFiles {
        int *fds;
        char **names;
        size_t n;
} CheckpointFiles;

void checkpoint_files_done(CheckpointFiles *f);

int checkpoint_deposits_new(CheckpointDeposits **ret);
CheckpointDeposits *checkpoint_deposits_free(CheckpointDeposits *t);
DEFINE_TRIVIAL_CLEANUP_FUNC(CheckpointDeposits *, checkpoint_deposits_free);

/*
 * Checks one file of a deposit before it is kept: a regular file open for reading (not
 * O_PATH, not write-only) and a base name (1..255 bytes, no "/", not "." or ".."). 0, or
 * -EINVAL with why filled.
 */
int checkpoint_deposit_check_file(int fd, const char *name, char *why, size_t why_size);

/*
 * Keeps files (every fd and name is taken over, on success and on failure) for uid under a new
 * token. -EUSERS: uid holds CHECKPOINT_DEPOSITS_PER_UID deposits or would hold more than
 * CHECKPOINT_DEPOSIT_MAX_FDS_PER_UID descriptors; -ENOSPC: the table is full (deposits
 * or descriptors); -EINVAL: n is 0 or over CHECKPOINT_DEPOSIT_MAX_FILES.
 */
int checkpoint_deposits_add(CheckpointDeposits *t, uid_t uid, CheckpointFiles *files,
                            ShardToken *ret_token);

/* Duplicates of the files of token, for uid only (another uid's is -ENOENT, as an unknown or
 * dropped one), and the deposit's idle time starts again. -EMFILE and friends from dup. */
int checkpoint_deposits_open(CheckpointDeposits *t, const char *token, uid_t uid,
                             CheckpointFiles *ret);

/* Drops the deposits idle for CHECKPOINT_DEPOSIT_IDLE_MS (or the ms set for tests) now. */
void checkpoint_deposits_sweep(CheckpointDeposits *t);
/* Tests: another idle time (0: the default). */
void checkpoint_deposits_set_idle_ms(CheckpointDeposits *t, uint64_t ms);

typedef struct CheckpointDepositCounters {
        size_t deposits; /* held now */
        size_t fds;      /* their descriptors */
        uint64_t deposits_total; /* made since start */
        uint64_t refused_total;  /* refused for a limit */
} CheckpointDepositCounters;

void checkpoint_deposits_counters(CheckpointDeposits *t, CheckpointDepositCounters *ret);

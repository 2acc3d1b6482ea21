/* socket-cred.h: the process at the other end of a Unix socket (SO_PEERCRED): whether it is an admin (root, or in --admin-group), its pid and start time. */
#pragma once

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/*
 * cred: SO_PEERCRED of fd. admin_gid: --admin-group's gid, or (gid_t) -1 for none (only root
 * is an admin then). SO_PEERCRED carries only the primary group, so the supplementary groups
 * are read too (SO_PEERGROUPS); a list that cannot be read counts as no membership.
 */
bool socket_cred_is_admin(int fd, const struct ucred *cred, gid_t admin_gid);

/* Field 22 of /proc/PID/stat: the process's start time in clock ticks since boot. */
int socket_cred_start_time(pid_t pid, uint64_t *ret);

/*
 * The start time of the process behind fd (cred its SO_PEERCRED): a pidfd of it first
 * (SO_PEERPIDFD, else pidfd_open() on cred->pid), then its start time, then the pidfd's process
 * checked still there, so the start time is that process's and not a successor's of its pid
 * (as build_caller_identify() names a caller). -ESRCH when the process cannot be named (pid 0:
 * another pid namespace; gone already).
 */
int socket_cred_process(int fd, const struct ucred *cred, uint64_t *ret_start_time);

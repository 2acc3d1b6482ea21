/* peer-cred.h: whether a Unix socket's peer is an admin: root, or in --admin-group. */
#pragma once

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/types.h>

/*
 * cred: SO_PEERCRED of fd. admin_gid: --admin-group's gid, or (gid_t) -1 for none (only root
 * is an admin then). SO_PEERCRED carries only the primary group, so the supplementary groups
 * are read too (SO_PEERGROUPS); a list that cannot be read counts as no membership.
 */
bool peer_cred_is_admin(int fd, const struct ucred *cred, gid_t admin_gid);

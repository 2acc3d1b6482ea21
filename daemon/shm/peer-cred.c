/* peer-cred.c: whether a Unix socket's peer is an admin (API socket and shard socket alike). */

#include <stdlib.h>

#include "common/macro.h"
#include "peer-cred.h"

#ifndef SO_PEERGROUPS
#define SO_PEERGROUPS 59 /* Linux 4.13 */
#endif

/* Groups read per peer: more than NGROUPS_MAX of any sane system. */
#define PEER_CRED_MAX_GROUPS 65536u

/* Whether the peer of fd has gid among its supplementary groups. */
static bool peer_in_group(int fd, gid_t gid) {
        _cleanup_free_ gid_t *groups = NULL;
        socklen_t len = 64 * sizeof(gid_t);

        for (;;) {
                free(groups);
                groups = malloc(len);
                if (!groups)
                        return false;
                if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
                        break;
                /* ERANGE: len now says how much room the list needs. */
                if (errno != ERANGE || len > PEER_CRED_MAX_GROUPS * sizeof(gid_t))
                        return false;
        }
        for (size_t i = 0; i < len / sizeof(gid_t); i++)
                if (groups[i] == gid)
                        return true;
        return false;
}

bool peer_cred_is_admin(int fd, const struct ucred *cred, gid_t admin_gid) {
        if (cred->uid == 0)
                return true;
        if (admin_gid == (gid_t) -1)
                return false;
        return cred->gid == admin_gid || peer_in_group(fd, admin_gid);
}

/* peer-message.c: a decoded membership message's memory: its updates copied in one block, and freed. */

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "peer-message.h"

void peer_message_done(PeerMessage *m) {
        if (!m)
                return;
        member_info_done(&m->sender);
        for (size_t i = 0; i < m->n_members; i++)
                member_info_done(&m->members[i].info);
        free(m->members);
        free(m->probe.name);
        free(m->updates); /* names included: peer_updates_copy() */
        free(m->forget_name);
        free(m->reason);
        free(m->want_verdicts);
        *m = (PeerMessage) {};
}

int peer_updates_copy(const PeerUpdate *from, size_t n, PeerUpdate **ret) {
        size_t bytes = n * sizeof(PeerUpdate);
        PeerUpdate *list;
        char *names;

        *ret = NULL;
        if (n == 0)
                return 0;
        if (n > SIZE_MAX / sizeof(PeerUpdate))
                return -ENOMEM;
        for (size_t i = 0; i < n; i++) {
                size_t len = strlen(from[i].name) + 1;
                if (len > SIZE_MAX - bytes)
                        return -ENOMEM;
                bytes += len;
        }
        list = malloc(bytes);
        if (!list)
                return -ENOMEM;
        names = (char *) (list + n);
        for (size_t i = 0; i < n; i++) {
                size_t len = strlen(from[i].name) + 1;
                list[i] = from[i];
                list[i].name = memcpy(names, from[i].name, len);
                names += len;
        }
        *ret = list;
        return 0;
}

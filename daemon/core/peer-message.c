/* peer-message.c: freeing a decoded membership message. */

#include <stdlib.h>

#include "peer-message.h"

void peer_message_done(PeerMessage *m) {
        if (!m)
                return;
        member_info_done(&m->sender);
        for (size_t i = 0; i < m->n_members; i++)
                member_info_done(&m->members[i].info);
        free(m->members);
        free(m->probe.name);
        for (size_t i = 0; i < m->n_updates; i++)
                free(m->updates[i].name);
        free(m->updates);
        free(m->forget_name);
        free(m->reason);
        free(m->want_verdicts);
        *m = (PeerMessage) {};
}

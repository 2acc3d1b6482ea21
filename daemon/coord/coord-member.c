/* coord-member.c: member records read from etcd events, refused with one log line when bad. */
#include <string.h>

#include "coord-member.h"
#include "common/log.h"

int coord_member_from_event(const CoordEvent *e, const char *members_prefix, CoordMember *ret) {
        size_t n = strlen(members_prefix);
        const char *name;
        int r;

        if (e->type != COORD_EVENT_PUT || !e->key)
                return -EINVAL;
        if (strncmp(e->key, members_prefix, n) != 0)
                return log_warning_errno(-EBADMSG,
                                         "Refusing the etcd record %s: not under %s, ignoring",
                                         e->key, members_prefix);
        name = e->key + n;
        if (name[0] == '\0' || strchr(name, '/'))
                return log_warning_errno(-EBADMSG,
                                         "Refusing the etcd record %s: not a member name, ignoring",
                                         e->key);
        r = codec_coord_member_decode(e->value, e->value_size, name, ret);
        if (r == -EBADMSG)
                return log_warning_errno(r, "Refusing the member record %s (%zu bytes): not a valid "
                                         "familyd member of that name, ignoring",
                                         e->key, e->value_size);
        return r;
}

/* coord-member.h: member records read from etcd events, refused with one log line when bad. */
#pragma once

#include "codec/codec-coord-member.h"
#include "coord-client.h"

/*
 * The member a PUT under members_prefix ("<cluster prefix>members/") carries. A key outside
 * the prefix, a name part that is empty or holds '/', or a value that does not decode
 * (codec_coord_member_decode(), the name must equal the key's last part) is refused with one
 * warning naming the key: -EBADMSG.
 */
int coord_member_from_event(const CoordEvent *e, const char *members_prefix, CoordMember *ret);

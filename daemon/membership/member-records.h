/* member-records.h: member records shared between membership tables: one immutable copy of each distinct record, counted by reference. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "membership.h"

/*
 * DESIGN: a MemberRecords table (membership.h: member_records_new()) holds each distinct record
 * once, found by a hash of everything it holds; a member's `info` points at its record's, so the
 * record is immutable and a change is a new record. Without a table (NULL) each take makes a
 * record of the caller's own. This file is the pool; membership.c decides which record each
 * member holds.
 */

struct MemberRecord {
        MemberInfo info; /* first: a Member's info points here */
        uint64_t hash;
        uint64_t start_digest; /* membership_digest_member() of its name and boot id */
        size_t n_ref;
        size_t bytes;
        MemberRecords *owner; /* NULL: a member's own, in no table */
        MemberRecord *next;   /* in its bucket */
};

/* A record equal to `info` (not partial, not proven): the one r holds, made there when there is
 * none, or with r NULL a new one of the caller's own; one reference more. */
int member_records_take(MemberRecords *r, const MemberInfo *info, MemberRecord **ret);
/* One reference less; the last frees it (and takes it out of its table). */
void member_records_release(MemberRecord *rec);

/* test-membership.c: joins, restarts, refusals, timeouts, forgetting and version agreement. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "membership/membership.h"
#include "core/resource-limits.h"

static const MembershipTimeouts timeouts = {
        .suspect_ms = 300,
        .down_ms = 1000,
        .forget_after_ms = 0,
};

static Device host_devices[2] = {
        { .local_index = 0, .kind = "host", .name = "host0", .uuid = "", .pci_bus_id = "",
          .numa_node = -1 },
        { .local_index = 1, .kind = "host", .name = "host1", .uuid = "", .pci_bus_id = "",
          .numa_node = -1 },
};

static MemberInfo info(const char *name, int64_t rank, const char *address, uint64_t boot,
                       int64_t started) {
        return (MemberInfo) {
                .name = (char *) name,
                .node_rank = rank,
                .address = (char *) address,
                .boot_id = boot,
                .started_unix_ms = started,
                .devices = host_devices,
                .n_devices = 2,
        };
}

static Membership *new_self(const char *name, int64_t rank) {
        MemberInfo self = info(name, rank, "127.0.0.1:7000", 1, 100);
        Membership *m = NULL;

        assert_int_equal(membership_new(&self, &timeouts, 0, &m), 0);
        return m;
}

static MemberVerdict heard(Membership *m, MemberInfo i, uint64_t version, int64_t now) {
        MemberVerdict v = _MEMBER_VERDICT_INVALID;
        _cleanup_free_ char *why = NULL;

        assert_int_equal(membership_heard(m, &i, version, now, &v, &why), 0);
        assert_true((v == MEMBER_REFUSED) == (why != NULL));
        return v;
}

static void test_join_and_order(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-b", -1);
        _cleanup_(topology_unrefp) Topology *t = NULL;

        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 10),
                         MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-a", -1, "127.0.0.1:7001", 8, 100), 1, 10),
                         MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-z", 0, "127.0.0.1:7003", 9, 100), 1, 10),
                         MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-a", -1, "127.0.0.1:7001", 8, 100), 1, 20),
                         MEMBER_KNOWN);

        assert_int_equal(membership_topology(m, 20, 5000, &t), 0);
        assert_int_equal(t->n_nodes, 4);
        assert_int_equal(t->world_size, 8);
        /* Configured node ranks first, then names. */
        assert_string_equal(t->nodes[0].name, "node-z");
        assert_string_equal(t->nodes[1].name, "node-a");
        assert_string_equal(t->nodes[2].name, "node-b");
        assert_string_equal(t->nodes[3].name, "node-c");
        assert_int_equal(t->nodes[2].first_rank, 4);
        assert_true(t->nodes[2].local);
        assert_int_equal(t->local, 2);
        assert_int_equal(t->version, membership_version(m));
}

static void test_version_agreement(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);

        assert_int_equal(membership_version(m), 1);
        /* A quiet peer's higher version is taken as is; a change goes one past the maximum. */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 41, 0), MEMBER_JOINED);
        assert_int_equal(membership_version(m), 42);
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 50, 10), MEMBER_KNOWN);
        assert_int_equal(membership_version(m), 50);
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 3, 20), MEMBER_KNOWN);
        assert_int_equal(membership_version(m), 50);
}

static void test_timeouts_and_return(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        unsigned counts[_NODE_STATE_MAX];

        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        uint64_t v = membership_version(m);
        assert_false(membership_tick(m, 299));
        assert_true(membership_tick(m, 300));
        assert_int_equal(membership_find(m, "node-b")->state, NODE_SUSPECT);
        assert_int_equal(membership_version(m), v + 1);
        assert_false(membership_tick(m, 500));
        assert_true(membership_tick(m, 1000));
        assert_int_equal(membership_find(m, "node-b")->state, NODE_DOWN);
        membership_count_states(m, counts);
        assert_int_equal(counts[NODE_DOWN], 1);
        assert_int_equal(counts[NODE_UP], 0);

        /* Heard again with the same start: up at once. */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 5000), MEMBER_KNOWN);
        assert_int_equal(membership_find(m, "node-b")->state, NODE_UP);
        assert_int_equal(membership_version(m), v + 3);
}

static void test_restart_replaces(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);

        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        membership_tick(m, 2000); /* down */
        MemberInfo again = info("node-b", -1, "h:2", 3, 2000);
        again.n_devices = 1;
        assert_int_equal(heard(m, again, 1, 2000), MEMBER_RESTARTED);
        const Member *e = membership_find(m, "node-b");
        assert_int_equal(e->state, NODE_UP);
        assert_int_equal(e->info->boot_id, 3);
        assert_int_equal(e->info->n_devices, 1);
        /* The old start speaking from the same address is stale. */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 2001), MEMBER_STALE);
        /* A new start on the same address while the one we know still looks up waits until
         * that one falls silent (a forged restart of a live node never takes). */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 4, 3000), 1, 2002),
                         MEMBER_DEFERRED);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 3);
        membership_tick(m, 2300); /* suspect */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 4, 3000), 1, 2301),
                         MEMBER_RESTARTED);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 4);
}

static void test_duplicates_refused(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", 0);
        MemberVerdict v;
        _cleanup_free_ char *why = NULL, *why2 = NULL, *why3 = NULL;

        assert_int_equal(heard(m, info("node-b", 1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);

        /* Same name, another address, while the first is up. */
        MemberInfo dup = info("node-b", 5, "h:9", 9, 200);
        assert_int_equal(membership_heard(m, &dup, 1, 10, &v, &why), 0);
        assert_int_equal(v, MEMBER_REFUSED);
        assert_non_null(strstr(why, "node name 'node-b' is already in use by the live node at h:2"));

        /* A node rank that another node holds. */
        MemberInfo rank = info("node-c", 1, "h:3", 3, 200);
        assert_int_equal(membership_heard(m, &rank, 1, 10, &v, &why2), 0);
        assert_int_equal(v, MEMBER_REFUSED);
        assert_non_null(strstr(why2, "node rank 1 is already taken by node 'node-b'"));

        /* Our own name from another process. */
        MemberInfo self = info("node-a", 7, "h:4", 4, 200);
        assert_int_equal(membership_heard(m, &self, 1, 10, &v, &why3), 0);
        assert_int_equal(v, MEMBER_REFUSED);
        assert_non_null(why3);
        assert_null(membership_find(m, "node-c"));
        assert_int_equal(membership_count(m), 2);
}

/* Who holds a rank stays right as members shift down (a forget), restart with another rank,
 * and hold ranks past --max-nodes (looked up by a scan rather than the index). */
static char *rank_refusal(Membership *m, const char *name, int64_t rank, int64_t now) {
        MemberInfo i = info(name, rank, "h:99", 99, 200);
        MemberVerdict v;
        char *why = NULL;

        assert_int_equal(membership_heard(m, &i, 1, now, &v, &why), 0);
        return v == MEMBER_REFUSED ? why : NULL;
}

static void test_rank_holders(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", 0);
        _cleanup_free_ char *why = NULL, *why2 = NULL, *why3 = NULL, *why4 = NULL;

        membership_set_max_nodes(m, 8);
        assert_int_equal(heard(m, info("node-b", 1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-c", 2, "h:3", 3, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-d", 3, "h:4", 4, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-e", 20, "h:5", 5, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-h", 6, "h:8", 10, 100), 1, 0), MEMBER_JOINED);
        why = rank_refusal(m, "node-x", 20, 10);
        assert_non_null(why);
        assert_non_null(strstr(why, "node rank 20 is already taken by node 'node-e'"));

        /* node-b forgotten: node-c, node-d, node-e and node-h move down a place. */
        membership_tick(m, 2000);
        assert_int_equal(membership_forget(m, "node-b", 0, false, 2000, NULL), 1);
        why2 = rank_refusal(m, "node-x", 3, 2001);
        assert_non_null(why2);
        assert_non_null(strstr(why2, "node rank 3 is already taken by node 'node-d'"));
        assert_int_equal(heard(m, info("node-f", 1, "h:6", 6, 2000), 1, 2001), MEMBER_JOINED);

        /* node-d restarts with rank 5: 3 is free, 5 is its. */
        assert_int_equal(heard(m, info("node-d", 5, "h:4", 7, 2500), 1, 2501), MEMBER_RESTARTED);
        why3 = rank_refusal(m, "node-x", 5, 2502);
        assert_non_null(why3);
        assert_non_null(strstr(why3, "node rank 5 is already taken by node 'node-d'"));
        assert_int_equal(heard(m, info("node-g", 3, "h:7", 8, 2500), 1, 2503), MEMBER_JOINED);
        why4 = rank_refusal(m, "node-x", 0, 2504);
        assert_non_null(why4);
        assert_non_null(strstr(why4, "node rank 0 is already taken by node 'node-a'"));
        assert_int_equal(membership_count(m), 7);
}

static void test_learn(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        MemberVerdict v;

        /* A node the teller last heard long ago arrives down, keeping its ranks. */
        MemberInfo old = info("node-d", -1, "h:4", 4, 100);
        assert_int_equal(membership_learn(m, &old, 5000, 10000, &v), 0);
        assert_int_equal(v, MEMBER_JOINED);
        assert_int_equal(membership_find(m, "node-d")->state, NODE_DOWN);

        MemberInfo fresh = info("node-e", -1, "h:5", 5, 100);
        assert_int_equal(membership_learn(m, &fresh, 0, 10000, &v), 0);
        assert_int_equal(membership_find(m, "node-e")->state, NODE_UP);
        /* Ourselves: ignored. */
        MemberInfo me = info("node-a", -1, "x:1", 77, 999);
        assert_int_equal(membership_learn(m, &me, 0, 10000, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
        /* An older start than the one we know: ignored. */
        MemberInfo older = info("node-e", -1, "h:5", 6, 50);
        assert_int_equal(membership_learn(m, &older, 0, 10000, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
}

static void test_forget(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        _cleanup_(family_error_done) FamilyError e = FAMILY_ERROR_NULL;
        _cleanup_(family_error_done) FamilyError e2 = FAMILY_ERROR_NULL;
        _cleanup_(family_error_done) FamilyError e3 = FAMILY_ERROR_NULL;
        MemberVerdict v;

        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(membership_forget(m, "node-b", 0, false, 10, &e), -EINVAL);
        assert_string_equal(e.message, "node 'node-b' is up; only a down node can be forgotten");
        assert_int_equal(membership_forget(m, "node-a", 0, false, 10, &e2), -EINVAL);
        assert_string_equal(e2.message, "node 'node-a' is this daemon's own node");
        assert_int_equal(membership_forget(m, "nope", 0, false, 10, &e3), -EINVAL);
        assert_int_equal(e3.status, FAMILY_STATUS_NOT_FOUND);
        /* A peer's request for an up node is ignored, not an error. */
        assert_int_equal(membership_forget(m, "node-b", 2, true, 10, NULL), 0);

        membership_tick(m, 1000);
        uint64_t v0 = membership_version(m);
        assert_int_equal(membership_forget(m, "node-b", 0, false, 1000, NULL), 1);
        assert_null(membership_find(m, "node-b"));
        assert_int_equal(membership_version(m), v0 + 1);

        /* A peer's stale table does not bring it back ... */
        MemberInfo b = info("node-b", -1, "h:2", 2, 100);
        assert_int_equal(membership_learn(m, &b, 0, 1001, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
        /* ... but the node itself, alive after all, does. */
        assert_int_equal(heard(m, b, 1, 1002), MEMBER_JOINED);
}

static void test_forget_after(void **state) {
        MembershipTimeouts t = timeouts;
        MemberInfo self = info("node-a", -1, "h:1", 1, 100);
        _cleanup_(membership_freep) Membership *m = NULL;

        t.forget_after_ms = 500;
        assert_int_equal(membership_new(&self, &t, 0, &m), 0);
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        membership_tick(m, 1000);
        assert_non_null(membership_find(m, "node-b"));
        assert_true(membership_tick(m, 1500));
        assert_null(membership_find(m, "node-b"));
}

static void test_partial_records(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        MemberInfo slim = info("node-b", -1, "h:2", 2, 100);
        MemberVerdict v;

        slim.partial = true;
        slim.n_devices = 0;
        /* A heartbeat of a start we do not know: we must ask for the whole record. */
        assert_int_equal(heard(m, slim, 1, 0), MEMBER_UNKNOWN);
        assert_null(membership_find(m, "node-b"));
        assert_int_equal(membership_learn(m, &slim, 0, 0, &v), 0);
        assert_int_equal(v, MEMBER_STALE);

        uint64_t changes = membership_changes(m);
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(membership_changes(m), changes + 1);
        /* A heartbeat of another start of the live node-b at another address, before its
         * hello's refusal reached it: refused too, not asked who (the who would name us). */
        MemberInfo dup = info("node-b", -1, "h:9", 9, 200);
        dup.partial = true;
        dup.n_devices = 0;
        assert_int_equal(heard(m, dup, 1, 0), MEMBER_REFUSED);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 2);
        /* Once known, the slim heartbeat keeps it alive and keeps its devices. */
        membership_tick(m, 500);
        assert_int_equal(membership_find(m, "node-b")->state, NODE_SUSPECT);
        assert_int_equal(heard(m, slim, 1, 600), MEMBER_KNOWN);
        assert_int_equal(membership_find(m, "node-b")->state, NODE_UP);
        assert_int_equal(membership_find(m, "node-b")->info->n_devices, 2);
        /* A higher version taken from a peer is not a change of ours. */
        changes = membership_changes(m);
        assert_int_equal(heard(m, slim, 99, 700), MEMBER_KNOWN);
        assert_int_equal(membership_version(m), 99);
        assert_int_equal(membership_changes(m), changes);
}

static void test_version_never_wraps(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);

        /* A hostile peer's version beyond the limit is not taken (found by fuzz-peer). */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), UINT64_MAX, 0),
                         MEMBER_JOINED);
        assert_true(membership_version(m) < 10);
        /* Nor one at the limit, even from the only other member (an attack: 2^53 froze the
         * topology of every daemon). */
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), FAMILYD_MAX_TOPOLOGY_VERSION,
                               1),
                         MEMBER_KNOWN);
        assert_true(membership_version(m) < 10);
        membership_tick(m, 2000);
        assert_true(membership_version(m) < 10);
}

static MemberVerdict heard_v(Membership *m, MemberInfo i, uint64_t version, size_t n_listed,
                             int64_t now, bool *ret_refused) {
        MemberVerdict v = _MEMBER_VERDICT_INVALID;
        _cleanup_free_ char *why = NULL;

        assert_int_equal(membership_heard_from(m, &i, version, n_listed, now, &v, ret_refused,
                                               &why),
                         0);
        return v;
}

/* Versions come only from members: a refused, unknown or stale sender moves nothing. */
static void test_version_from_non_member_ignored(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", 0);
        MemberInfo slim = info("node-x", -1, "h:9", 9, 100);
        bool refused = true;

        assert_int_equal(heard(m, info("node-b", 1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        uint64_t v = membership_version(m);
        /* A rank squatter, refused. */
        assert_int_equal(heard_v(m, info("node-c", 1, "h:3", 3, 100), v + 5, 0, 1, &refused),
                         MEMBER_REFUSED);
        assert_false(refused);
        /* A heartbeat of a start nobody knows, with 2^53 (an attack docs/security.md lists). */
        slim.partial = true;
        slim.n_devices = 0;
        assert_int_equal(heard(m, slim, FAMILYD_MAX_TOPOLOGY_VERSION, 2), MEMBER_UNKNOWN);
        /* An older start of a known node. */
        assert_int_equal(heard(m, info("node-b", 1, "h:2", 7, 50), v + 5, 3), MEMBER_STALE);
        assert_int_equal(membership_version(m), v);
        /* The member itself may move it. */
        assert_int_equal(heard(m, info("node-b", 1, "h:2", 2, 100), v + 5, 4), MEMBER_KNOWN);
        assert_int_equal(membership_version(m), v + 5);
}

/* A jump past what the member table explains is refused unless most members back it. */
static void test_version_jump_refused(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        bool refused = false;

        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        assert_int_equal(heard(m, info("node-c", -1, "h:3", 3, 100), 1, 0), MEMBER_JOINED);
        uint64_t v = membership_version(m);
        /* Within 8 per member (3 here, +1): taken. */
        assert_true(membership_version_plausible(m, v + 32, 0));
        assert_false(membership_version_plausible(m, v + 33, 0));
        /* A hello's list explains more. */
        assert_true(membership_version_plausible(m, v + 40, 1));
        assert_int_equal(heard_v(m, info("node-b", -1, "h:2", 2, 100), v + 32, 0, 1, &refused),
                         MEMBER_KNOWN);
        assert_false(refused);
        v += 32;
        assert_int_equal(membership_version(m), v);

        /* One member alone far ahead: refused (and said so). */
        assert_int_equal(heard_v(m, info("node-b", -1, "h:2", 2, 100), v + 1000, 0, 2, &refused),
                         MEMBER_KNOWN);
        assert_true(refused);
        assert_int_equal(membership_version(m), v);
        /* Both others there (a partition healed): taken, as far as they agree. */
        assert_int_equal(heard_v(m, info("node-c", -1, "h:3", 3, 100), v + 900, 0, 3, &refused),
                         MEMBER_KNOWN);
        assert_false(refused);
        assert_int_equal(membership_version(m), v + 900);
        /* Never near the limit, however many say so. */
        assert_int_equal(heard_v(m, info("node-b", -1, "h:2", 2, 100),
                                 FAMILYD_MAX_TOPOLOGY_VERSION, 0, 4, &refused),
                         MEMBER_KNOWN);
        assert_int_equal(heard_v(m, info("node-c", -1, "h:3", 3, 100),
                                 FAMILYD_MAX_TOPOLOGY_VERSION, 0, 5, &refused),
                         MEMBER_KNOWN);
        assert_true(refused);
        assert_int_equal(membership_version(m), v + 900);

        /* A daemon that knows only its seed takes the cluster's version. */
        _cleanup_(membership_freep) Membership *fresh = new_self("node-d", -1);
        assert_int_equal(heard_v(fresh, info("node-a", -1, "h:1", 1, 100), v + 900, 2, 0,
                                 &refused),
                         MEMBER_JOINED);
        assert_false(refused);
        assert_int_equal(membership_version(fresh), v + 901);
}

/* A restart is the node's own word: never another member's, never while the known start lives. */
static void test_restart_only_from_the_node(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        MemberVerdict v;

        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        uint64_t version = membership_version(m);
        /* Another member's report of a later start with 256 devices (an attack docs/security.md lists). */
        MemberInfo forged = info("node-b", -1, "h:2", 66, 5000);
        assert_int_equal(membership_learn(m, &forged, 0, 10, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
        /* The forged start speaking for itself while the real one is heard. */
        assert_int_equal(heard(m, forged, 1, 20), MEMBER_DEFERRED);
        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 250), MEMBER_KNOWN);
        membership_tick(m, 400);
        assert_int_equal(heard(m, forged, 1, 400), MEMBER_DEFERRED);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 2);
        assert_int_equal(membership_find(m, "node-b")->state, NODE_UP);
        assert_int_equal(membership_version(m), version);
        /* Even down, a report does not replace it; the node itself does. */
        membership_tick(m, 2000);
        assert_int_equal(membership_learn(m, &forged, 0, 2000, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
        assert_int_equal(heard(m, forged, 1, 2001), MEMBER_RESTARTED);
}

/* A relayed record proven by its node's own MAC (the caller verified it) is the node's word: it
 * replaces a start that is no longer up here, waits while that start is up, and never replaces
 * a newer start; an unproven one never replaces any. */
static void test_restart_from_proven_record(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        MemberVerdict v;

        assert_int_equal(heard(m, info("node-b", -1, "h:2", 2, 100), 1, 0), MEMBER_JOINED);
        MemberInfo restarted = info("node-b", -1, "h:2", 3, 5000);
        restarted.proven = true;
        /* b is up here: the proven restart waits. */
        assert_int_equal(membership_learn(m, &restarted, 0, 100, &v), 0);
        assert_int_equal(v, MEMBER_DEFERRED);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 2);
        membership_tick(m, 2000); /* b down */
        uint64_t version = membership_version(m);
        restarted.proven = false;
        assert_int_equal(membership_learn(m, &restarted, 0, 2000, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
        restarted.proven = true;
        assert_int_equal(membership_learn(m, &restarted, 0, 2000, &v), 0);
        assert_int_equal(v, MEMBER_RESTARTED);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 3);
        assert_int_equal(membership_find(m, "node-b")->state, NODE_UP);
        assert_true(membership_version(m) > version);
        /* An older start, proven or not, does not come back. */
        MemberInfo older = info("node-b", -1, "h:2", 2, 100);
        older.proven = true;
        membership_tick(m, 4000);
        assert_int_equal(membership_learn(m, &older, 0, 4000, &v), 0);
        assert_int_equal(v, MEMBER_STALE);
        assert_int_equal(membership_find(m, "node-b")->info->boot_id, 3);
}

/* --max-nodes: the table never grows past it, and a list that would take it there is refused
 * whole. */
static void test_max_nodes(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        _cleanup_free_ char *why = NULL;
        MemberInfo b = info("node-b", -1, "h:2", 2, 100), c = info("node-c", -1, "h:3", 3, 100),
                   d = info("node-d", -1, "h:4", 4, 100);
        const MemberInfo *list[] = { &b, &c, &d };
        MemberVerdict v;

        assert_int_equal(membership_max_nodes(m), FAMILYD_MAX_PEERS);
        membership_set_max_nodes(m, 0);
        assert_int_equal(membership_max_nodes(m), FAMILYD_MAX_PEERS);
        membership_set_max_nodes(m, 1u << 30);
        assert_int_equal(membership_max_nodes(m), MEMBERSHIP_MAX_NODES_CEILING);
        membership_set_max_nodes(m, 10000); /* above the default: configurable */
        assert_int_equal(membership_max_nodes(m), 10000);
        membership_set_max_nodes(m, 3);
        assert_true(membership_can_take(m, list, 2));
        assert_false(membership_can_take(m, list, 3));

        assert_int_equal(heard(m, b, 1, 0), MEMBER_JOINED);
        /* Known members cost nothing. */
        assert_true(membership_can_take(m, list, 2));
        assert_false(membership_can_take(m, list, 3));
        assert_int_equal(membership_learn(m, &c, 0, 0, &v), 0);
        assert_int_equal(v, MEMBER_JOINED);
        assert_int_equal(membership_learn(m, &d, 0, 0, &v), 0);
        assert_int_equal(v, MEMBER_REFUSED);
        assert_int_equal(membership_heard(m, &d, 1, 0, &v, &why), 0);
        assert_int_equal(v, MEMBER_REFUSED);
        assert_string_equal(why, "the cluster already has 3 members, the limit (--max-nodes)");
        assert_int_equal(membership_count(m), 3);
}

#define DIGEST_A "aaaa456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define DIGEST_B "bbbb456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static const char *digest_in(const Membership *m, const char *name) {
        return membership_find(m, name)->info->registry_digest;
}

/* A member's digest comes with its records, follows its heartbeats, reaches the topology and
 * moves the revision, not the version. */
static void test_registry_digests(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        _cleanup_(topology_unrefp) Topology *t = NULL, *t2 = NULL;
        MemberInfo b = info("node-b", -1, "h:2", 2, 100);
        MemberVerdict v;

        memcpy(b.registry_digest, DIGEST_A, sizeof b.registry_digest);
        assert_int_equal(heard(m, b, 1, 0), MEMBER_JOINED);
        assert_string_equal(digest_in(m, "node-b"), DIGEST_A);
        assert_string_equal(digest_in(m, "node-a"), "");

        /* This node's own, after a reload. */
        uint64_t version = membership_version(m), revision = membership_revision(m);
        assert_true(membership_set_local_digest(m, DIGEST_B));
        assert_false(membership_set_local_digest(m, DIGEST_B));
        assert_int_equal(membership_revision(m), revision + 1);
        assert_int_equal(membership_version(m), version);

        assert_int_equal(membership_topology(m, 0, 5000, &t), 0);
        assert_string_equal(t->nodes[0].name, "node-a");
        assert_string_equal(t->nodes[0].registry_digest, DIGEST_B);
        assert_string_equal(t->nodes[1].registry_digest, DIGEST_A);

        /* A heartbeat (a partial record) with the peer's new digest. */
        MemberInfo slim = b;
        slim.partial = true;
        slim.n_devices = 0;
        memcpy(slim.registry_digest, DIGEST_B, sizeof slim.registry_digest);
        revision = membership_revision(m);
        assert_int_equal(heard(m, slim, version, 10), MEMBER_KNOWN);
        assert_string_equal(digest_in(m, "node-b"), DIGEST_B);
        assert_int_equal(membership_revision(m), revision + 1);
        assert_int_equal(membership_version(m), version);
        assert_int_equal(membership_topology(m, 10, 5010, &t2), 0);
        assert_string_equal(t2->nodes[1].registry_digest, DIGEST_B);
        /* The same again changes nothing. */
        assert_int_equal(heard(m, slim, version, 20), MEMBER_KNOWN);
        assert_int_equal(membership_revision(m), revision + 1);

        /* Another member's report: only news fresher than our own hearing counts, and an
         * empty digest never erases one. */
        MemberInfo told = b;
        memcpy(told.registry_digest, DIGEST_A, sizeof told.registry_digest);
        assert_int_equal(membership_learn(m, &told, 50, 40, &v), 0); /* heard at -10 */
        assert_int_equal(v, MEMBER_KNOWN);
        assert_string_equal(digest_in(m, "node-b"), DIGEST_B);
        told.registry_digest[0] = 0;
        assert_int_equal(membership_learn(m, &told, 0, 100, &v), 0);
        assert_string_equal(digest_in(m, "node-b"), DIGEST_B);
        memcpy(told.registry_digest, DIGEST_A, sizeof told.registry_digest);
        assert_int_equal(membership_learn(m, &told, 0, 200, &v), 0);
        assert_string_equal(digest_in(m, "node-b"), DIGEST_A);

        /* A node learnt of through another brings its digest along. */
        MemberInfo c = info("node-c", -1, "h:3", 3, 100);
        memcpy(c.registry_digest, DIGEST_B, sizeof c.registry_digest);
        assert_int_equal(membership_learn(m, &c, 0, 300, &v), 0);
        assert_int_equal(v, MEMBER_JOINED);
        assert_string_equal(digest_in(m, "node-c"), DIGEST_B);
}

/* The digest sums the members' (name, start): order does not matter, a restart and a removal
 * change it, a state does not. */
/* Tables sharing records (the simulator's N nodes) keep one copy of each distinct record (its
 * registry digest included); a new digest, a restart, a forget and the tables' end release
 * them. */
static void test_shared_records(void **state) {
        MemberRecords *records = NULL;
        Membership *m1 = new_self("node-a", -1), *m2 = new_self("node-z", -1);
        MemberInfo b = info("node-b", -1, "h:2", 2, 100), c = info("node-c", -1, "h:3", 3, 100);
        MemberVerdict v;

        assert_int_equal(member_records_new(&records), 0);
        membership_set_records(m1, records);
        membership_set_records(m2, records);
        memcpy(b.registry_digest, DIGEST_A, sizeof b.registry_digest);
        assert_int_equal(heard(m1, b, 1, 0), MEMBER_JOINED);
        assert_int_equal(membership_learn(m2, &b, 0, 0, &v), 0);
        assert_int_equal(v, MEMBER_JOINED);
        assert_int_equal(heard(m2, c, 1, 0), MEMBER_JOINED);
        assert_int_equal(member_records_count(records), 2);
        assert_true(member_records_bytes(records) > 2 * sizeof(Device) * 2);
        /* The same record in both tables. */
        assert_ptr_equal(membership_find(m1, "node-b")->info,
                         membership_find(m2, "node-b")->info);

        /* A new digest in one table is another record; the other table keeps its own. */
        memcpy(b.registry_digest, DIGEST_B, sizeof b.registry_digest);
        assert_int_equal(heard(m2, b, 1, 1), MEMBER_KNOWN);
        assert_int_equal(member_records_count(records), 3);
        assert_ptr_not_equal(membership_find(m1, "node-b")->info,
                             membership_find(m2, "node-b")->info);
        assert_string_equal(digest_in(m1, "node-b"), DIGEST_A);
        assert_string_equal(digest_in(m2, "node-b"), DIGEST_B);

        /* The same name and start from another address is another record. */
        MemberInfo b2 = info("node-b", -1, "h:9", 2, 100);
        Membership *m3 = new_self("node-y", -1);
        membership_set_records(m3, records);
        assert_int_equal(heard(m3, b2, 1, 0), MEMBER_JOINED);
        assert_int_equal(member_records_count(records), 4);
        assert_string_equal(membership_find(m3, "node-b")->info->address, "h:9");
        membership_free(m3);
        assert_int_equal(member_records_count(records), 3);

        /* A restart in one table takes a new record, and lets go of the old; the other table
         * keeps its own. */
        membership_tick(m1, 2000);
        assert_int_equal(heard(m1, info("node-b", -1, "h:2", 4, 2000), 1, 2000),
                         MEMBER_RESTARTED);
        assert_int_equal(member_records_count(records), 3);
        assert_int_equal(membership_find(m2, "node-b")->info->boot_id, 2);
        /* Forgotten: its reference goes, the tombstone keeps the name. */
        membership_tick(m2, 2000);
        assert_int_equal(membership_forget(m2, "node-c", 0, false, 2000, NULL), 1);
        assert_int_equal(member_records_count(records), 2);
        assert_int_equal(membership_learn(m2, &c, 0, 2001, &v), 0);
        assert_int_equal(v, MEMBER_STALE);

        membership_free(m1);
        membership_free(m2);
        assert_int_equal(member_records_count(records), 0);
        member_records_free(records);
}

static void test_table_digest(void **state) {
        _cleanup_(membership_freep) Membership *a = new_self("node-a", -1);
        _cleanup_(membership_freep) Membership *b = NULL;
        MemberInfo self_b = info("node-b", -1, "127.0.0.1:7001", 2, 100);
        MemberInfo self_a = info("node-a", -1, "127.0.0.1:7000", 1, 100);
        FamilyError error = {};
        uint64_t d;

        assert_int_equal(membership_new(&self_b, &timeouts, 0, &b), 0);
        assert_int_equal(membership_digest(a), membership_digest_member("node-a", 1));
        assert_int_equal(heard(a, self_b, 1, 10), MEMBER_JOINED);
        assert_int_equal(heard(a, info("node-c", -1, "127.0.0.1:7002", 3, 100), 1, 10),
                         MEMBER_JOINED);
        assert_int_equal(heard(b, info("node-c", -1, "127.0.0.1:7002", 3, 100), 1, 10),
                         MEMBER_JOINED);
        assert_int_equal(heard(b, self_a, 1, 10), MEMBER_JOINED);
        assert_int_equal(membership_digest(a), membership_digest(b));
        d = membership_digest(a);
        assert_true(membership_tick(a, 2000)); /* b and c down: states are not in it */
        assert_int_equal(membership_digest(a), d);
        /* c restarts: another start, another digest. */
        assert_int_equal(heard(a, info("node-c", -1, "127.0.0.1:7002", 4, 200), 1, 2000),
                         MEMBER_RESTARTED);
        assert_true(membership_digest(a) != d);
        assert_int_equal(membership_digest(a), d - membership_digest_member("node-c", 3) +
                                                       membership_digest_member("node-c", 4));
        assert_int_equal(membership_forget(a, "node-b", 0, false, 2000, &error), 1);
        assert_int_equal(membership_digest(a), membership_digest_member("node-a", 1) +
                                                       membership_digest_member("node-c", 4));
}

/* By verdict (swim): silence changes nothing; verdicts order by incarnation, then gravity; a
 * suspicion that lasts membership_suspicion_ms() is down; the member's own word does not lift a
 * suspicion unless its incarnation is higher (the caller's verdict). */
static void test_verdicts(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        const Member *c;

        membership_set_verdicts(m, 100);
        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 0),
                         MEMBER_JOINED);
        c = membership_find(m, "node-c");
        assert_false(membership_tick(m, 5000)); /* silent for 5 s: still up */
        assert_int_equal(c->state, NODE_UP);
        /* Another start, an unknown name, this node: ignored. */
        assert_int_equal(membership_verdict(m, "node-c", 8, 0, NODE_SUSPECT, 5000), 0);
        assert_int_equal(membership_verdict(m, "node-x", 7, 0, NODE_SUSPECT, 5000), 0);
        assert_int_equal(membership_verdict(m, "node-a", 1, 9, NODE_DOWN, 5000), 0);
        /* Up at the same incarnation does not beat up; suspect does. */
        assert_int_equal(membership_verdict(m, "node-c", 7, 0, NODE_UP, 5000), 0);
        uint64_t v = membership_version(m);
        assert_int_equal(membership_verdict(m, "node-c", 7, 0, NODE_SUSPECT, 5000), 1);
        assert_int_equal(c->state, NODE_SUSPECT);
        assert_true(membership_version(m) > v);
        /* Its own message at the same incarnation does not lift it. */
        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 5100),
                         MEMBER_KNOWN);
        assert_int_equal(c->state, NODE_SUSPECT);
        /* Up at a higher incarnation does (a refutation); suspect at a lower one then not. */
        assert_int_equal(membership_verdict(m, "node-c", 7, 1, NODE_UP, 5200), 1);
        assert_int_equal(c->state, NODE_UP);
        assert_int_equal(c->incarnation, 1);
        assert_int_equal(membership_verdict(m, "node-c", 7, 0, NODE_SUSPECT, 5200), 0);
        /* A higher incarnation in the same state: passed on, no change. */
        assert_int_equal(membership_verdict(m, "node-c", 7, 2, NODE_UP, 5200), 2);
        /* Suspect for membership_suspicion_ms() (700: down 1000 - suspect 300; log2(3) x 100
         * is less), then down. */
        assert_int_equal(membership_suspicion_ms(m), 700);
        assert_int_equal(membership_verdict(m, "node-c", 7, 2, NODE_SUSPECT, 6000), 1);
        assert_false(membership_tick(m, 6699));
        assert_int_equal(c->state, NODE_SUSPECT);
        assert_true(membership_tick(m, 6700));
        assert_int_equal(c->state, NODE_DOWN);
        /* Down beats suspect at the same incarnation; up at a higher one revives it. */
        assert_int_equal(membership_verdict(m, "node-c", 7, 2, NODE_SUSPECT, 6800), 0);
        assert_int_equal(membership_verdict(m, "node-c", 7, 3, NODE_UP, 6800), 1);
        assert_int_equal(c->state, NODE_UP);
        /* A verdict further ahead than a member can be is a lie: ignored, whatever its state. */
        assert_int_equal(membership_verdict(m, "node-c", 7, 3 + MEMBERSHIP_INCARNATION_SLACK + 1,
                                            NODE_DOWN, 6900),
                         0);
        assert_int_equal(membership_verdict(m, "node-c", 7, UINT64_C(1) << 52, NODE_UP, 6900), 0);
        assert_int_equal(c->incarnation, 3);
        assert_int_equal(membership_verdict(m, "node-c", 7, 3 + MEMBERSHIP_INCARNATION_SLACK,
                                            NODE_SUSPECT, 6900),
                         1);
}

/* The suspicion lasts at least ceil(log2(members + 1)) probe periods. */
static void test_suspicion_grows_with_log_n(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);
        char name[16], address[32];

        membership_set_verdicts(m, 1000);
        assert_int_equal(membership_suspicion_ms(m), 1000); /* 1 member: log2 2 = 1 period */
        for (unsigned i = 0; i < 20; i++) {
                MemberVerdict v;
                snprintf(name, sizeof name, "n%u", i);
                snprintf(address, sizeof address, "10.0.0.%u:7000", i);
                MemberInfo n = info(name, -1, address, 10 + i, 100);
                assert_int_equal(membership_learn(m, &n, 0, 0, &v), 0);
        }
        assert_int_equal(membership_suspicion_ms(m), 5000); /* 21 members: log2 32 = 5 */
}

/* A down member is forgotten forget_after_ms after it went down. */
static void test_verdicts_forget_after(void **state) {
        static const MembershipTimeouts t = { .suspect_ms = 300, .down_ms = 1000,
                                              .forget_after_ms = 2000 };
        MemberInfo self = info("node-a", -1, "127.0.0.1:7000", 1, 100);
        _cleanup_(membership_freep) Membership *m = NULL;

        assert_int_equal(membership_new(&self, &t, 0, &m), 0);
        membership_set_verdicts(m, 100);
        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 0),
                         MEMBER_JOINED);
        assert_int_equal(membership_verdict(m, "node-c", 7, 0, NODE_DOWN, 1000), 1);
        assert_false(membership_tick(m, 2999));
        assert_non_null(membership_find(m, "node-c"));
        assert_true(membership_tick(m, 3000));
        assert_null(membership_find(m, "node-c"));
}

/* The verdict digest equals its sum recomputed from the table, and so do its buckets. */
static void assert_verdicts_in_step(const Membership *m, uint64_t local_incarnation) {
        uint64_t sum = 0, buckets[4], bucket_sum = 0;

        for (size_t i = 0; i < membership_count(m); i++) {
                const Member *e = membership_get(m, i);
                sum += membership_verdict_member(e->info->name, e->info->boot_id,
                                                 e->local ? local_incarnation : e->incarnation,
                                                 e->local ? NODE_UP : e->state);
        }
        assert_int_equal(membership_verdict_digest(m), sum);
        membership_verdict_buckets(m, 4, buckets);
        for (size_t b = 0; b < 4; b++)
                bucket_sum += buckets[b];
        assert_int_equal(bucket_sum, sum);
}

/* Every change of a member's state, incarnation or start, and every member added or gone,
 * moves the verdict digest in step (swim pulls verdicts when digests differ). */
static void test_verdict_digest_in_step(void **state) {
        static const MembershipTimeouts t = { .suspect_ms = 300, .down_ms = 1000,
                                              .forget_after_ms = 2000 };
        MemberInfo self = info("node-a", -1, "127.0.0.1:7000", 1, 100);
        _cleanup_(membership_freep) Membership *m = NULL;
        MemberVerdict v;

        assert_int_equal(membership_new(&self, &t, 0, &m), 0);
        membership_set_verdicts(m, 100);
        assert_verdicts_in_step(m, 0);
        uint64_t alone = membership_verdict_digest(m);
        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 0),
                         MEMBER_JOINED);
        MemberInfo d = info("node-d", -1, "127.0.0.1:7003", 8, 100);
        assert_int_equal(membership_learn(m, &d, 0, 0, &v), 0);
        assert_int_equal(v, MEMBER_JOINED);
        assert_verdicts_in_step(m, 0);
        uint64_t all_up = membership_verdict_digest(m);
        assert_int_not_equal(all_up, alone);
        /* Suspect, refuted, an incarnation raised alone, suspect again, down by the timer. */
        assert_int_equal(membership_verdict(m, "node-c", 7, 0, NODE_SUSPECT, 10), 1);
        assert_verdicts_in_step(m, 0);
        assert_int_not_equal(membership_verdict_digest(m), all_up);
        assert_int_equal(membership_verdict(m, "node-c", 7, 1, NODE_UP, 20), 1);
        assert_verdicts_in_step(m, 0);
        assert_int_equal(membership_verdict(m, "node-c", 7, 2, NODE_UP, 30), 2);
        assert_verdicts_in_step(m, 0);
        assert_int_equal(membership_verdict(m, "node-c", 7, 2, NODE_SUSPECT, 40), 1);
        assert_true(membership_tick(m, 40 + (int64_t) membership_suspicion_ms(m)));
        assert_int_equal(membership_find(m, "node-c")->state, NODE_DOWN);
        assert_verdicts_in_step(m, 0);
        /* A restart: the new start, up at incarnation 0. */
        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 17, 200), 1, 900),
                         MEMBER_RESTARTED);
        assert_verdicts_in_step(m, 0);
        /* This node refutes: its own incarnation counts. */
        membership_set_local_incarnation(m, 3);
        assert_verdicts_in_step(m, 3);
        /* Forgotten by an operator, and gone after forget_after_ms. */
        assert_int_equal(membership_verdict(m, "node-d", 8, 0, NODE_DOWN, 1000), 1);
        assert_int_equal(membership_forget(m, "node-d", 8, false, 1000, NULL), 1);
        assert_verdicts_in_step(m, 3);
        assert_int_equal(membership_verdict(m, "node-c", 17, 0, NODE_DOWN, 1000), 1);
        assert_true(membership_tick(m, 3000));
        assert_null(membership_find(m, "node-c"));
        assert_verdicts_in_step(m, 3);
        membership_set_local_incarnation(m, 0);
        assert_int_equal(membership_verdict_digest(m), alone);
}

/* States by silence (all-to-all) move the verdict digest too. */
static void test_verdict_digest_by_silence(void **state) {
        _cleanup_(membership_freep) Membership *m = new_self("node-a", -1);

        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 0),
                         MEMBER_JOINED);
        assert_verdicts_in_step(m, 0);
        assert_true(membership_tick(m, 100000));
        assert_int_not_equal(membership_find(m, "node-c")->state, NODE_UP);
        assert_verdicts_in_step(m, 0);
        assert_int_equal(heard(m, info("node-c", -1, "127.0.0.1:7002", 7, 100), 1, 100000),
                         MEMBER_KNOWN);
        assert_int_equal(membership_find(m, "node-c")->state, NODE_UP);
        assert_verdicts_in_step(m, 0);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_join_and_order),
                cmocka_unit_test(test_version_agreement),
                cmocka_unit_test(test_timeouts_and_return),
                cmocka_unit_test(test_restart_replaces),
                cmocka_unit_test(test_duplicates_refused),
                cmocka_unit_test(test_learn),
                cmocka_unit_test(test_forget),
                cmocka_unit_test(test_forget_after),
                cmocka_unit_test(test_partial_records),
                cmocka_unit_test(test_version_never_wraps),
                cmocka_unit_test(test_registry_digests),
                cmocka_unit_test(test_version_from_non_member_ignored),
                cmocka_unit_test(test_version_jump_refused),
                cmocka_unit_test(test_restart_only_from_the_node),
                cmocka_unit_test(test_restart_from_proven_record),
                cmocka_unit_test(test_max_nodes),
                cmocka_unit_test(test_table_digest),
                cmocka_unit_test(test_shared_records),
                cmocka_unit_test(test_rank_holders),
                cmocka_unit_test(test_verdicts),
                cmocka_unit_test(test_suspicion_grows_with_log_n),
                cmocka_unit_test(test_verdicts_forget_after),
                cmocka_unit_test(test_verdict_digest_in_step),
                cmocka_unit_test(test_verdict_digest_by_silence),
        };
        return cmocka_run_group_tests(tests, NULL, NULL);
}

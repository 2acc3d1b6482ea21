/* test-topology-copy.c: a topology as one block: borrowed nodes copied, a published membership
 * of 1,000 members in a few allocations, owned nodes taken over, error paths. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "membership/membership.h"
#include "core/topology.h"

#define MANY_MEMBERS 1000u
#define DEVICES_PER_MEMBER 8u

/* ASan's allocator calls these on every malloc and free (sanitizer/allocator_interface.h, not
 * shipped with every compiler); weak, so that a build without ASan links and skips the counts. */
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *))
        __attribute__((weak));

static size_t n_mallocs, n_frees;

static void count_malloc(const volatile void *p, size_t size) {
        (void) p, (void) size;
        n_mallocs++;
}

static void count_free(const volatile void *p) {
        (void) p;
        n_frees++;
}

static bool counting_allocations(void) {
        static int installed;

        if (!__sanitizer_install_malloc_and_free_hooks)
                return false;
        if (!installed)
                installed = __sanitizer_install_malloc_and_free_hooks(count_malloc, count_free);
        return installed != 0;
}

static const char *const digest =
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/* Sources the test scribbles over after the copy: the topology must not point into them. */
static void test_copy_borrows_nothing(void **state) {
        char name_a[] = "node-a", name_b[] = "node-b", name_c[] = "node-c";
        char address[] = "10.0.0.2:7000", kind[] = "cuda", uuid[] = "GPU-1", gpu[] = "H100";
        char bus[] = "0000:01:00.0";
        Device devices[2] = {
                { .local_index = 0, .kind = kind, .name = gpu, .uuid = uuid, .pci_bus_id = bus,
                  .memory_bytes = 80, .numa_node = 1 },
                { .local_index = 1, .kind = kind, .name = gpu, .uuid = NULL, .pci_bus_id = NULL,
                  .memory_bytes = 81, .numa_node = -1 },
        };
        Node nodes[3] = {
                { .name = name_c, .address = NULL, .node_rank = -1, .state = NODE_DOWN },
                { .name = name_b, .address = address, .node_rank = -1, .devices = devices,
                  .n_devices = 2, .state = NODE_SUSPECT, .last_seen_unix_ms = 42,
                  .first_rank = 99, .local = true },
                { .name = name_a, .address = address, .node_rank = 5, .devices = devices,
                  .n_devices = 1 },
        };
        _cleanup_(topology_unrefp) Topology *t = NULL;

        snprintf(nodes[1].registry_digest, sizeof nodes[1].registry_digest, "%s", digest);
        assert_int_equal(topology_new_copy(nodes, 3, "node-b", 7, &t), 0);
        char *const sources[] = { name_a, name_b, address, kind, uuid, bus, gpu };
        for (size_t i = 0; i < ELEMENTSOF(sources); i++)
                memset(sources[i], 'x', strlen(sources[i]));
        memset(devices, 0xff, sizeof devices);
        nodes[1].registry_digest[0] = 'f';

        assert_int_equal(t->version, 7);
        assert_int_equal(t->n_nodes, 3);
        assert_int_equal(t->world_size, 3);
        /* Configured ranks first, then names; first_rank and local are the topology's own. */
        assert_string_equal(t->nodes[0].name, "node-a");
        assert_string_equal(t->nodes[1].name, "node-b");
        assert_string_equal(t->nodes[2].name, "node-c");
        assert_int_equal(t->nodes[0].first_rank, 0);
        assert_int_equal(t->nodes[1].first_rank, 1);
        assert_int_equal(t->nodes[2].first_rank, 3);
        assert_false(t->nodes[0].local);
        assert_true(t->nodes[1].local);
        assert_int_equal(t->local, 1);
        assert_ptr_equal(topology_local_node(t), &t->nodes[1]);

        const Node *b = &t->nodes[1];
        assert_string_equal(b->address, "10.0.0.2:7000");
        assert_int_equal(b->state, NODE_SUSPECT);
        assert_int_equal(b->last_seen_unix_ms, 42);
        assert_string_equal(b->registry_digest, digest);
        assert_int_equal(b->n_devices, 2);
        assert_ptr_not_equal(b->devices, devices);
        assert_string_equal(b->devices[0].kind, "cuda");
        assert_string_equal(b->devices[0].name, "H100");
        assert_string_equal(b->devices[0].uuid, "GPU-1");
        assert_string_equal(b->devices[0].pci_bus_id, "0000:01:00.0");
        assert_int_equal(b->devices[0].memory_bytes, 80);
        assert_int_equal(b->devices[0].numa_node, 1);
        assert_int_equal(b->devices[1].local_index, 1);
        /* NULL strings become "": every reader may treat them as present. */
        assert_string_equal(b->devices[1].uuid, "");
        assert_string_equal(b->devices[1].pci_bus_id, "");
        assert_string_equal(t->nodes[2].address, "");
        assert_int_equal(t->nodes[2].n_devices, 0);
        assert_null(t->nodes[2].devices);
        assert_string_equal(t->nodes[0].devices[0].uuid, "GPU-1");

        int32_t dev = -1;
        assert_ptr_equal(topology_node_of_rank(t, 2, &dev), b);
        assert_int_equal(dev, 1);
}

/* Builds a topology of nodes with the given ranks (names "n<i>") and checks its order. */
static void check_order(const int64_t *ranks, size_t n, const char *const *expected) {
        _cleanup_(topology_unrefp) Topology *t = NULL;
        Node nodes[8] = {};
        char names[8][8];

        assert_true(n <= ELEMENTSOF(nodes));
        for (size_t i = 0; i < n; i++) {
                snprintf(names[i], sizeof names[i], "n%zu", i);
                nodes[i] = (Node) { .name = names[i], .node_rank = ranks[i] };
        }
        assert_int_equal(topology_new_copy(nodes, n, "n0", 1, &t), 0);
        for (size_t i = 0; i < n; i++)
                assert_string_equal(t->nodes[i].name, expected[i]);
}

/* Dense ranks are placed, anything else sorted: the order is the same rule either way. */
static void test_order(void **state) {
        /* Dense, reversed, with unranked nodes after them by name. */
        check_order((int64_t[]) { -1, 2, 1, -1, 0, 3 }, 6,
                    (const char *const[]) { "n4", "n2", "n1", "n5", "n0", "n3" });
        /* Dense but starting at 1, one missing. */
        check_order((int64_t[]) { 3, 1, 4 }, 3, (const char *const[]) { "n1", "n0", "n2" });
        /* Sparse. */
        check_order((int64_t[]) { 1000000, 7, -1, 0 }, 4,
                    (const char *const[]) { "n3", "n1", "n0", "n2" });
        /* A repeated rank (no table allows one): sorted, the name breaking the tie. */
        check_order((int64_t[]) { 1, 0, 1, -1, 0 }, 5,
                    (const char *const[]) { "n1", "n4", "n0", "n2", "n3" });
        /* Nothing ranked: by name. */
        check_order((int64_t[]) { -1, -1, -1 }, 3, (const char *const[]) { "n0", "n1", "n2" });
        /* One ranked node. */
        check_order((int64_t[]) { -1, 5 }, 2, (const char *const[]) { "n1", "n0" });
}

static void test_no_nodes(void **state) {
        _cleanup_(topology_unrefp) Topology *t = NULL;

        assert_int_equal(topology_new_copy(NULL, 0, "x", 3, &t), 0);
        assert_int_equal(t->n_nodes, 0);
        assert_int_equal(t->world_size, 0);
        assert_null(topology_local_node(t));
}

static MemberInfo member(size_t i, char *name, char *address, Device *devices) {
        return (MemberInfo) {
                .name = name,
                .node_rank = (int64_t) (MANY_MEMBERS - i), /* the reverse of the join order */
                .address = address,
                .boot_id = i + 1,
                .started_unix_ms = 100,
                .devices = devices,
                .n_devices = DEVICES_PER_MEMBER,
        };
}

static Membership *many_members(void) {
        static const MembershipTimeouts timeouts = { .suspect_ms = 300, .down_ms = 1000 };
        Device devices[DEVICES_PER_MEMBER];
        char uuids[DEVICES_PER_MEMBER][48];
        Membership *m = NULL;

        for (size_t d = 0; d < DEVICES_PER_MEMBER; d++) {
                snprintf(uuids[d], sizeof uuids[d], "GPU-%zu-0000-1111-2222-333344445555", d);
                devices[d] = (Device) { .local_index = (int32_t) d, .kind = "cuda",
                                        .name = "NVIDIA H100 80GB HBM3", .uuid = uuids[d],
                                        .pci_bus_id = "0000:18:00.0", .numa_node = 0,
                                        .memory_bytes = UINT64_C(80) << 30 };
        }
        for (size_t i = 0; i < MANY_MEMBERS; i++) {
                char name[32], address[32];
                MemberInfo info;
                MemberVerdict v;

                snprintf(name, sizeof name, "node-%04zu", i);
                snprintf(address, sizeof address, "10.0.%zu.%zu:7000", i / 256, i % 256);
                info = member(i, name, address, devices);
                if (i == 0) {
                        assert_int_equal(membership_new(&info, &timeouts, 0, &m), 0);
                        continue;
                }
                assert_int_equal(membership_heard(m, &info, 1, 10, &v, NULL), 0);
                assert_int_equal(v, MEMBER_JOINED);
        }
        return m;
}

/* A published topology: every member, copied; in a few allocations at 1,000 members of 8
 * devices (membership_topology() used to make 35 per member), freed with one free(). */
static void test_publish_many_members(void **state) {
        _cleanup_(membership_freep) Membership *m = many_members();
        Topology *t = NULL;
        bool counting = counting_allocations();
        size_t mallocs = n_mallocs, frees = n_frees;

        assert_int_equal(membership_topology(m, 20, 5000, &t), 0);
        mallocs = n_mallocs - mallocs;
        frees = n_frees - frees;

        assert_int_equal(t->n_nodes, MANY_MEMBERS);
        assert_int_equal(t->world_size, MANY_MEMBERS * DEVICES_PER_MEMBER);
        assert_int_equal(t->version, membership_version(m));
        for (size_t i = 0; i < t->n_nodes; i++) {
                const Node *n = &t->nodes[i];
                const Member *e = membership_find(m, n->name);

                assert_non_null(e);
                assert_int_equal(n->node_rank, (int64_t) i + 1);
                assert_int_equal(n->first_rank, (int64_t) (i * DEVICES_PER_MEMBER));
                assert_ptr_not_equal(n->name, e->info->name);
                assert_string_equal(n->address, e->info->address);
                assert_ptr_not_equal(n->address, e->info->address);
                assert_int_equal(n->local, e->local);
                assert_int_equal(n->n_devices, DEVICES_PER_MEMBER);
                assert_ptr_not_equal(n->devices, e->info->devices);
                for (size_t d = 0; d < n->n_devices; d++) {
                        assert_string_equal(n->devices[d].uuid, e->info->devices[d].uuid);
                        assert_ptr_not_equal(n->devices[d].uuid, e->info->devices[d].uuid);
                        assert_string_equal(n->devices[d].name, "NVIDIA H100 80GB HBM3");
                        assert_string_equal(n->devices[d].pci_bus_id, "0000:18:00.0");
                }
        }
        assert_string_equal(topology_local_node(t)->name, "node-0000");
        assert_int_equal(t->local, MANY_MEMBERS - 1);

        /* The topology outlives the table it was published from. */
        m = membership_free(m);
        assert_string_equal(t->nodes[0].name, "node-0999");
        assert_string_equal(t->nodes[0].devices[7].uuid, "GPU-7-0000-1111-2222-333344445555");

        size_t frees_before_unref = n_frees;
        assert_null(topology_unref(t));
        if (!counting)
                skip(); /* no ASan: the contents are checked, the allocations are not counted */
        print_message("membership_topology(): %zu allocations, %zu frees; unref: %zu frees\n",
                      mallocs, frees, n_frees - frees_before_unref);
        assert_true(mallocs <= 4);
        assert_int_equal(mallocs, frees + 1); /* everything but the topology freed at once */
        assert_int_equal(n_frees - frees_before_unref, 1);
}

/* topology_new() takes over nodes made with node_copy(), on success and on failure; ASan's leak
 * check sees anything left. */
static void test_new_takes_over(void **state) {
        Device gpu = { .kind = "cuda", .name = "H100", .uuid = "GPU-1", .pci_bus_id = "",
                       .numa_node = -1 };
        Node from = { .name = "node-a", .address = "h:1", .node_rank = 0, .devices = &gpu,
                      .n_devices = 1 };
        _cleanup_(topology_unrefp) Topology *t = NULL;
        Node *nodes = calloc(2, sizeof(Node));

        assert_non_null(nodes);
        assert_int_equal(node_copy(&from, &nodes[0]), 0);
        from.name = "node-b";
        from.node_rank = 1;
        assert_int_equal(node_copy(&from, &nodes[1]), 0);
        assert_int_equal(topology_new(nodes, 2, "node-b", 4, &t), 0);
        assert_int_equal(t->n_nodes, 2);
        assert_string_equal(t->nodes[1].name, "node-b");
        assert_string_equal(t->nodes[1].devices[0].uuid, "GPU-1");
        assert_int_equal(t->local, 1);

        /* Refused (nowhere to return it): the nodes are released all the same. */
        nodes = calloc(2, sizeof(Node));
        assert_non_null(nodes);
        assert_int_equal(node_copy(&from, &nodes[0]), 0);
        from.name = "node-c";
        assert_int_equal(node_copy(&from, &nodes[1]), 0);
        assert_int_equal(topology_new(nodes, 2, "node-c", 4, NULL), -EINVAL);
}

static void test_copy_errors(void **state) {
        Node node = { .name = "n", .n_devices = 1 };
        Topology *t = (Topology *) 0x1;

        assert_int_equal(topology_new_copy(NULL, 1, "n", 1, &t), -EINVAL);
        assert_int_equal(topology_new_copy(&node, 1, "n", 1, NULL), -EINVAL);
        /* Devices promised but missing. */
        assert_int_equal(topology_new_copy(&node, 1, "n", 1, &t), -EINVAL);
        /* More nodes than memory can number: refused before any is read. */
        assert_int_equal(topology_new_copy(&node, SIZE_MAX / 4, "n", 1, &t), -ENOMEM);
        assert_ptr_equal(t, (Topology *) 0x1);
}

/* A copy with another digest stands alone: the original goes first. */
static void test_with_local_digest_stands_alone(void **state) {
        Topology *t = NULL, *copy = NULL;

        assert_int_equal(topology_new_local("node-a", 3, "h:1", 1000, 1024, &t), 0);
        assert_string_equal(t->nodes[0].devices[999].name, "host999");
        assert_string_equal(t->nodes[0].devices[999].kind, "host");
        assert_string_equal(t->nodes[0].devices[999].uuid, "");
        assert_int_equal(topology_with_local_digest(t, digest, &copy), 0);
        assert_null(topology_unref(t));
        assert_string_equal(copy->nodes[0].name, "node-a");
        assert_string_equal(copy->nodes[0].address, "h:1");
        assert_string_equal(copy->nodes[0].registry_digest, digest);
        assert_string_equal(copy->nodes[0].devices[999].name, "host999");
        assert_int_equal(copy->nodes[0].devices[999].memory_bytes, 1024);
        assert_int_equal(copy->world_size, 1000);
        assert_true(copy->nodes[0].local);
        assert_null(topology_unref(copy));
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_copy_borrows_nothing),
                cmocka_unit_test(test_order),
                cmocka_unit_test(test_no_nodes),
                cmocka_unit_test(test_publish_many_members),
                cmocka_unit_test(test_new_takes_over),
                cmocka_unit_test(test_copy_errors),
                cmocka_unit_test(test_with_local_digest_stands_alone),
        };

        return cmocka_run_group_tests(tests, NULL, NULL);
}

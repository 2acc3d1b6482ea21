#!/usr/bin/env python3
"""Reference for Build step 5 (semantics.md, "Layout over the mesh"), written from the text.

Prints layout cases and their expected results for test-layout.c to recompute and compare.
Pure Python: torch.chunk is modelled by slicing a range into ceil(L/n)-long pieces.

Output, whitespace-separated tokens, one record per line:
  case NAME
  elem ELEM_SIZE align ALIGN
  mesh none | mesh N ranks R0 .. RN-1 device K NAME SIZE .. expert K NAME SIZE ..
  param NAME NDIMS D.. NPLACEMENTS (AXIS shard|replicate DIM)..
  expect_param NAME device|expert NPLACEMENTS (AXIS KIND NORMALISED_DIM AXIS_SIZE)..
  expect_rank RANK SIZE_BYTES NDEVICE COORD.. NEXPERT COORD..
  expect_slice NDIMS LOCAL_SHAPE.. GLOBAL_OFFSET.. BYTE_OFFSET BYTE_LENGTH
  end
expect_slice lines follow their expect_rank line, one per parameter in order. A case whose experts
do not divide over ep (a piece the axis named ep splits is no multiple of its size) is refused:
after its param lines comes "refused NAME" (the first such parameter, ranks in order) and end.
"""

import random
import sys


def torch_chunk_piece(length, n, c):
    """The piece at coordinate c when torch.chunk(range(length), n) is padded with empty pieces."""
    chunk = -(-length // n)
    items = range(length)
    pieces = [items[i:i + chunk] for i in range(0, length, chunk)] if chunk > 0 else []
    if c < len(pieces):
        return pieces[c][0], len(pieces[c])
    return min(length, c * chunk), 0


def unravel(index, sizes):
    coords = []
    for size in reversed(sizes):
        coords.append(index % size)
        index //= size
    return list(reversed(coords))


def round_up(x, align):
    return (x + align - 1) // align * align


class Refused(Exception):
    """Experts that do not divide over ep: the parameter's name."""


def layout(mesh, params, elem, align):
    """mesh: None or dict(ranks, device=[(name, size)], expert=[(name, size)])."""
    device = mesh["device"] if mesh else []
    expert = mesh["expert"] if mesh else []
    ranks = mesh["ranks"] if mesh else [0]
    device_names = {n for n, _ in device}
    expert_names = {n for n, _ in expert}

    laid = []
    for name, shape, placements in params:
        use_expert = any(a in expert_names and a not in device_names for a, _, _ in placements)
        view = expert if use_expert else device
        sizes = dict(view)
        norm = []
        for axis, kind, dim in placements:
            d = (dim + len(shape) if dim < 0 else dim) if kind == "shard" else 0
            norm.append((axis, kind, d, sizes.get(axis, 1)))
        laid.append((name, shape, "expert" if use_expert else "device", view, norm))

    out_ranks = []
    for position, rank in enumerate(ranks):
        dcoords = unravel(position, [s for _, s in device])
        ecoords = unravel(position, [s for _, s in expert])
        slices = []
        cursor = 0
        any_bytes = False
        for name, shape, vname, view, norm in laid:
            coords = ecoords if vname == "expert" else dcoords
            start = [0] * len(shape)
            length = list(shape)
            # Nest in the view's dimension order: each axis splits what the previous ones left.
            for k, (vdim, vsize) in enumerate(view):
                for axis, kind, d, _ in norm:
                    if kind == "shard" and axis == vdim:
                        if axis == "ep" and length[d] % vsize:
                            raise Refused(name)
                        s, l = torch_chunk_piece(length[d], vsize, coords[k])
                        start[d] += s
                        length[d] = l
            count = 1
            for l in length:
                count *= l
            if count == 0:
                boff, blen = 0, 0
            else:
                boff = round_up(cursor, align)
                blen = count * elem
                cursor = boff + blen
                any_bytes = True
            slices.append((length, start, boff, blen))
        size = round_up(cursor, align) if any_bytes else 0
        out_ranks.append((rank, size, dcoords, ecoords, slices))
    return laid, out_ranks


def emit(name, mesh, params, elem=4, align=64):
    try:
        laid, ranks = layout(mesh, params, elem, align)
    except Refused as e:
        laid, ranks, refused = None, None, e.args[0]
    w = sys.stdout.write
    w("case %s\n" % name)
    w("elem %d align %d\n" % (elem, align))
    if mesh is None:
        w("mesh none\n")
    else:
        w("mesh %d ranks %s device %d %s expert %d %s\n" % (
            len(mesh["ranks"]), " ".join(map(str, mesh["ranks"])),
            len(mesh["device"]), " ".join("%s %d" % d for d in mesh["device"]),
            len(mesh["expert"]), " ".join("%s %d" % d for d in mesh["expert"])))
    for pname, shape, placements in params:
        w("param %s %d %s %d %s\n" % (pname, len(shape), " ".join(map(str, shape)), len(placements),
                                      " ".join("%s %s %d" % p for p in placements)))
    if laid is None:
        w("refused %s\nend\n" % refused)
        return
    for pname, _, vname, _, norm in laid:
        w("expect_param %s %s %d %s\n" % (pname, vname, len(norm), " ".join("%s %s %d %d" % n for n in norm)))
    for rank, size, dc, ec, slices in ranks:
        w("expect_rank %d %d %d %s %d %s\n" % (rank, size, len(dc), " ".join(map(str, dc)),
                                               len(ec), " ".join(map(str, ec))))
        for length, start, boff, blen in slices:
            w("expect_slice %d %s %s %d %d\n" % (len(length), " ".join(map(str, length)),
                                                 " ".join(map(str, start)), boff, blen))
    w("end\n")


def mesh_of(device, expert=(), ranks=None):
    n = 1
    for _, s in device:
        n *= s
    return {"ranks": list(ranks) if ranks is not None else list(range(n)),
            "device": list(device), "expert": list(expert)}


def hand_cases():
    emit("no_mesh", None, [("w", [3, 5], [("tp", "shard", 0)]), ("b", [7], [])])
    emit("one_dim_uneven", mesh_of([("tp", 4)]), [("w", [10, 3], [("tp", "shard", 0)])])
    emit("three_over_four", mesh_of([("tp", 4)]), [("w", [3], [("tp", "shard", -1)])])
    emit("five_over_four", mesh_of([("tp", 4)]), [("w", [2, 5], [("tp", "shard", 1)])])
    emit("zero_length", mesh_of([("tp", 2)]), [("w", [0, 4], [("tp", "shard", 1)]), ("b", [4], [])])
    emit("nested_dp_tp", mesh_of([("dp", 2), ("tp", 2)]),
         [("w", [7, 2], [("tp", "shard", 0), ("dp", "shard", 0)])])
    emit("nested_three", mesh_of([("dp", 2), ("cp", 3), ("tp", 2)]),
         [("w", [13, 4], [("tp", "shard", 0), ("cp", "shard", -2), ("dp", "shard", 0)]),
          ("r", [5], [("dp", "replicate", 0)])])
    emit("two_dims", mesh_of([("dp", 2), ("tp", 3)], ranks=[5, 4, 3, 2, 1, 0]),
         [("w", [4, 7], [("dp", "shard", 0), ("tp", "shard", 1)]), ("n", [9], [("tp", "replicate", 0)])])
    emit("expert_view", mesh_of([("dp", 2), ("tp", 2)], [("edp", 1), ("ep", 4)]),
         [("experts", [8, 3, 2], [("ep", "shard", 0), ("tp", "shard", -1)]),
          ("router", [6, 4], [("tp", "shard", 0)]),
          ("shared", [8], [("dp", "shard", 0), ("ep", "replicate", 0)])])
    emit("expert_shared_name", mesh_of([("dp", 2), ("tp", 2)], [("ep", 2), ("tp", 2)]),
         [("a", [4, 4], [("tp", "shard", 1), ("ep", "shard", 0)]),
          ("b", [4, 4], [("tp", "shard", 1), ("dp", "shard", 0)])])
    emit("experts_uneven", mesh_of([("dp", 2), ("tp", 2)], [("edp", 1), ("ep", 4)]),
         [("router", [6, 4], [("tp", "shard", 0)]), ("experts", [6, 3, 2], [("ep", "shard", 0)])])
    emit("experts_uneven_nested", mesh_of([("edp", 2), ("ep", 2)]),
         [("w", [6, 2], [("ep", "shard", 0), ("edp", "shard", 0)])])
    emit("unknown_axis", mesh_of([("tp", 2)]), [("w", [4], [("pp", "shard", 0), ("tp", "shard", 0)])])
    emit("align_4096_bf16", mesh_of([("tp", 2)]),
         [("a", [3, 3], [("tp", "shard", 0)]), ("b", [1], []), ("c", [5], [("tp", "shard", 0)])],
         elem=2, align=4096)


NAMES = ["dp", "cp", "tp", "ep", "edp", "pp", "sp"]


def factor(n, k, rng):
    """n as a product of k positive sizes, in random order."""
    sizes = [1] * k
    p = 2
    while n > 1:
        while n % p == 0:
            sizes[rng.randrange(k)] *= p
            n //= p
        p += 1
    return sizes


def random_cases(count, seed):
    rng = random.Random(seed)
    for i in range(count):
        if rng.random() < 0.05:
            mesh = None
            names = rng.sample(NAMES, 3)
        else:
            n = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24])
            kd = rng.randint(1, 3)
            dnames = rng.sample(NAMES, kd)
            device = list(zip(dnames, factor(n, kd, rng)))
            expert = []
            if rng.random() < 0.5:
                ke = rng.randint(1, 3)
                enames = rng.sample(NAMES, ke)
                expert = list(zip(enames, factor(n, ke, rng)))
            ranks = list(range(n))
            if rng.random() < 0.5:
                rng.shuffle(ranks)
            mesh = mesh_of(device, expert, ranks)
            names = list({a for a, _ in device} | {a for a, _ in expert} | {rng.choice(NAMES)})
        params = []
        for j in range(rng.randint(0, 4)):
            rank = rng.randint(0, 3)
            shape = [rng.choice([0, 1, 2, 3, 5, 7, 8, 9, 13, 16]) if rng.random() < 0.9 else rng.randint(0, 40)
                     for _ in range(rank)]
            placements = []
            for axis in rng.sample(sorted(names), rng.randint(0, len(names))):
                if rank > 0 and rng.random() < 0.7:
                    placements.append((axis, "shard", rng.randrange(-rank, rank)))
                else:
                    placements.append((axis, "replicate", 0))
            # Mostly experts that divide over ep (a multiple of the rank count divides over
            # every nesting of sizes multiplying to it); the rest are refused.
            if mesh is not None and rng.random() < 0.8:
                n_ranks = len(mesh["ranks"])
                for axis, kind, dim in placements:
                    if axis == "ep" and kind == "shard":
                        shape[dim] = n_ranks * rng.randint(0, 2)
            params.append(("p%d" % j, shape, placements))
        emit("random_%d" % i, mesh, params, elem=rng.choice([1, 2, 4, 8]), align=rng.choice([64, 128, 256, 4096]))


def self_check():
    """torch.chunk facts the model above must reproduce."""
    # torch.chunk(arange(5), 4) -> [0,1], [2,3], [4]; the fourth coordinate gets nothing.
    assert [torch_chunk_piece(5, 4, c) for c in range(4)] == [(0, 2), (2, 2), (4, 1), (5, 0)]
    # torch.chunk(arange(3), 4) -> [0], [1], [2]
    assert [torch_chunk_piece(3, 4, c) for c in range(4)] == [(0, 1), (1, 1), (2, 1), (3, 0)]
    # torch.chunk(arange(6), 4) -> [0,1], [2,3], [4,5]
    assert [torch_chunk_piece(6, 4, c) for c in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 0)]
    assert [torch_chunk_piece(0, 3, c) for c in range(3)] == [(0, 0)] * 3


if __name__ == "__main__":
    self_check()
    hand_cases()
    random_cases(int(sys.argv[1]) if len(sys.argv) > 1 else 250, 20240601)

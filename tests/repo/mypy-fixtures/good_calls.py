"""Calls of the familyd package as its README shows them: mypy finds nothing wrong here."""

import familyd


def main(socket: str) -> int:
    with familyd.Client(socket, timeout=5.0) as c:
        mesh = c.create_mesh({"ep": 4}, ranks=range(4))
        with c.build("grouped_experts", config={"hidden_size": 64}, mesh_id=mesh.mesh_id,
                     dtype="bfloat16", seed=0, mode="private") as b:
            ok, violations = c.validate([{"fqns": ["layers.0.moe"], "build": b}],
                                        context={"mesh_id": mesh.mesh_id})
            freed: bool = b.release()
            print(ok, violations, freed, b.dtype_of("gate_up_proj"))
        handles = familyd.fetch_shards("shard.sock", ["tok"], writable=False)
        for h in handles:
            h.close()
    return 0

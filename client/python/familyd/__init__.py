"""familyd: a small Python client of the familyd node daemon for trainers.

    import familyd
    with familyd.Client("run/familyd.sock") as c:
        b = c.build("grouped_experts", config={...}, dtype="bfloat16")
        w = b.ranks[0]["gate_up_proj"]        # numpy view of the shared memory, no copy
        t = b.ranks[0].torch()["gate_up_proj"]  # torch.bfloat16, same memory
        ok, violations = c.validate([{"fqns": ["layers.0.moe"], "build": b}], {"ep_size": 1})
        m = c.build("mlp", config={...}, checkpoint="/models/llama",   # safetensors weights
                    checkpoint_prefix="model.layers.0.mlp")

Message classes: an installed package (pip install, meson install) has protoc's, generated at
build time with typed stubs (familyd.v1.family_pb2, ...); a source tree builds them at run time
from the descriptor set (FAMILYD_DESCRIPTORS, then next to the package, then
/usr/share/familyd/familyd.binpb). See familyd._protos.
Needs python3-grpcio, python3-protobuf, python3-numpy; torch is optional. Shards in GPU memory
(device_kind "cuda") are imported through the CUDA driver, loaded at run time (familyd.cuda):
.ranks[r] is then a DeviceRankTensors whose arrays carry __cuda_array_interface__, and .torch()
needs a CUDA build of torch (Debian's has none: it says so).
"""

from ._protos import Protos, default_protos, descriptor_path
from .client import Build, Client, DeviceRankTensors, FamilydError, RankTensors, ValidateResult
from .cuda import DeviceArray, DeviceMemoryError, DeviceShard
from .shard import MODES, CheckpointError, ShardError, ShardHandle, fetch as fetch_shards

__all__ = ["Build", "CheckpointError", "Client", "DeviceArray", "DeviceMemoryError",
           "DeviceRankTensors",
           "DeviceShard", "FamilydError", "MODES", "Protos", "RankTensors", "ShardError", "ShardHandle",
           "ValidateResult", "default_protos", "descriptor_path", "fetch_shards"]

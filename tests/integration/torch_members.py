"""Members of tests/integration/torch_registry/ for test_torch_build.py: one well-behaved
module, one that records reset_parameters calls, and the bad ones (each wrong in one way).

Imported as `torch_members` (the test puts this folder on sys.path), so the registry's
constructor paths are `torch_members.NAME`. The config is a dict or an object with
attributes; a replacement (module=) takes the source module's .config.
"""

from typing import Any, Dict, List

import torch

# Every call of RecordsResets.reset_parameters: the device type of its weight at the time.
RESET_CALLS: List[str] = []
RESET_VALUE = 7.0


def _field(config: Any, name: str) -> Any:
    return config[name] if isinstance(config, dict) else getattr(config, name)


def _config(config: Any, module: Any) -> Any:
    if config is None and module is not None:
        config = getattr(module, "config", None)
    if config is None:
        raise TypeError("needs config (or a module with .config)")
    return config


def _tp(context: Any) -> tuple:
    """(tp size, this process's tp coordinate) from a ParallelContext, or (1, 0)."""
    if context is None or getattr(context, "tp_size", 1) == 1:
        return 1, 0
    group = context.groups.get("tp")
    if group is not None:
        return context.tp_size, torch.distributed.get_rank(group)
    return context.tp_size, context.ranks.get("tp", 0)


def _chunk(length: int, parts: int, index: int) -> int:
    chunk = -(-length // parts)
    return max(0, min(length, (index + 1) * chunk) - min(length, index * chunk))


def _empty(shape: Any, device: Any, dtype: Any) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.empty(tuple(shape), device=device, dtype=dtype))


class GoodLinear(torch.nn.Module):
    """y = (x @ weight.T + bias) * scale; weight [out_size, hidden_size], bias [out_size], both
    split over tp on dim 0 (column-parallel, no communication: each rank has its columns)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, scale: float = 1.0, *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.config = _config(config, module)
        self.module_fqn = module_fqn
        self.scale = scale
        size, index = _tp(context)
        out = _chunk(_field(self.config, "out_size"), size, index)
        self.weight = _empty((out, _field(self.config, "hidden_size")), device, dtype)
        self.bias = _empty((out,), device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.weight.t() + self.bias) * self.scale


class WithBuffers(torch.nn.Module):
    """weight [hidden_size], and buffers computed from the config: scale (0.5 * i), and a
    submodule's table (i squared), made on the device it is given."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "", *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        hidden = _field(_config(config, module), "hidden_size")
        self.weight = _empty((hidden,), device, dtype)
        self.register_buffer("scale", torch.arange(hidden, device=device) * 0.5)
        self.inner = torch.nn.Module()
        self.inner.register_buffer("table", torch.arange(hidden, device=device) ** 2)


class Block(torch.nn.Module):
    """A plain container of two modules (a model's layer): not built by familyd."""

    def __init__(self, first: torch.nn.Module, second: torch.nn.Module) -> None:
        super().__init__()
        self.first = first
        self.second = second

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class Source(torch.nn.Module):
    """An existing module to replace: .config and parameters named as tb_linear's."""

    def __init__(self, config: Dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.weight = torch.nn.Parameter(torch.full((config["out_size"], config["hidden_size"]),
                                                    5.0))
        self.bias = torch.nn.Parameter(torch.full((config["out_size"],), 5.0))


class RecordsResets(torch.nn.Module):
    """Calls reset_parameters in its constructor, as torch modules do (on `meta` that is a
    no-op); reset_parameters records every call and, on a real device, fills RESET_VALUE."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "", *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        config = _config(config, module)
        self.weight = _empty((_field(config, "hidden_size"),), device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        RESET_CALLS.append(self.weight.device.type)
        if self.weight.device.type != "meta":
            with torch.no_grad():
                self.weight.fill_(RESET_VALUE)


class NoConfig(torch.nn.Module):
    """Its registry entry accepts config, but the signature has no `config`."""

    def __init__(self, module_fqn: str = "", *, device: Any = None) -> None:
        super().__init__()


class NoScale(torch.nn.Module):
    """Its registry entry accepts `scale`, but the signature has none."""

    def __init__(self, config: Any = None, module_fqn: str = "", *, device: Any = None) -> None:
        super().__init__()
        self.weight = _empty((_field(config, "hidden_size"),), device, None)


def not_a_module(config: Any = None, module_fqn: str = "", device: Any = None) -> Any:
    """A constructor that returns a dict of tensors, not an nn.Module."""
    return {"weight": torch.empty((_field(config, "hidden_size"),), device=device)}


class WrongShape(torch.nn.Module):
    """weight is [hidden_size, out_size]: the layout's [out_size, hidden_size] transposed."""

    def __init__(self, config: Any = None, module_fqn: str = "", *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.weight = _empty((_field(config, "hidden_size"), _field(config, "out_size")),
                             device, dtype)


class ExtraParameter(torch.nn.Module):
    """weight as declared, and a bias the registry does not declare."""

    def __init__(self, config: Any = None, module_fqn: str = "", *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        hidden = _field(config, "hidden_size")
        self.weight = _empty((hidden,), device, dtype)
        self.inner = torch.nn.Module()
        self.inner.bias = _empty((hidden,), device, dtype)


class NoParameters(torch.nn.Module):
    """Declares no parameter at all (the layout's weight is not one of it)."""

    def __init__(self, config: Any = None, module_fqn: str = "", *, device: Any = None) -> None:
        super().__init__()
        self.register_buffer("weight", torch.empty((_field(config, "hidden_size"),),
                                                   device=device))


class Float32Only(torch.nn.Module):
    """Ignores the dtype it is given: its weight is always float32."""

    def __init__(self, config: Any = None, module_fqn: str = "", *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.weight = _empty((_field(config, "hidden_size"),), device, torch.float32)

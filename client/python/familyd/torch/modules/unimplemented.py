"""Registry members this package has no torch implementation of (they need a GPU kernel, a
fused op or ring communication that torch 1.13 on CPU with gloo does not give). Each is a class
with its variant's `accepts` as keywords, so the registry's constructor path resolves and a
caller that binds arguments to the signature gets as far as constructing it; constructing it
raises NotImplementedError naming the member and what to use instead."""

from typing import Any, NoReturn

import torch


def _refuse(member: str, family: str, instead: str) -> NoReturn:
    raise NotImplementedError(
        "familyd.torch.modules.%s (family %s) is not implemented by familyd.torch.modules; %s"
        % (member, family, instead))


class FlashGQAAttention(torch.nn.Module):
    """attention, variant flash: not implemented (raises NotImplementedError)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, rope_theta: float = 500000.0, window: int = 0, *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _refuse("FlashGQAAttention", "attention", "use EagerGQAAttention (use_flash=False)")


class RingGQAAttention(torch.nn.Module):
    """attention, variant ring (cp > 1): not implemented (raises NotImplementedError)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, rope_theta: float = 500000.0, *, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        _refuse("RingGQAAttention", "attention",
                "context parallelism (cp_size > 1) has no member here")


class FusedSwiGLUMLP(torch.nn.Module):
    """mlp, variant fused: not implemented (raises NotImplementedError)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _refuse("FusedSwiGLUMLP", "mlp",
                "use PlainSwiGLUMLP or TPSwiGLUMLP (use_fused_swiglu=False)")


class MXFP8GroupedSwiGLU(torch.nn.Module):
    """grouped_experts, variant mxfp8: not implemented (raises NotImplementedError)."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _refuse("MXFP8GroupedSwiGLU", "grouped_experts",
                "use GroupedExpertsLocal or EPGroupedExperts (use_mxfp8=False)")

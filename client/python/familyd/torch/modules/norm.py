"""RMSNorm (registry family norm): weight [hidden_size], init ones, replicated over tp.

forward(x) = x / sqrt(mean(x^2 over the last dim) + eps) * weight, computed in float32 at
least (float16/bfloat16 inputs are upcast, as Llama does) and returned in x's dtype. eps is the
config's rms_norm_eps, else 1e-6.

SequenceParallelRMSNorm (variant sequence_parallel, which the registry selects when the job has
sequence parallelism) is the same norm over this rank's piece of the sequence: every tp rank
holds the whole weight, but each sees only its own tokens, so the weight's gradient is summed
over the tp group in backward (identity forward).
"""

from typing import Any

import torch

from ._common import (config_int, config_value, context_axis, context_flag, local,
                      new_parameter, resolve_config)
from ._comm import copy_to_parallel


class PlainRMSNorm(torch.nn.Module):
    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "", *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        owner = type(self).__name__
        config = resolve_config(config, module, owner)
        self.hidden_size = config_int(config, "hidden_size", owner)
        self.eps = float(config_value(config, "rms_norm_eps", 1e-6, owner))
        self.module_fqn = module_fqn
        self.weight = new_parameter((self.hidden_size,), device, dtype)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The registry's init: ones."""
        if self.weight.device.type != "meta":
            with torch.no_grad():
                self.weight.fill_(1.0)

    def _weight(self) -> torch.Tensor:
        return local(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide * self._weight().to(wide.dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return "hidden_size=%d, eps=%g" % (self.hidden_size, self.eps)


class SequenceParallelRMSNorm(PlainRMSNorm):
    """The norm of this rank's piece of the sequence; the weight's gradient summed over tp
    (variant sequence_parallel). Refuses a context without sequence parallelism."""

    def __init__(self, config: Any = None, module: Any = None, module_fqn: str = "",
                 context: Any = None, *, device: Any = None, dtype: Any = None) -> None:
        owner = type(self).__name__
        if not context_flag(context, "sequence_parallel", owner):
            raise ValueError("%s needs a job with sequence parallelism (context."
                             "sequence_parallel); use PlainRMSNorm" % owner)
        tp = context_axis(context, "tp", owner, coordinate=False)
        super().__init__(config, module, module_fqn, device=device, dtype=dtype)
        self._tp = tp
        self.tp_size = tp.size

    def _weight(self) -> torch.Tensor:
        return copy_to_parallel(local(self.weight), self._tp.require_group(type(self).__name__))

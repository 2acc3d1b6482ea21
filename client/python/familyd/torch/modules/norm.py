"""RMSNorm (registry family norm): weight [hidden_size], init ones, replicated over tp.

forward(x) = x / sqrt(mean(x^2 over the last dim) + eps) * weight, computed in float32 at
least (float16/bfloat16 inputs are upcast, as Llama does) and returned in x's dtype. eps is the
config's rms_norm_eps, else 1e-6.
"""

from typing import Any

import torch

from ._common import config_int, config_value, local, new_parameter, resolve_config


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        wide = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return (wide * local(self.weight).to(wide.dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return "hidden_size=%d, eps=%g" % (self.hidden_size, self.eps)

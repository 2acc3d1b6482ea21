"""Registry members this package has no torch implementation of (they need a GPU kernel, a
fused op or ring communication that torch 1.13 on CPU with gloo does not give). Each is a class
so the registry's constructor path resolves, and constructing it raises NotImplementedError
naming the member and what to use instead."""

import torch


def _unimplemented(name, family, instead):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            "familyd.torch.modules.%s (family %s) is not implemented by familyd.torch.modules; "
            "%s" % (name, family, instead))

    doc = "Not implemented: constructing it raises NotImplementedError (%s)." % instead
    return type(name, (torch.nn.Module,), {"__init__": __init__, "__doc__": doc,
                                            "__module__": __name__})


FlashGQAAttention = _unimplemented(
    "FlashGQAAttention", "attention", "use EagerGQAAttention (use_flash=False)")
RingGQAAttention = _unimplemented(
    "RingGQAAttention", "attention", "context parallelism (cp_size > 1) has no member here")
FusedSwiGLUMLP = _unimplemented(
    "FusedSwiGLUMLP", "mlp", "use PlainSwiGLUMLP or TPSwiGLUMLP (use_fused_swiglu=False)")
MXFP8GroupedSwiGLU = _unimplemented(
    "MXFP8GroupedSwiGLU", "grouped_experts",
    "use GroupedExpertsLocal or EPGroupedExperts (use_mxfp8=False)")

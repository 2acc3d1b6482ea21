"""familyd.torch: PyTorch pieces for trainers that build their models through familyd.

familyd.torch.modules holds the reference torch implementations of the example registry's
members (deploy/registry): import it explicitly. This package imports nothing at import time,
so `import familyd.torch` stays cheap and works without torch installed.
"""

__all__ = ["modules"]

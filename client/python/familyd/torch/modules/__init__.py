"""Reference PyTorch implementations of the example registry's members (deploy/registry).

Each class is named as the last component of its variant's constructor path and takes the
variant's `accepts` as keywords (config, module, module_fqn, context, and the family's
arguments), plus device= and dtype= for where its parameters live. Parameters have the
registry's names and the LOCAL shard shapes of this process's coordinate on the member's axis
(context: a ParallelContext or a dict with its keys). They are initialised as the registry says,
except on `meta`, where they stay empty for binding to familyd's shards.

    grouped_experts  GroupedExpertsLocal, EPGroupedExperts, MXFP8GroupedSwiGLU
    mlp              PlainSwiGLUMLP, TPSwiGLUMLP, FusedSwiGLUMLP
    attention        EagerGQAAttention, FlashGQAAttention, RingGQAAttention (cp)
    embedding        PlainEmbedding, VocabParallelEmbedding
    norm             PlainRMSNorm, SequenceParallelRMSNorm

Sequence and loss parallelism (docs/torch.md): the collectives gather_sequence,
reduce_scatter_sequence and scatter_sequence, and vocab_parallel_cross_entropy.
"""

from ._comm import gather_sequence, reduce_scatter_sequence, scatter_sequence
from ._common import ParallelContext, chunk_range
from .attention import EagerGQAAttention, FlashGQAAttention, RingGQAAttention
from .embedding import PlainEmbedding, VocabParallelEmbedding
from .grouped_experts import (EPGroupedExperts, GroupedExpertsLocal, MXFP8GroupedSwiGLU,
                              mxfp8_dequantize, mxfp8_quantize)
from .mlp import FusedSwiGLUMLP, PlainSwiGLUMLP, TPSwiGLUMLP
from .loss import vocab_parallel_cross_entropy
from .norm import PlainRMSNorm, SequenceParallelRMSNorm

__all__ = ["EPGroupedExperts", "EagerGQAAttention", "FlashGQAAttention", "FusedSwiGLUMLP",
           "GroupedExpertsLocal", "MXFP8GroupedSwiGLU", "ParallelContext", "PlainEmbedding",
           "PlainRMSNorm", "PlainSwiGLUMLP", "RingGQAAttention", "SequenceParallelRMSNorm",
           "TPSwiGLUMLP", "VocabParallelEmbedding", "chunk_range", "gather_sequence",
           "mxfp8_dequantize", "mxfp8_quantize", "reduce_scatter_sequence", "scatter_sequence",
           "vocab_parallel_cross_entropy"]

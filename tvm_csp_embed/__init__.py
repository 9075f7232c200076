"""tvm_csp_embed: constraint-based embedding of accelerator instructions into DNN operators.

Finds how the VTA instructions (GEMM, ALU multiply + add) embed into an operator by solving
a constraint program over the scalar dataflow (MiniZinc + Gecode; polyhedral model with
islpy), and derives the dim mapping, padding, relayout plan and free loops.

>>> from tvm_csp_embed import conv2d, gemm, embed          # doctest: +SKIP
>>> print(embed(conv2d(1, 3, 32, 32, 64, 3, 3), gemm((1, 16, 16)), "relaxed"))

TVM is imported lazily (only by :func:`from_te` / :func:`from_primfunc`).
"""
from .embedding import Embedding, EmbeddingError, embed, embed_all
from .instructions import InstructionGraph, alu_muladd, gemm
from .solve import EmbeddingNotFound, SolveResult, SolverError, solve
from .workload import (ConformabilityError, Workload, conv2d, dense, depthwise_conv2d, from_primfunc,
                       from_te, matmul)

__all__ = ["Workload", "ConformabilityError", "from_te", "from_primfunc", "matmul", "dense", "conv2d",
           "depthwise_conv2d", "InstructionGraph", "gemm", "alu_muladd", "solve", "SolveResult",
           "EmbeddingNotFound", "SolverError", "Embedding", "EmbeddingError", "embed", "embed_all"]

"""tvm_csp_embed: constraint-based embedding of accelerator instructions into DNN operators.

Finds how the VTA instructions (GEMM, ALU multiply + add) embed into an operator by solving
a constraint program over the scalar dataflow (MiniZinc + Gecode; polyhedral model with
islpy), derives the dim mapping, padding, relayout plan and free loops, and generates the VTA
code of every embedding (:mod:`tvm_csp_embed.codegen`).

Importing the package registers the strategies ``csp-strict`` and ``csp-relaxed`` in
:mod:`vta_ext` and makes ``csp-relaxed`` the default of ``relax.build(mod, target="ext_vta")``
(:mod:`tvm_csp_embed.strategy`); ``vta_ext.build_options(strategy="stock")`` keeps the stock
templates.

>>> from tvm_csp_embed import conv2d, gemm, embed          # doctest: +SKIP
>>> print(embed(conv2d(1, 3, 32, 32, 64, 3, 3), gemm((1, 16, 16)), "relaxed"))
"""
from .embedding import Embedding, EmbeddingError, embed, embed_all
from .instructions import InstructionGraph, alu_muladd, gemm
from .solve import EmbeddingNotFound, SolveResult, SolverError, solve
from .workload import (ConformabilityError, Workload, conv2d, dense, depthwise_conv2d, from_primfunc,
                       from_te, matmul)
from . import strategy as _strategy  # registers csp-strict / csp-relaxed; csp-relaxed becomes the default  # noqa: E402,F401
from . import summary as _summary  # the CSP plans' words in the build report  # noqa: E402,F401
from . import depthwise as _depthwise  # depthwise convs: ALU template or GEMM block-diagonal  # noqa: E402,F401
from . import csp_reference as _csp_reference  # the CSP strategies' numpy references, for the tuner  # noqa: E402,F401
from . import grouped as _grouped  # narrow grouped convs: CSP plan or GEMM block-diagonal  # noqa: E402,F401
from . import pool as _pool  # max pools: the direct or the separable schedule  # noqa: E402,F401
from . import lanes as _lanes  # lane constants written by producers for folding consumers  # noqa: E402,F401
from . import solve_worker as _solve_worker  # noqa: E402

_solve_worker.start()   # the solver's worker process boots while the caller prepares its build

__all__ = ["Workload", "ConformabilityError", "from_te", "from_primfunc", "matmul", "dense", "conv2d",
           "depthwise_conv2d", "InstructionGraph", "gemm", "alu_muladd", "solve", "SolveResult",
           "EmbeddingNotFound", "SolverError", "Embedding", "EmbeddingError", "embed", "embed_all"]

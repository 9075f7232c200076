"""The tuner's numpy references: :mod:`tvm_csp_embed.reference` (the definitions, the registry and
the stock layouts) and :mod:`tvm_csp_embed.csp_reference` (the CSP strategies' layouts), re-exported
here under the name they had when they lived in the tuner.
"""
from ..reference import apply_epilogue, reference_for, register_reference

__all__ = ["register_reference", "reference_for", "apply_epilogue"]

"""Operator templates (TE compute + s_tir schedule + lowering to a VTA program).

* :mod:`.conv2d` -- ``conv2d_packed`` with the requantisation epilogue; entry point
  :func:`vta_ext.templates.conv2d.build_conv2d`.
"""

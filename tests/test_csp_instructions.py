"""Instruction dataflow graphs built from a configuration."""
import pytest

from tvm_csp_embed.instructions import alu_muladd, gemm


def test_gemm_from_plain_sizes():
    g = gemm((1, 16, 16))
    assert g.axes == ("x", "y", "z") and g.sizes == (1, 16, 16)
    assert g.operand_axes == {"A": ("x", "z"), "B": ("y", "z"), "C": ("x", "y")}
    assert g.num_mults == 256 and len(g.operand_nodes("B")) == 256 and len(g.operand_nodes("C")) == 16
    e = g.edges()
    assert len(e["chain"]) == 16 * 15 and len(e["spatial"]) == 255 - 15
    assert g.einsum() == "cxz,cyz->cxy"


def test_gemm_block_in_and_out_map_to_z_and_y():
    g = gemm((2, 8, 4))  # (BATCH, BLOCK_IN, BLOCK_OUT)
    assert dict(zip(g.axes, g.sizes)) == {"x": 2, "y": 4, "z": 8}


def test_gemm_and_alu_from_vta_config():
    cfgmod = pytest.importorskip("vta_ext.config")
    cfg = cfgmod.load_config("default")
    g = gemm(cfg)
    assert g.sizes == (cfg.BATCH, cfg.BLOCK_OUT, cfg.BLOCK_IN) == (1, 16, 16)
    a = alu_muladd(cfg)
    assert a.sizes == (cfg.BATCH, cfg.BLOCK_OUT) and not any(a.reduction)
    assert a.edges()["chain"] == []


def test_non_power_of_two_is_rejected():
    with pytest.raises(ValueError, match="powers of two"):
        gemm((1, 12, 16))

"""An area *proxy* of a VTA configuration: a linear model of its main resources, not synthesis.

``area = MAC area x (GEMM MACs + ALU lanes)
       + SRAM bit area x (INP + WGT + ACC + UOP scratchpad bits)
       + bus cost per bit x bus width
       + register bit area x pipeline register bits (pipelined GEMM / ALU only)``

The unit coefficients are the 45 nm figures of the co-design paper
(``accelerator-dataflow-codesign.txt``, Table I, which takes them from Accelergy / Cacti):
a multiply-accumulate unit 1,239.5 um^2, a 16-bit register 19.874 um^2, a 16-bit SRAM word
6.806 um^2. The structural assumptions (how many register or SRAM bits a bus bit and a pipeline
stage cost) are stated beside each constant and in ``docs/codesign.md``. The proxy is reported
relative to the ``default`` preset, so only the ratios matter.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Union

from vta_ext.config import VTAConfig, load_config

from .space import timing_keys

__all__ = ["AreaModel", "AREA_PROXY", "area_proxy"]

#: um^2 of one multiply-accumulate unit (co-design paper, Table I)
MAC_UM2 = 1239.5
#: um^2 of one register bit: a 16-bit register is 19.874 um^2 (co-design paper, Table I)
REGISTER_BIT_UM2 = 19.874 / 16
#: um^2 of one SRAM bit: a 16-bit SRAM word is 6.806 um^2 (co-design paper, Table I)
SRAM_BIT_UM2 = 6.806 / 16
#: SRAM bits of buffering per bit of the memory bus: one read and one write queue of 64 bus words
#: each (the DMA engine's data FIFOs; an assumption, docs/codesign.md)
BUS_FIFO_BITS_PER_BIT = 2 * 64
#: register bits per bit of the memory bus: the four register stages of the load tree that delivers
#: a bus word to the scratchpads (Intel paper, "Scratchpad load pipelining"; an assumption)
BUS_REGISTER_BITS_PER_BIT = 4
#: pipeline registers of a fully pipelined GEMM unit per MAC: its 4-stage pipeline (the published
#: unit's depth, Intel paper sec. II) holding one 32-bit partial sum per stage
GEMM_PIPELINE_BITS_PER_MAC = 4 * 32
#: pipeline registers of a fully pipelined ALU per lane: 5 stages (the published unit's 5 cycles
#: per immediate micro-op) of one 32-bit value
ALU_PIPELINE_BITS_PER_LANE = 5 * 32


@dataclass(frozen=True)
class AreaModel:
    """The coefficients of the area proxy (module docstring); every one is settable.

    Attributes
    ----------
    mac : float
        Area of one MAC unit; an ALU lane (32-bit add / shift / min / max / multiply) counts as
        one MAC unit.
    register_bit, sram_bit : float
        Area of one register bit, one SRAM bit.
    bus_fifo_bits, bus_register_bits : float
        SRAM and register bits per bit of the memory bus.
    gemm_pipeline_bits, alu_pipeline_bits : float
        Register bits a pipelined GEMM unit adds per MAC, a pipelined ALU per lane.
    """

    mac: float = MAC_UM2
    register_bit: float = REGISTER_BIT_UM2
    sram_bit: float = SRAM_BIT_UM2
    bus_fifo_bits: float = BUS_FIFO_BITS_PER_BIT
    bus_register_bits: float = BUS_REGISTER_BITS_PER_BIT
    gemm_pipeline_bits: float = GEMM_PIPELINE_BITS_PER_MAC
    alu_pipeline_bits: float = ALU_PIPELINE_BITS_PER_LANE

    def breakdown(self, config: VTAConfig) -> Dict[str, float]:
        """The proxy's terms for ``config`` (um^2): ``macs``, ``sram``, ``bus``, ``pipeline`` and
        their ``total``."""
        macs = config.BATCH * config.BLOCK_IN * config.BLOCK_OUT
        lanes = config.BATCH * config.BLOCK_OUT
        sram_bits = 8 * (config.INP_BUFF_SIZE + config.WGT_BUFF_SIZE + config.ACC_BUFF_SIZE
                         + config.UOP_BUFF_SIZE)
        bus = config.BUS_WIDTH * (self.bus_fifo_bits * self.sram_bit
                                  + self.bus_register_bits * self.register_bit)
        original = timing_keys("original")
        pipeline_bits = 0.0
        if config.GEMM_CYCLES_PER_UOP < original["GEMM_CYCLES_PER_UOP"]:
            pipeline_bits += macs * self.gemm_pipeline_bits
        if config.ALU_CYCLES_PER_UOP_IMM < original["ALU_CYCLES_PER_UOP_IMM"]:
            pipeline_bits += lanes * self.alu_pipeline_bits
        terms = {"macs": self.mac * (macs + lanes), "sram": self.sram_bit * sram_bits, "bus": bus,
                 "pipeline": self.register_bit * pipeline_bits}
        terms["total"] = sum(terms.values())
        return terms

    def area(self, config: VTAConfig) -> float:
        """The proxy of ``config`` in um^2 (45 nm unit areas; a proxy, not synthesis)."""
        return self.breakdown(config)["total"]

    def relative(self, config: VTAConfig, reference: Union[str, VTAConfig] = "default") -> float:
        """The proxy of ``config`` over that of ``reference`` (``default``: 1.0)."""
        return self.area(config) / self.area(load_config(reference))

    def __repr__(self) -> str:
        return (f"AreaModel(proxy: MAC {self.mac:g}, SRAM bit {self.sram_bit:.3f}, register bit "
                f"{self.register_bit:.3f} um^2; bus {self.bus_fifo_bits:g} SRAM + "
                f"{self.bus_register_bits:g} register bits per bit; pipeline "
                f"{self.gemm_pipeline_bits:g} bits/MAC, {self.alu_pipeline_bits:g} bits/ALU lane)")


#: the proxy with the documented coefficients
AREA_PROXY = AreaModel()


def area_proxy(config: Union[str, VTAConfig], model: AreaModel = AREA_PROXY) -> float:
    """The area proxy of ``config`` relative to the ``default`` preset (1.0)."""
    return model.relative(load_config(config))

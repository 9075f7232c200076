"""VTA hardware configuration: the single source of truth for every width, size and timing constant.

A :class:`VTAConfig` is read from a JSON file with the keys of apache VTA's ``vta_config.json``
(plus ``LOG_BLOCK_IN``/``LOG_BLOCK_OUT`` as separate keys, and the timing keys of the cycle model).
Every derived quantity (widths, block sizes, element sizes, buffer depths, instruction layouts) is
computed here, once. Configurations are immutable and passed explicitly; there is no global
environment.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from functools import cached_property
from pathlib import Path
from typing import Any, Dict, Mapping, Union

from .layout import (INSN_BITS, LOG_UOP_BITS, MAX_SRAM_ENTRIES, MEMOP_SRAM_ADDR_BITS, UOP_BITS,
                     Layout, LayoutOverflowError, MemType, instruction_layouts)

__all__ = ["VTAConfig", "ConfigError", "CONFIG_DIR", "EXTENSIONS", "DMA_KINDS", "STRUCTURE_KEYS",
           "load_config", "available_configs"]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"

#: largest contiguous DMA transfer of the driver (``VTA_MAX_XFER``), bytes
MAX_XFER = 1 << 25
#: DRAM page size of the simulated physical memory (``VTA_PAGE_BITS``)
PAGE_BYTES = 1 << 12
#: widest SRAM bank in bits (``pkg_config.py``)
MAX_BANK_BITS = 1024


class ConfigError(ValueError):
    """An invalid configuration; the message names the key or field at fault."""


_LOG_KEYS = ("LOG_INP_WIDTH", "LOG_WGT_WIDTH", "LOG_ACC_WIDTH", "LOG_BATCH", "LOG_BLOCK_IN",
             "LOG_BLOCK_OUT", "LOG_UOP_BUFF_SIZE", "LOG_INP_BUFF_SIZE", "LOG_WGT_BUFF_SIZE",
             "LOG_ACC_BUFF_SIZE", "LOG_BUS_WIDTH")
#: the memory types of the cycle model's DMA costs: the prefix of their keys, in key order
DMA_KINDS = ("INP", "WGT", "ACC", "UOP", "OUT")
#: the structural keys of the cycle model (docs/isa.md, "Cycle model"): per DMA kind its bandwidth,
#: its fixed cost per instruction and per row; per compute kind its fixed cost per instruction
STRUCTURE_KEYS = (tuple(f"{k}_BYTES_PER_CYCLE" for k in DMA_KINDS)
                  + tuple(f"{k}_INSN_CYCLES" for k in DMA_KINDS)
                  + tuple(f"{k}_ROW_CYCLES" for k in DMA_KINDS)
                  + ("GEMM_INSN_CYCLES", "ALU_INSN_CYCLES", "NOP_INSN_CYCLES", "FINISH_INSN_CYCLES",
                     "PAD_ELEM_CYCLES", "MEM_LATENCY_CYCLES", "FETCH_CYCLES", "TOKEN_CYCLES",
                     "POP_OFFSET_CYCLES"))
_TIMING_KEYS = ("GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP_IMM", "ALU_CYCLES_PER_UOP_VEC",
                "MEM_BYTES_PER_CYCLE", "DMA_OVERHEAD_CYCLES", "INSN_ISSUE_CYCLES",
                "CLOCK_MHZ") + STRUCTURE_KEYS
_EXTENSION_KEYS = ("EXT_CLIP", "EXT_PAD_MIN", "ISA_ACC_8BIT_LOAD", "ISA_ALU_MUL")
#: the hazard contract: minimum micro-op distance between two writes to one accumulator row
_HAZARD_KEYS = ("ACC_DEP_DISTANCE_GEMM", "ACC_DEP_DISTANCE_ALU")

#: optional ISA features: the configuration key that enables each, and what it adds
#: (docs/isa.md). ``EXT_*`` are this project's extensions; ``ISA_*`` are apache instructions that
#: a design may lack (the Vivado-HLS Pynq design silently ignores both, docs/devices.md)
EXTENSIONS = {
    "EXT_CLIP": "CLIP (ALU opcode 5)",
    "EXT_PAD_MIN": "pad-with-minimum (LOAD flag pad_min, bit 58)",
    "ISA_ACC_8BIT_LOAD": "LOAD of int8 data into the accumulator (memory type ACC_8BIT, 5)",
    "ISA_ALU_MUL": "ALU MUL (opcode 4)",
}


@dataclass(frozen=True)
class VTAConfig:
    """An immutable VTA configuration with all derived values.

    The fields are the JSON keys. Build one with :meth:`from_json`, :meth:`from_dict` or
    :func:`load_config` (by preset name); all of them validate.
    """

    name: str = "default"
    TARGET: str = "sim"
    HW_VER: str = "0.0.2"
    LOG_INP_WIDTH: int = 3
    LOG_WGT_WIDTH: int = 3
    LOG_ACC_WIDTH: int = 5
    LOG_BATCH: int = 0
    LOG_BLOCK_IN: int = 4
    LOG_BLOCK_OUT: int = 4
    LOG_UOP_BUFF_SIZE: int = 15
    LOG_INP_BUFF_SIZE: int = 15
    LOG_WGT_BUFF_SIZE: int = 18
    LOG_ACC_BUFF_SIZE: int = 17
    LOG_BUS_WIDTH: int = 6
    # cycle-model constants (see DESIGN.md, "The cycle model")
    GEMM_CYCLES_PER_UOP: int = 4
    ALU_CYCLES_PER_UOP_IMM: int = 5
    ALU_CYCLES_PER_UOP_VEC: int = 6
    MEM_BYTES_PER_CYCLE: int = 8
    DMA_OVERHEAD_CYCLES: int = 4
    INSN_ISSUE_CYCLES: int = 1
    CLOCK_MHZ: int = 100
    # the cycle model's structure (docs/isa.md, "Cycle model"). The defaults make it the per-micro-op
    # model of the original presets: every kind moves MEM_BYTES_PER_CYCLE and adds nothing to
    # INSN_ISSUE_CYCLES (per instruction) and DMA_OVERHEAD_CYCLES (per row); no latency
    INP_BYTES_PER_CYCLE: int = 0          # DMA bandwidth of each memory type (LOAD INP/WGT/ACC/UOP,
    WGT_BYTES_PER_CYCLE: int = 0          # STORE OUT): at most MEM_BYTES_PER_CYCLE, the bus; 0 is
    ACC_BYTES_PER_CYCLE: int = 0          # the bus rate (so a sweep of MEM_BYTES_PER_CYCLE moves
    UOP_BYTES_PER_CYCLE: int = 0          # every type that does not say otherwise)
    OUT_BYTES_PER_CYCLE: int = 0
    INP_INSN_CYCLES: int = 0              # fixed cycles per LOAD/STORE instruction of the type, on
    WGT_INSN_CYCLES: int = 0              # top of INSN_ISSUE_CYCLES
    ACC_INSN_CYCLES: int = 0
    UOP_INSN_CYCLES: int = 0
    OUT_INSN_CYCLES: int = 0
    INP_ROW_CYCLES: int = 0               # fixed cycles per DMA row of the type, on top of
    WGT_ROW_CYCLES: int = 0               # DMA_OVERHEAD_CYCLES (and of MEM_LATENCY_CYCLES)
    ACC_ROW_CYCLES: int = 0
    UOP_ROW_CYCLES: int = 0
    OUT_ROW_CYCLES: int = 0
    GEMM_INSN_CYCLES: int = 0             # fixed cycles per GEMM, ALU, NOP (x_size 0) and FINISH,
    ALU_INSN_CYCLES: int = 0              # on top of INSN_ISSUE_CYCLES
    NOP_INSN_CYCLES: int = 0
    FINISH_INSN_CYCLES: int = 0
    PAD_ELEM_CYCLES: int = 1              # cycles per padding element a LOAD writes on chip
    MEM_LATENCY_CYCLES: int = 0           # DRAM latency: paid once per DMA row (read or write
    #                                       response) and once by the instruction fetch
    FETCH_CYCLES: int = 0                 # from start to the first instruction in every module
    TOKEN_CYCLES: int = 0                 # from a token's push to the moment it can be popped
    POP_OFFSET_CYCLES: int = 0            # cycles of an instruction before it pops its tokens
    # ISA extensions present in this design (docs/isa.md, "Extensions"); they use bits that apache
    # VTA leaves zero, so enabling them never changes how an apache stream decodes or runs
    EXT_CLIP: bool = True
    EXT_PAD_MIN: bool = True
    # apache instructions the design implements (false: the design lacks it; docs/isa.md)
    ISA_ACC_8BIT_LOAD: bool = True
    ISA_ALU_MUL: bool = True
    # the hazard contract (docs/isa.md, "The hazard contract"): inside one GEMM / ALU instruction,
    # two micro-ops that write one accumulator row must be at least this many micro-ops apart
    # (1: no constraint). The Pynq HLS design needs 3 and 3 (measured on its RTL, tests/test_hazard.py)
    ACC_DEP_DISTANCE_GEMM: int = 1
    ACC_DEP_DISTANCE_ALU: int = 1

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], name: str = "custom") -> "VTAConfig":
        """Build and validate a configuration from a JSON-like mapping.

        ``LOG_BLOCK`` sets both ``LOG_BLOCK_IN`` and ``LOG_BLOCK_OUT`` unless they are given.
        Unknown keys are rejected so that typos do not pass silently.
        """
        data = dict(data)
        known = {f.name for f in fields(cls)} - {"name"}
        if "LOG_BLOCK" in data:
            block = data.pop("LOG_BLOCK")
            if isinstance(block, bool) or not isinstance(block, int):
                raise ConfigError(f"config {name!r}: LOG_BLOCK must be an integer, got {block!r}")
            data.setdefault("LOG_BLOCK_IN", block)
            data.setdefault("LOG_BLOCK_OUT", block)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"config {name!r}: unknown key(s) {unknown}; known keys are "
                              f"{sorted(known | {'LOG_BLOCK'})}")
        for key in _LOG_KEYS + _TIMING_KEYS + _HAZARD_KEYS:
            if key in data and (isinstance(data[key], bool) or not isinstance(data[key], int)):
                raise ConfigError(f"config {name!r}: {key} must be an integer, got {data[key]!r}")
        for key in _EXTENSION_KEYS:
            if key in data and not isinstance(data[key], bool):
                raise ConfigError(f"config {name!r}: {key} must be true or false, got {data[key]!r}")
        return cls(name=name, **data)

    @classmethod
    def from_json(cls, path: Union[str, Path]) -> "VTAConfig":
        """Read a configuration file; its stem becomes the configuration name."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path}: no such file; give the path of a JSON "
                              f"configuration or a preset name ({', '.join(available_configs())})")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"config file {path}: not valid JSON ({err})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path}: expected a JSON object of keys")
        return cls.from_dict(data, name=path.stem)

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        def fail(msg: str) -> None:
            raise ConfigError(f"config {self.name!r}: {msg}")

        for key in _LOG_KEYS + _TIMING_KEYS + _HAZARD_KEYS:
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int):
                fail(f"{key} must be an integer, got {value!r}")
            if value < 0:
                fail(f"{key} must be non-negative, got {value}")
        for key in _EXTENSION_KEYS:
            if not isinstance(getattr(self, key), bool):
                fail(f"{key} must be true or false, got {getattr(self, key)!r}")
        for key in ("GEMM_CYCLES_PER_UOP", "ALU_CYCLES_PER_UOP_IMM", "ALU_CYCLES_PER_UOP_VEC",
                    "MEM_BYTES_PER_CYCLE", "CLOCK_MHZ") + _HAZARD_KEYS:
            if getattr(self, key) < 1:
                fail(f"{key} must be at least 1, got {getattr(self, key)}")
        for kind in DMA_KINDS:
            # MEM_BYTES_PER_CYCLE is the bus: no memory type may be faster (0: at the bus rate;
            # the candidates' static estimate moves every byte at the bus rate)
            if getattr(self, f"{kind}_BYTES_PER_CYCLE") > self.MEM_BYTES_PER_CYCLE:
                fail(f"{kind}_BYTES_PER_CYCLE={getattr(self, f'{kind}_BYTES_PER_CYCLE')} exceeds the "
                     f"bus, MEM_BYTES_PER_CYCLE={self.MEM_BYTES_PER_CYCLE}")
        if (self.LOG_INP_WIDTH, self.LOG_WGT_WIDTH, self.LOG_ACC_WIDTH) != (3, 3, 5):
            fail("LOG_INP_WIDTH/LOG_WGT_WIDTH/LOG_ACC_WIDTH must be 3/3/5 (int8 inputs and weights, "
                 f"int32 accumulators) for the templates, got {self.LOG_INP_WIDTH}/"
                 f"{self.LOG_WGT_WIDTH}/{self.LOG_ACC_WIDTH}")
        for key, depth_key in (("LOG_INP_BUFF_SIZE", "log_inp_depth"),
                               ("LOG_WGT_BUFF_SIZE", "log_wgt_depth"),
                               ("LOG_ACC_BUFF_SIZE", "log_acc_depth"),
                               ("LOG_UOP_BUFF_SIZE", "log_uop_depth")):
            log_depth = getattr(self, depth_key)
            if log_depth < 1:
                fail(f"{key}={getattr(self, key)} leaves fewer than two entries in the buffer")
            if log_depth > MEMOP_SRAM_ADDR_BITS:
                fail(f"{key}={getattr(self, key)} gives a buffer of {1 << log_depth} entries, but the "
                     f"{MEMOP_SRAM_ADDR_BITS}-bit MEM.sram_base field of LOAD/STORE addresses only "
                     f"{MAX_SRAM_ENTRIES}; reduce {key} to at most "
                     f"{getattr(self, key) - (log_depth - MEMOP_SRAM_ADDR_BITS)}")
        for mem, elem_bytes in (("INP", self.inp_elem_bytes), ("WGT", self.wgt_elem_bytes),
                                ("ACC", self.acc_elem_bytes)):
            if elem_bytes > PAGE_BYTES:
                fail(f"{mem} element of {elem_bytes} bytes exceeds the {PAGE_BYTES}-byte DRAM page")
        try:
            self.layouts
        except LayoutOverflowError as err:
            fail(f"instruction field overflow: {err}")

    # ------------------------------------------------------------------ extensions
    def missing_extension(self, key: str, insn_text: str) -> str:
        """The error message for instruction ``insn_text`` that needs extension ``key``.

        Callers raise it when ``getattr(self, key)`` is false; the message names the extension,
        the instruction and the configuration key that enables it.
        """
        what = "the ISA extension" if key.startswith("EXT_") else "the instruction"
        return (f"{insn_text} uses {what} {EXTENSIONS[key]}, which configuration "
                f"{self.name!r} does not have; enable it with \"{key}\": true in the configuration "
                f"(e.g. the 'default' preset), or do not use it")

    # ------------------------------------------------------------------ element widths (bits)
    @property
    def INP_WIDTH(self) -> int:
        return 1 << self.LOG_INP_WIDTH

    @property
    def WGT_WIDTH(self) -> int:
        return 1 << self.LOG_WGT_WIDTH

    @property
    def ACC_WIDTH(self) -> int:
        return 1 << self.LOG_ACC_WIDTH

    @property
    def LOG_OUT_WIDTH(self) -> int:
        return self.LOG_INP_WIDTH

    @property
    def OUT_WIDTH(self) -> int:
        return 1 << self.LOG_OUT_WIDTH

    # ------------------------------------------------------------------ GEMM core shape
    @property
    def BATCH(self) -> int:
        return 1 << self.LOG_BATCH

    @property
    def BLOCK_IN(self) -> int:
        return 1 << self.LOG_BLOCK_IN

    @property
    def BLOCK_OUT(self) -> int:
        return 1 << self.LOG_BLOCK_OUT

    # ------------------------------------------------------------------ buffer sizes (bytes)
    @property
    def UOP_BUFF_SIZE(self) -> int:
        return 1 << self.LOG_UOP_BUFF_SIZE

    @property
    def INP_BUFF_SIZE(self) -> int:
        return 1 << self.LOG_INP_BUFF_SIZE

    @property
    def WGT_BUFF_SIZE(self) -> int:
        return 1 << self.LOG_WGT_BUFF_SIZE

    @property
    def ACC_BUFF_SIZE(self) -> int:
        return 1 << self.LOG_ACC_BUFF_SIZE

    @property
    def LOG_OUT_BUFF_SIZE(self) -> int:
        return self.LOG_ACC_BUFF_SIZE + self.LOG_OUT_WIDTH - self.LOG_ACC_WIDTH

    @property
    def OUT_BUFF_SIZE(self) -> int:
        return 1 << self.LOG_OUT_BUFF_SIZE

    # ------------------------------------------------------------------ matrix (element) widths
    @property
    def INP_MATRIX_WIDTH(self) -> int:
        """Bits of one input element: BATCH x BLOCK_IN int8 lanes."""
        return self.INP_WIDTH * self.BATCH * self.BLOCK_IN

    @property
    def WGT_MATRIX_WIDTH(self) -> int:
        return self.WGT_WIDTH * self.BLOCK_OUT * self.BLOCK_IN

    @property
    def ACC_MATRIX_WIDTH(self) -> int:
        return self.ACC_WIDTH * self.BATCH * self.BLOCK_OUT

    @property
    def OUT_MATRIX_WIDTH(self) -> int:
        return self.OUT_WIDTH * self.BATCH * self.BLOCK_OUT

    @property
    def BUS_WIDTH(self) -> int:
        return 1 << self.LOG_BUS_WIDTH

    @property
    def INP_MAT_AXI_RATIO(self) -> int:
        return self.INP_MATRIX_WIDTH // self.BUS_WIDTH

    @property
    def WGT_MAT_AXI_RATIO(self) -> int:
        return self.WGT_MATRIX_WIDTH // self.BUS_WIDTH

    @property
    def ACC_MAT_AXI_RATIO(self) -> int:
        return self.ACC_MATRIX_WIDTH // self.BUS_WIDTH

    @property
    def OUT_MAT_AXI_RATIO(self) -> int:
        return self.OUT_MATRIX_WIDTH // self.BUS_WIDTH

    # ------------------------------------------------------------------ element bytes
    INS_ELEM_BYTES = INSN_BITS // 8
    UOP_ELEM_BYTES = UOP_BITS // 8

    @property
    def inp_elem_bytes(self) -> int:
        return self.INP_MATRIX_WIDTH // 8

    @property
    def wgt_elem_bytes(self) -> int:
        return self.WGT_MATRIX_WIDTH // 8

    @property
    def acc_elem_bytes(self) -> int:
        return self.ACC_MATRIX_WIDTH // 8

    @property
    def out_elem_bytes(self) -> int:
        return self.OUT_MATRIX_WIDTH // 8

    # ------------------------------------------------------------------ buffer depths (entries)
    @property
    def log_uop_depth(self) -> int:
        return self.LOG_UOP_BUFF_SIZE - LOG_UOP_BITS + 3

    @property
    def log_inp_depth(self) -> int:
        return self.LOG_INP_BUFF_SIZE - self.LOG_BATCH - self.LOG_BLOCK_IN - self.LOG_INP_WIDTH + 3

    @property
    def log_wgt_depth(self) -> int:
        return self.LOG_WGT_BUFF_SIZE - self.LOG_BLOCK_OUT - self.LOG_BLOCK_IN - self.LOG_WGT_WIDTH + 3

    @property
    def log_acc_depth(self) -> int:
        return self.LOG_ACC_BUFF_SIZE - self.LOG_BATCH - self.LOG_BLOCK_OUT - self.LOG_ACC_WIDTH + 3

    @property
    def uop_depth(self) -> int:
        return 1 << self.log_uop_depth

    @property
    def inp_depth(self) -> int:
        return 1 << self.log_inp_depth

    @property
    def wgt_depth(self) -> int:
        return 1 << self.log_wgt_depth

    @property
    def acc_depth(self) -> int:
        return 1 << self.log_acc_depth

    # ------------------------------------------------------------------ names, banking, layouts
    @property
    def bitstream(self) -> str:
        """Bitstream name of ``pkg_config.py``, ``BxIN[xOUT]_i8w8a32_uop_inp_wgt_acc``."""
        block = (f"{self.BLOCK_IN}" if self.BLOCK_IN == self.BLOCK_OUT
                 else f"{self.BLOCK_IN}x{self.BLOCK_OUT}")
        return (f"{self.BATCH}x{block}_i{self.INP_WIDTH}w{self.WGT_WIDTH}a{self.ACC_WIDTH}_"
                f"{self.LOG_UOP_BUFF_SIZE}_{self.LOG_INP_BUFF_SIZE}_{self.LOG_WGT_BUFF_SIZE}_"
                f"{self.LOG_ACC_BUFF_SIZE}")

    @property
    def MODEL(self) -> str:
        return f"{self.TARGET}_{self.bitstream}"

    def sram_banking(self, memory: str) -> Dict[str, int]:
        """SRAM organisation of ``memory`` in {"inp", "wgt", "out"} as ``pkg_config.py`` derives it."""
        bus = {"inp": self.INP_MATRIX_WIDTH, "wgt": self.WGT_MATRIX_WIDTH,
               "out": self.OUT_MATRIX_WIDTH}[memory]
        size = {"inp": self.INP_BUFF_SIZE, "wgt": self.WGT_BUFF_SIZE,
                "out": self.OUT_BUFF_SIZE}[memory]
        width = min(bus, MAX_BANK_BITS)
        return {"bus_width": bus, "banks": math.ceil(bus / MAX_BANK_BITS), "width": width,
                "depth": size * 8 // bus, "axi_ratio": width // self.BUS_WIDTH}

    @cached_property
    def layouts(self) -> Dict[str, Layout]:
        """Bit layouts of MEM, GEMM, ALU instructions and the UOP (see :mod:`vta_ext.layout`)."""
        return instruction_layouts(self.log_uop_depth, self.log_inp_depth, self.log_wgt_depth,
                                   self.log_acc_depth)

    @cached_property
    def _elem_bytes_table(self) -> Dict[int, int]:
        return {MemType.UOP: self.UOP_ELEM_BYTES, MemType.WGT: self.wgt_elem_bytes,
                MemType.INP: self.inp_elem_bytes, MemType.ACC: self.acc_elem_bytes,
                MemType.OUT: self.out_elem_bytes,
                MemType.ACC_8BIT: self.acc_elem_bytes * self.INP_WIDTH // self.ACC_WIDTH}

    def elem_bytes(self, memory_type: int) -> int:
        """DRAM bytes of one element of memory id ``memory_type`` (:class:`~vta_ext.layout.MemType`)."""
        try:
            return self._elem_bytes_table[memory_type]
        except KeyError:
            raise ConfigError(f"unknown memory type {memory_type}") from None

    def bytes_per_cycle(self, kind: str) -> int:
        """The cycle model's DMA bandwidth of memory kind ``kind`` (one of :data:`DMA_KINDS`):
        ``<kind>_BYTES_PER_CYCLE``, or the bus rate ``MEM_BYTES_PER_CYCLE`` where that is 0."""
        return getattr(self, f"{kind}_BYTES_PER_CYCLE") or self.MEM_BYTES_PER_CYCLE

    def to_dict(self) -> Dict[str, Any]:
        """The JSON keys of this configuration (without the name)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "name"}

    def __repr__(self) -> str:
        return (f"VTAConfig({self.name!r}: {self.BATCH}x{self.BLOCK_IN}x{self.BLOCK_OUT}, "
                f"inp {self.INP_BUFF_SIZE // 1024} KiB, wgt {self.WGT_BUFF_SIZE // 1024} KiB, "
                f"acc {self.ACC_BUFF_SIZE // 1024} KiB, uop {self.UOP_BUFF_SIZE // 1024} KiB)")


def available_configs() -> list:
    """Names of the configuration presets shipped in ``vta_ext/configs``."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def load_config(name_or_path: Union[str, Path, VTAConfig] = "default") -> VTAConfig:
    """Load a preset by name (``"default"``) or a JSON file by path; a config passes through."""
    if isinstance(name_or_path, VTAConfig):
        return name_or_path
    path = Path(name_or_path)
    if path.suffix != ".json":
        path = CONFIG_DIR / f"{name_or_path}.json"
        if not path.exists():
            raise ConfigError(f"no configuration preset named {name_or_path!r}; "
                              f"available: {available_configs()} (or give the path of a .json "
                              "configuration file)")
    return VTAConfig.from_json(path)

"""Devices: run VTA programs through the original driver C ABI.

The original VTA runtime talks to hardware through one C interface (``include/vta/driver.h`` of
apache tvm-vta): ``VTAMemAlloc``/``VTAMemFree``/``VTAMemGetPhyAddr`` for memory with a physical
address, ``VTAMemCopyFromHost``/``VTAMemCopyToHost``, ``VTAFlushCache``/``VTAInvalidateCache``,
and ``VTADeviceAlloc``/``VTADeviceRun``/``VTADeviceFree``. Its pynq, sim and tsim drivers
implement it. :func:`open_device` opens any shared library with that interface through ctypes (a
Pynq board's ``libvta.so``, the original functional simulator or the RTL of ``../shared/vta-hw``)
and :func:`run_on` makes the VTA calls of a Relax VM run there instead of on the built-in
simulator (the default, which needs nothing)::

    dev = vta_ext.open_device(vta_ext.device.vta_hw_library("rtl"), mem_latency=40)
    with vta_ext.run_on(dev):
        out = vm["main"](x)
    print([r.device_cycles for r in vta_ext.run_log()])

How a program runs on a device (:meth:`DeviceSimulator.run`, one call per instruction segment,
the signature of :meth:`vta_ext.sim.FunctionalSimulator.run`): the program's DRAM image is copied
into one ``VTAMemAlloc`` block (one per image size, reused), the segment's instructions are
*relocated* (every LOAD/STORE's ``dram_base``, in element units of its memory type, moves by the
distance between the image's and the block's physical addresses), ``VTADeviceRun`` executes them,
and the block is copied back into the image so that later segments and
:meth:`vta_ext.runtime.Program.read` see the results. The image itself keeps the original
instruction words.

What a device reports:

* **cycles** only if the library exports ``VTARtlLastCycles`` (the RTL: exact clock cycles of
  that model, from start to FINISH); ``None`` otherwise (fsim, a board's ``libvta``);
* **counters** (:class:`~vta_ext.sim.SimStats`): none of the libraries counts per memory type as
  the built-in simulator does, so the seven counters are *computed from the instruction words*
  by the rules of :mod:`vta_ext.sim.stats` (:func:`stream_stats`). They are what the fsim would
  count for the instructions up to FINISH, not a measurement.

Errors are :class:`DeviceError`, one line naming the library and the call; a device error never
falls back to the simulator.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import os
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from .config import VTAConfig
from .isa import AluOp, MemType, Opcode, unpack_fields
from .layout import HEADER, INSN_UNIT_BITS
from .sim.stats import SimStats

__all__ = ["open_device", "run_on", "Device", "DeviceError", "DeviceSimulator", "ProgramRun",
           "active_device", "vta_hw_library", "stream_stats"]

#: ``wait_cycles`` of ``VTADeviceRun`` by default: what TVM's generated code passes to the
#: original runtime (``VTASynchronize(cmd, 1 << 31)``); a board's driver polls that many times,
#: the RTL clocks at most that many cycles
DEFAULT_WAIT_CYCLES = 1 << 31

#: what a non-zero ``VTADeviceRun`` return means: positive codes are the RTL's (1 is also the
#: pynq driver's timeout), negative ones the original fsim's (as exported by vta-hw)
RUN_ERRORS = {
    1: "timeout: FINISH not reached within wait_cycles, or writes not drained",
    2: "deadlock: the device stopped changing without reaching FINISH",
    3: "out-of-range access: DMA or instructions outside every allocated block",
    4: "device error (null handle, no instructions, done register not 1, or a device left "
       "mid-program by an earlier failure)",
    -1: "the simulator's own check failed",
    -3: "null device handle",
    -4: "refused: an earlier run in this process failed, the simulator's global state is "
        "unreliable; use a fresh process",
}

#: the required symbols: name -> (restype, argtypes)
_REQUIRED = {
    "VTAMemAlloc": (ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int]),
    "VTAMemFree": (None, [ctypes.c_void_p]),
    "VTAMemGetPhyAddr": (ctypes.c_uint32, [ctypes.c_void_p]),
    "VTAMemCopyFromHost": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "VTAMemCopyToHost": (None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]),
    "VTAFlushCache": (None, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]),
    "VTAInvalidateCache": (None, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int]),
    "VTADeviceAlloc": (ctypes.c_void_p, []),
    "VTADeviceRun": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32,
                                    ctypes.c_uint32]),
    "VTADeviceFree": (None, [ctypes.c_void_p]),
}
#: the optional symbols (vta-hw's additions)
_OPTIONAL = {
    "VTAHwLastError": (ctypes.c_char_p, []),
    "VTARtlLastCycles": (ctypes.c_uint64, []),
    "VTARtlSetMemLatency": (None, [ctypes.c_uint32]),
    "VTARtlGetMemLatency": (ctypes.c_uint32, []),
    "VTARtlLastStats": (ctypes.c_int, [ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]),
    "VTAFsimProfilerStatus": (ctypes.c_int, [ctypes.POINTER(ctypes.c_int64)]),
    "VTAFsimProfilerClear": (None, []),
}


class DeviceError(RuntimeError):
    """A device library failed: one line naming the library, the call and what to do."""


# ---------------------------------------------------------------------- instruction words
def _words(config: VTAConfig, raw: np.ndarray) -> np.ndarray:
    """The ``(n, 2)`` little-endian 64-bit words of ``n`` instructions held in uint8 ``raw``."""
    per_insn = config.INS_ELEM_BYTES * 8 // INSN_UNIT_BITS
    return np.ascontiguousarray(raw).view("<u8").reshape(-1, per_insn)


def _memory_ops(config: VTAConfig, words: np.ndarray) -> Tuple[np.ndarray, Dict[str, np.ndarray]]:
    """Rows of the LOAD/STORE instructions of ``words`` and their MEM fields."""
    opcodes = unpack_fields(HEADER, words)["opcode"]
    rows = np.flatnonzero((opcodes == Opcode.LOAD) | (opcodes == Opcode.STORE))
    return rows, unpack_fields(config.layouts["MEM"], words[rows])


def relocate(config: VTAConfig, raw: np.ndarray, delta: int) -> np.ndarray:
    """The instruction words ``raw`` (uint8, whole instructions) with every LOAD/STORE moved by
    ``delta`` bytes of physical address (``dram_base`` is in elements of the memory type; NOPs,
    ``x_size`` 0, are left alone).

    Raises
    ------
    DeviceError
        If ``delta`` is not a whole number of elements, or a moved address does not fit the
        ``dram_base`` field.
    """
    words = _words(config, raw).copy()
    rows, mem = _memory_ops(config, words)
    field = config.layouts["MEM"]["dram_base"]
    unit = INSN_UNIT_BITS
    word = field.lsb // unit
    moved = np.zeros(rows.size, np.int64)
    for memory_type in np.unique(mem["memory_type"]).tolist():
        elem = config.elem_bytes(memory_type)
        if delta % elem:
            raise DeviceError(f"cannot relocate the program by {delta:#x} bytes: not a multiple of "
                              f"the {elem}-byte element of memory type {memory_type}")
        moved[mem["memory_type"] == memory_type] = delta // elem
    moved[mem["x_size"] == 0] = 0
    new = mem["dram_base"] + moved
    bad = np.flatnonzero((new < 0) | (new > field.mask))
    if bad.size:
        raise DeviceError(f"relocated dram_base {int(new[bad[0]])} of instruction "
                          f"#{int(rows[bad[0]])} does not fit the {field.width}-bit field: the "
                          "device block lies too high in physical memory")
    shift = np.uint64(field.lsb % unit)
    keep = ~(np.uint64(field.mask) << shift)
    words[rows, word] = (words[rows, word] & keep) | (new.astype(np.uint64) << shift)
    return words.view(np.uint8).reshape(-1)


def stream_stats(config: VTAConfig, raw: np.ndarray) -> SimStats:
    """The seven counters of :class:`~vta_ext.sim.SimStats` for the instruction words ``raw``
    (uint8, whole instructions) up to the first FINISH, by the rules of :mod:`vta_ext.sim.stats`:
    computed from the words, not measured (a device library has no such counters)."""
    words = _words(config, raw)
    opcodes = unpack_fields(HEADER, words)["opcode"]
    finish = np.flatnonzero(opcodes == Opcode.FINISH)
    if finish.size:
        words, opcodes = words[:finish[0] + 1], opcodes[:finish[0] + 1]
    stats = SimStats()
    rows, mem = _memory_ops(config, words)
    count = mem["x_size"] * mem["y_size"]
    is_load = opcodes[rows] == Opcode.LOAD
    by_type = {MemType.INP: "inp_load_nbytes", MemType.WGT: "wgt_load_nbytes",
               MemType.ACC: "acc_load_nbytes", MemType.ACC_8BIT: "acc_load_nbytes",
               MemType.UOP: "uop_load_nbytes"}
    for memory_type, name in by_type.items():
        # an ACC_8BIT load counts the full accumulator element (the fsim rule)
        elem = config.elem_bytes(MemType.ACC if memory_type == MemType.ACC_8BIT else memory_type)
        n = int(count[is_load & (mem["memory_type"] == memory_type)].sum()) * elem
        setattr(stats, name, getattr(stats, name) + n)
    stats.out_store_nbytes = int(count[~is_load].sum()) * config.elem_bytes(MemType.OUT)
    for opcode, name in ((Opcode.GEMM, "gemm_counter"), (Opcode.ALU, "alu_counter")):
        sel = np.flatnonzero(opcodes == opcode)
        if not sel.size:
            continue
        f = unpack_fields(config.layouts[opcode.name], words[sel])
        n = f["iter_out"] * f["iter_in"] * (f["uop_end"] - f["uop_bgn"])
        if opcode == Opcode.GEMM:
            n = n[f["reset_reg"] == 0]
        setattr(stats, name, int(n.sum()))
    return stats


def unsupported(config: VTAConfig, raw: np.ndarray, full_isa: bool) -> Optional[str]:
    """Why the instruction words ``raw`` cannot run on an original VTA, or None.

    No original VTA has this package's extensions (ALU ``CLIP``, LOAD ``pad_min``); the HLS
    hardware (a Pynq board's bitstream, the RTL) also lacks ``ACC_8BIT`` loads and ALU ``MUL``,
    which it would skip silently: they are refused unless ``full_isa`` (the original fsim)."""
    words = _words(config, raw)
    opcodes = unpack_fields(HEADER, words)["opcode"]
    rows, mem = _memory_ops(config, words)
    alu_rows = np.flatnonzero(opcodes == Opcode.ALU)
    alu = unpack_fields(config.layouts["ALU"], words[alu_rows])["alu_opcode"]
    found = [(int(rows[mem["pad_min"] != 0][0]), "LOAD with pad_min (extension EXT_PAD_MIN)")
             if (mem["pad_min"] != 0).any() else None,
             (int(alu_rows[alu == AluOp.CLIP][0]), "ALU CLIP (extension EXT_CLIP)")
             if (alu == AluOp.CLIP).any() else None]
    if not full_isa:
        acc8 = (mem["memory_type"] == MemType.ACC_8BIT) & (opcodes[rows] == Opcode.LOAD)
        found += [(int(rows[acc8][0]), "LOAD ACC_8BIT (ISA_ACC_8BIT_LOAD), which the HLS "
                   "hardware skips") if acc8.any() else None,
                  (int(alu_rows[alu == AluOp.MUL][0]), "ALU MUL (ISA_ALU_MUL), which the HLS "
                   "hardware skips") if (alu == AluOp.MUL).any() else None]
    found = [f for f in found if f is not None]
    if not found:
        return None
    index, what = min(found)
    return f"instruction #{index} is an {what}"


# ---------------------------------------------------------------------- the library
@dataclass
class ProgramRun:
    """What :meth:`Device.run_program` measured.

    Attributes
    ----------
    cycles : int or None
        The device's clock cycles summed over the segments (``VTARtlLastCycles``), None if the
        library does not report cycles.
    segment_cycles : list of int
        Cycles per segment (empty if not reported).
    stats : SimStats
        The counters computed from the instruction words (:func:`stream_stats`).
    seconds : float
        Wall time of the device calls.
    """

    cycles: Optional[int]
    segment_cycles: List[int]
    stats: SimStats
    seconds: float


class _Block:
    """One ``VTAMemAlloc`` block: host pointer, physical address, size."""

    def __init__(self, virt: int, phys: int, nbytes: int) -> None:
        self.virt, self.phys, self.nbytes = virt, phys, nbytes


class Device:
    """A library with the VTA driver ABI, opened through ctypes (see :func:`open_device`).

    Parameters
    ----------
    path : str or Path
        The shared library.
    mem_latency : int, optional
        Memory latency in cycles for the runs of this device (``VTARtlSetMemLatency``, set before
        each run because it is process-wide; None: the library's default, 0); only for libraries
        that export it.
    timeout : float, optional
        Seconds a ``VTADeviceRun`` may take. The call then runs in a worker thread and a run that
        exceeds it raises :class:`DeviceError`; the thread cannot be stopped (the fsim loops
        forever on unsatisfiable dependency tokens, a board waits for its done bit), so it keeps
        running and the device is refused afterwards: open a new one (for the fsim, use a new
        process).
    wait_cycles : int, optional
        The ``wait_cycles`` argument of ``VTADeviceRun`` (default :data:`DEFAULT_WAIT_CYCLES`):
        the RTL stops after that many clock cycles (return 1), a board's driver polls that many
        times; the fsim ignores it.

    Raises
    ------
    DeviceError
        If the library cannot be loaded, lacks a required symbol, or ``mem_latency`` is given for
        a library without ``VTARtlSetMemLatency``.
    """

    def __init__(self, path: Union[str, Path], mem_latency: Optional[int] = None,
                 timeout: Optional[float] = None, wait_cycles: Optional[int] = None) -> None:
        self.path = Path(path)
        self.name = self.path.name
        if not self.path.is_file():
            raise DeviceError(f"{self.path}: no such library; give the path of a shared library "
                              "with the VTA driver ABI (e.g. vta_ext.device.vta_hw_library('rtl'))")
        try:
            lib = ctypes.CDLL(str(self.path.resolve()))
        except OSError as err:
            raise DeviceError(f"{self.path}: cannot load the library ({err})") from None
        self._fn = {}
        for name, (restype, argtypes) in _REQUIRED.items():
            try:
                fn = getattr(lib, name)
            except AttributeError:
                raise DeviceError(f"{self.path}: not a VTA driver library: it has no symbol "
                                  f"{name} (the driver ABI of include/vta/driver.h needs "
                                  f"{', '.join(_REQUIRED)})") from None
            fn.restype, fn.argtypes = restype, argtypes
            self._fn[name] = fn
        for name, (restype, argtypes) in _OPTIONAL.items():
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.restype, fn.argtypes = restype, argtypes
                self._fn[name] = fn
        self._lib = lib
        if mem_latency is not None:
            if "VTARtlSetMemLatency" not in self._fn:
                raise DeviceError(f"{self.path}: mem_latency={mem_latency} given, but the library "
                                  "has no VTARtlSetMemLatency (only the RTL of vta-hw models a "
                                  "memory latency); drop mem_latency for this device")
            if not 0 <= int(mem_latency) < 1 << 32:
                raise DeviceError(f"mem_latency {mem_latency}: give cycles in 0..2**32-1")
        self.mem_latency = None if mem_latency is None else int(mem_latency)
        if timeout is not None and timeout <= 0:
            raise DeviceError(f"timeout {timeout}: give seconds > 0, or None for no timeout")
        self.timeout = timeout
        self.wait_cycles = DEFAULT_WAIT_CYCLES if wait_cycles is None else int(wait_cycles)
        if not 0 <= self.wait_cycles < 1 << 32:
            raise DeviceError(f"wait_cycles {wait_cycles}: give a count in 0..2**32-1")
        #: serialises the runs on this device (each writes the device's SRAMs and its blocks)
        self.lock = threading.RLock()
        self._handle: Optional[int] = None
        self._blocks: Dict[int, _Block] = {}
        self._simulators: Dict[str, "DeviceSimulator"] = {}
        self._broken: Optional[str] = None

    # -------------------------------------------------------------- properties
    @property
    def full_isa(self) -> bool:
        """Whether the library runs ``ACC_8BIT`` loads and ALU ``MUL`` (the original fsim, known
        by its ``VTAFsimProfilerStatus``); the HLS hardware (a board, the RTL) does not."""
        return "VTAFsimProfilerStatus" in self._fn

    @property
    def reports_cycles(self) -> bool:
        """Whether the library reports clock cycles (``VTARtlLastCycles``)."""
        return "VTARtlLastCycles" in self._fn

    def __repr__(self) -> str:
        what = ["cycles" if self.reports_cycles else "no cycles"]
        if self.mem_latency is not None:
            what.append(f"mem_latency={self.mem_latency}")
        if self.timeout is not None:
            what.append(f"timeout={self.timeout}s")
        if self._broken:
            what.append("unusable")
        return f"Device({str(self.path)!r}, {', '.join(what)})"

    # -------------------------------------------------------------- memory
    def _last_error(self) -> str:
        fn = self._fn.get("VTAHwLastError")
        text = fn() if fn is not None else None
        return text.decode(errors="replace").strip() if text else ""

    def block(self, nbytes: int) -> _Block:
        """A ``VTAMemAlloc`` block of ``nbytes`` (one per size, allocated once and reused)."""
        block = self._blocks.get(nbytes)
        if block is None:
            virt = self._fn["VTAMemAlloc"](nbytes, 0)
            if not virt:
                raise DeviceError(f"{self.path}: VTAMemAlloc({nbytes}) returned NULL "
                                  f"({self._last_error() or 'out of device memory'})")
            phys = int(self._fn["VTAMemGetPhyAddr"](virt))
            block = self._blocks[nbytes] = _Block(virt, phys, nbytes)
        return block

    def _device(self) -> int:
        if self._broken:
            raise DeviceError(f"{self.path}: device refused: {self._broken}")
        if self._handle is None:
            handle = self._fn["VTADeviceAlloc"]()
            if not handle:
                raise DeviceError(f"{self.path}: VTADeviceAlloc returned NULL "
                                  f"({self._last_error() or 'no reason given'})")
            self._handle = handle
        return self._handle

    def _free_device(self) -> None:
        if self._handle is not None:
            self._fn["VTADeviceFree"](self._handle)
            self._handle = None

    def close(self) -> None:
        """Free the device handle and the memory blocks (not after a timeout: the worker thread
        may still use them)."""
        with self.lock:
            if self._broken:
                return
            self._free_device()
            for block in self._blocks.values():
                self._fn["VTAMemFree"](block.virt)
            self._blocks.clear()

    # -------------------------------------------------------------- running
    def _call_run(self, handle: int, insn_phys: int, count: int) -> Tuple[int, str, Optional[int]]:
        """``VTADeviceRun`` and, in the same thread (both are per thread), the error text and
        the cycles."""
        if "VTARtlSetMemLatency" in self._fn:   # process-wide: set for every run
            self._fn["VTARtlSetMemLatency"](self.mem_latency or 0)
        rc = int(self._fn["VTADeviceRun"](handle, insn_phys, count, self.wait_cycles))
        cycles = self._fn["VTARtlLastCycles"]() if self.reports_cycles else None
        return rc, self._last_error(), None if cycles is None else int(cycles)

    def run_words(self, block: _Block, insn_offset: int, count: int) -> Optional[int]:
        """Run ``count`` instructions already in ``block`` at byte ``insn_offset``; returns the
        cycles (None if not reported).

        Raises
        ------
        DeviceError
            On a non-zero return (the device is re-allocated for the next run) or a timeout (the
            device is refused afterwards).
        """
        handle = self._device()
        insn_phys = block.phys + insn_offset
        call = f"VTADeviceRun(insn_phys={insn_phys:#x}, insn_count={count})"
        if self.timeout is None:
            rc, text, cycles = self._call_run(handle, insn_phys, count)
        else:
            box: list = []
            worker = threading.Thread(target=lambda: box.append(
                self._call_run(handle, insn_phys, count)), daemon=True,
                name=f"vta-device-{self.name}")
            worker.start()
            worker.join(self.timeout)
            if worker.is_alive():
                self._broken = (f"a VTADeviceRun exceeded the timeout of {self.timeout} s and "
                                "its thread is still running; open a new device (for the fsim, "
                                "in a new process: its state is global)")
                raise DeviceError(f"{self.path}: {call} did not return within {self.timeout} s "
                                  f"for a program of {count} instructions (a deadlock on a "
                                  "library that loops forever, or a long program: raise "
                                  "timeout=); this device is refused from now on")
            if not box:
                raise DeviceError(f"{self.path}: {call} raised in its worker thread")
            rc, text, cycles = box[0]
        if rc != 0:
            self._free_device()  # a device left mid-program: the next run allocates a new one
            meaning = RUN_ERRORS.get(rc, "unknown return code")
            detail = f"{meaning}: {text}" if text else meaning
            raise DeviceError(f"{self.path}: VTADeviceRun returned {rc} ({detail}) for a "
                              f"program of {count} instructions")
        return cycles

    def simulator(self, config: VTAConfig) -> "DeviceSimulator":
        """The adapter with the run signature of :class:`~vta_ext.sim.FunctionalSimulator`
        that runs programs of ``config`` on this device (one per configuration value)."""
        key = repr(sorted(config.to_dict().items()))   # the configuration's value
        sim = self._simulators.get(key)
        if sim is None:
            sim = self._simulators[key] = DeviceSimulator(self, config)
        return sim

    def run_program(self, program) -> ProgramRun:
        """Run every segment of a :class:`vta_ext.runtime.Program` on this device; the results
        are in the program's DRAM image (read them with ``program.read``)."""
        sim = self.simulator(program.config)
        with self.lock:
            sim.take_cycles()
            start = time.perf_counter()
            stats = program.run(sim)
            seconds = time.perf_counter() - start
            segment_cycles = sim.take_cycles()
        cycles = sum(segment_cycles) if self.reports_cycles else None
        return ProgramRun(cycles, segment_cycles if self.reports_cycles else [], stats, seconds)


class DeviceSimulator:
    """Runs instruction segments of one configuration on a :class:`Device`, with the signature
    of :meth:`vta_ext.sim.FunctionalSimulator.run` (what :meth:`Program.run
    <vta_ext.runtime.Program.run>` calls).

    ``config`` must describe the device's hardware: nothing in the driver ABI can check it."""

    def __init__(self, device: Device, config: VTAConfig) -> None:
        self.device = device
        self.config = config
        self._cycles: List[int] = []

    def take_cycles(self) -> List[int]:
        """The cycles of the segments run since the last call (empty if not reported)."""
        cycles, self._cycles = self._cycles, []
        return cycles

    def run(self, dram: np.ndarray, dram_base: int, insn_phys: int, insn_count: int) -> SimStats:
        """Execute ``insn_count`` instructions at physical address ``insn_phys`` of the image
        ``dram`` (which starts at physical address ``dram_base``) on the device; the device's
        DRAM is copied back into ``dram``.

        Returns
        -------
        SimStats
            The counters computed from the instruction words (:func:`stream_stats`).
        """
        if not isinstance(dram, np.ndarray) or dram.dtype != np.uint8 or dram.ndim != 1 \
                or not dram.flags.c_contiguous:
            raise TypeError("dram must be a contiguous 1-D numpy uint8 array")
        dev, cfg = self.device, self.config
        start = int(insn_phys) - int(dram_base)
        end = start + cfg.INS_ELEM_BYTES * int(insn_count)
        if insn_count <= 0 or start < 0 or end > dram.size:
            raise DeviceError(f"{dev.path}: instruction segment [{insn_phys:#x}, +{insn_count}) "
                              f"lies outside the DRAM image [{dram_base:#x}, "
                              f"{dram_base + dram.size:#x})")
        original = dram[start:end].copy()
        why = unsupported(cfg, original, dev.full_isa)
        if why is not None:
            raise DeviceError(f"{dev.path}: cannot run this program ({why}; configuration "
                              f"{cfg.name!r}): build for the original VTA, "
                              "vta_ext.vta_target('pynq'), whose operators never use it")
        with dev.lock:
            block = dev.block(dram.size)
            words = relocate(cfg, original, block.phys - int(dram_base))
            fn = dev._fn
            fn["VTAMemCopyFromHost"](block.virt, dram.ctypes.data, dram.size)
            fn["VTAMemCopyFromHost"](block.virt + start, words.ctypes.data, words.size)
            fn["VTAFlushCache"](block.virt, block.phys, dram.size)
            cycles = dev.run_words(block, start, int(insn_count))
            fn["VTAInvalidateCache"](block.virt, block.phys, dram.size)
            fn["VTAMemCopyToHost"](dram.ctypes.data, block.virt, dram.size)
            dram[start:end] = original
            if cycles is not None:
                self._cycles.append(cycles)
        return stream_stats(cfg, original)

    def __repr__(self) -> str:
        return f"DeviceSimulator({self.device.name}, {self.config.name})"


def open_device(path: Union[str, Path], mem_latency: Optional[int] = None, *,
                timeout: Optional[float] = None, wait_cycles: Optional[int] = None) -> Device:
    """Open a shared library with the VTA driver ABI (see :class:`Device` for the parameters).

    Examples
    --------
    >>> dev = open_device("/home/xilinx/tvm-vta/build/libvta.so")        # doctest: +SKIP
    >>> dev = open_device(vta_hw_library("rtl"), mem_latency=40)           # doctest: +SKIP
    """
    return Device(path, mem_latency=mem_latency, timeout=timeout, wait_cycles=wait_cycles)


# ---------------------------------------------------------------------- the active device
_ACTIVE: contextvars.ContextVar[Optional[Device]] = contextvars.ContextVar("vta_ext_device",
                                                                           default=None)


def active_device() -> Optional[Device]:
    """The device of the innermost :func:`run_on`, or None (the built-in simulator)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def run_on(device: Device) -> Iterator[Device]:
    """Run the VTA calls of the Relax VMs called in this block (this thread or task) on
    ``device`` instead of the built-in simulator; :func:`vta_ext.run_log` entries then carry the
    device's name and cycles (``OpRun.device``, ``OpRun.device_cycles``)."""
    if not isinstance(device, Device):
        raise TypeError(f"run_on takes a Device (vta_ext.open_device(path)), got "
                        f"{type(device).__name__}")
    token = _ACTIVE.set(device)
    try:
        yield device
    finally:
        _ACTIVE.reset(token)


# ---------------------------------------------------------------------- ../shared/vta-hw
_BUILT: Dict[str, Path] = {}
_BUILD_LOCK = threading.Lock()


def vta_hw_library(kind: str) -> Path:
    """The path of vta-hw's ``libvta_fsim.so`` (``kind="fsim"``) or ``libvta_rtl.so``
    (``"rtl"``), built by its ``build.sh`` once per process (0.3 s when up to date).

    The vta-hw folder is ``$VTA_HW_DIR`` or ``shared/vta-hw`` beside the repository root; the
    libraries go to ``$VTA_HW_BUILD`` or ``~/.cache/vta-hw``.

    Raises
    ------
    DeviceError
        If the folder or its ``build.sh`` is missing, or the build fails (the message has the
        end of its output).
    """
    if kind not in ("fsim", "rtl"):
        raise DeviceError(f"vta_hw_library({kind!r}): kind must be 'fsim' or 'rtl'")
    env = os.environ.get("VTA_HW_DIR")
    folder = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "vta-hw"
    script = folder / "build.sh"
    if not script.is_file():
        raise DeviceError(f"vta-hw not found: no {script} (set VTA_HW_DIR to the vta-hw folder "
                          "that holds build.sh)")
    out = Path(os.environ.get("VTA_HW_BUILD") or Path.home() / ".cache" / "vta-hw")
    with _BUILD_LOCK:
        if kind not in _BUILT:
            proc = subprocess.run(["bash", str(script), str(out), kind], capture_output=True,
                                  text=True)
            if proc.returncode != 0:
                tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
                raise DeviceError(f"{script} {out} {kind} failed with exit code "
                                  f"{proc.returncode}: {tail} (see {out}/build-{kind}.log)")
            library = out / f"libvta_{kind}.so"
            if not library.is_file():
                raise DeviceError(f"{script} succeeded but wrote no {library}")
            _BUILT[kind] = library
    return _BUILT[kind]

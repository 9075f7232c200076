"""Strategies: who writes the VTA code of a matched operator.

A :class:`Strategy` is a named way of turning matched Relax operators into VTA programs (``stock``:
the fixed templates of the original VTA stack; ``csp-strict`` / ``csp-relaxed``: the embeddings of
:mod:`tvm_csp_embed`). Its per-operator part is an :class:`OpTemplate`, registered under the key
``(operator kind, strategy name)``:

* :meth:`OpTemplate.plan` looks at the matched operator (:class:`MatchedOp`) and a
  :class:`~vta_ext.config.VTAConfig` and returns an :class:`OpPlan`: the workload, the packed layouts
  of inputs and output with the Relax code that packs and unpacks them, and the report text;
* :meth:`OpTemplate.build` compiles ``(config, workload, epilogue, knobs)`` into a program that the
  executor runs (it must be rebuildable from those values alone, in another process);
* :meth:`OpTemplate.knob_space` gives the :class:`KnobSpace` the tuner
  (:mod:`tvm_csp_embed.tune`) searches: the valid knob points, the pruned ones with the reason,
  and the ``tps`` / ``fallback`` points (empty for a template without tunable knobs).

Adding an operator to a strategy is one :func:`register_template` entry plus its own module; adding
a strategy is one :func:`register_strategy` call plus its templates. Both may name the implementing
object lazily as ``"package.module:attribute"``; a module that fails to import fails the build with
a :class:`~vta_ext.errors.VTABuildError` naming it (it is never taken for a refusal).

Only :class:`~vta_ext.errors.TemplateRefusal` keeps an operator on the CPU (see
:mod:`vta_ext.errors`). See ``docs/templates-api.md``.
"""
from __future__ import annotations

import collections.abc
import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import TemplateRefusal, VTABuildError

__all__ = ["MatchedOp", "OpPlan", "KnobSpace", "GridPoints", "PrunedPoints", "OpTemplate",
           "Strategy", "register_strategy", "register_template", "get_strategy", "get_template", "registered_strategies",
           "registered_templates", "default_strategy", "set_default_strategy",
           "register_plan_summary"]


@dataclass
class MatchedOp:
    """An operator found by the offload pass, before any strategy looked at it.

    Attributes
    ----------
    kind : str
        Operator kind (``"conv2d"``, ``"group_conv2d"``, ``"depthwise_conv2d"``, ``"dense"``,
        ``"max_pool2d"``, ``"avg_pool2d"``, ``"add"``; ``"batch_matmul"``, ``"conv1d"`` and
        ``"dilated_conv2d"`` have templates only under the CSP strategies).
    core : relax.Call
        The core call (``R.nn.conv2d``, ``R.matmul``, ...): its attributes and output shape.
    operands : list of relax.Expr
        The int8 operands in the operator's own layout (NCHW activations, OIHW weights, ...).
    bias : relax.Expr or None
        The int32 bias added before the requantisation tail, if any.
    epilogue : tuple of tuple
        The requantisation stages in order (``("bias",)``, ``("shr", s)``, ``("mulv",)``,
        ``("clip", lo, hi)``, ...; :mod:`vta_ext.templates.epilogue`).
    name : str
        The Relax variable bound to the core call (names the operator in reports and errors).
    multiplier : relax.Expr or None
        The int32 per-output-channel multiplier of a ``("mulv",)`` stage, in the bias's shape
        (a template packs it like the bias, after it).
    params : dict
        Constants of the core the matcher read off the graph (``"hswish"``: ``offset``, ``lo``,
        ``hi`` of ``x * clip(x + offset, lo, hi)``; ``"batch_matmul"``: ``transpose_b``, True when
        B is ``permute_dims(., [0, 2, 1])`` of the operand, which is then given as ``[B, M, K]``).
    input_layout : object or None
        The packed layout the first operand is already in, when it is the output of a previous
        VTA operator (set by the offload pass before planning); None when it comes from the host.
    consumers : tuple of str or None
        Who uses the output, set by the offload pass before planning
        (:mod:`vta_ext.offload.consumers`): ``"vta"`` (another matched operator takes it over)
        and/or ``"cpu"`` (a CPU operator or the function's result: the host unpacks it whatever
        its packed layout). None when not known (an operator planned outside the pass): a plan's
        host layout is then priced as if a VTA operator consumed the output.
    input_unpacked : bool
        The first operand is a matched operator's output that the host unpacks for a CPU user
        anyway (set by the offload pass): taking it in another layout costs only the packing.
    input_lanes : tuple
        Per operand, the int8 constants the padded channels of the packed tensor handed over for
        it hold (one per padded channel, in channel order), or None where not known (set by the
        offload pass before planning from the producer's :attr:`OpPlan.out_lanes`).
    write_lanes : tuple of int or None
        The constants the offload pass's pre-pass asks this operator to write into the padded
        channels of its packed output, because a consumer can fold its bias into them (a
        strategy's lane pairing, :func:`vta_ext.offload.consumers.register_lane_pairing`);
        None: nothing asked.
    """

    kind: str
    core: Any
    operands: List[Any]
    bias: Any = None
    epilogue: Tuple[tuple, ...] = ()
    name: str = ""
    multiplier: Any = None
    params: Dict[str, Any] = field(default_factory=dict)
    input_layout: Any = None
    consumers: Optional[Tuple[str, ...]] = None
    input_unpacked: bool = False
    input_lanes: Tuple[Optional[Tuple[int, ...]], ...] = ()
    write_lanes: Optional[Tuple[int, ...]] = None

    @property
    def shapes(self) -> str:
        """``"1x3x224x224, 64x3x7x7"``: the operand shapes, for messages."""
        return ", ".join("x".join(str(int(d)) for d in op.ty.shape) for op in self.operands)

    def __repr__(self) -> str:
        return f"MatchedOp({self.kind} {self.name!r}: {self.shapes}, epilogue {list(self.epilogue)})"


@dataclass
class OpPlan:
    """What a strategy makes of one matched operator (see :meth:`OpTemplate.plan`).

    Attributes
    ----------
    workload : object
        The template's workload (a frozen dataclass, already padded); ``dataclasses.asdict`` of it
        and :meth:`OpTemplate.workload_from_dict` must round-trip.
    inputs : callable
        ``inputs(packer) -> list of relax.Expr``: emits the packing of every operand and returns
        the packed arguments of the VTA call, in the order the compiled program takes them.
    out_layout : object
        The packed layout of the output: has ``.shape`` (packed shape) and ``unpack(packer, expr)``
        (Relax code back to the operator's own layout); equal layouts let consecutive VTA operators
        hand the packed tensor over (see :mod:`vta_ext.packing`).
    description : str
        Shapes and attributes in the operator's terms, e.g. ``"1x64x56x56 * 64x64x3x3 s1 p1"``.
    padding : str
        ``""`` or what the layout pads, e.g. ``"in channels 3->16"``.
    in_layout : object or None
        The packed layout of the activation input (the first operand), when the template states
        it: a strategy choosing between plans can tell which one takes over the previous VTA
        operator's output (:attr:`MatchedOp.input_layout`).
    out_lanes : tuple of int or None
        The int8 constants the padded channels of the packed output hold (one per padded
        channel), when the plan knows them; the offload pass hands them over with the output
        (:attr:`MatchedOp.input_lanes` of its consumers).
    """

    workload: Any
    inputs: Callable[[Any], list]
    out_layout: Any
    description: str
    padding: str = ""
    in_layout: Any = None
    out_lanes: Optional[Tuple[int, ...]] = None


Point = Dict[str, Any]


class GridPoints(collections.abc.Sequence):
    """Knob points of knob grids, as dicts built on access: a knob space can hold tens of
    thousands of points that a build or a task extraction never reads.

    Parameters
    ----------
    parts : sequence of (grid, indices)
        Grids in order, each with the flat indices of its points in enumeration order; a grid
        answers ``points(indices)`` (the knob dicts) and ``why(index)`` (a pruned point's reason).

    Compares equal to a tuple or list of the same items. Once iterated to the end, the items are
    kept (a tuner or a record check scans the points for membership again and again).
    """

    _CHUNK = 4096     # points built at a time while iterating

    def __init__(self, parts: Sequence[Tuple[Any, Sequence[int]]] = ()) -> None:
        self._parts = [(grid, idx) for grid, idx in parts if len(idx)]
        self._len = sum(len(idx) for _, idx in self._parts)
        self._all: Optional[tuple] = None

    def _items(self, grid: Any, indices: Sequence[int]) -> list:
        return grid.points(indices)

    def __len__(self) -> int:
        return self._len

    def _at(self, index: int):
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"point {index} out of range ({self._len} points)")
        if self._all is not None:
            return self._all[index]
        for grid, idx in self._parts:
            if index < len(idx):
                return self._items(grid, idx[index:index + 1])[0]
            index -= len(idx)
        raise AssertionError("unreachable")

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self._at(i) for i in range(*index.indices(self._len)))
        return self._at(int(index))

    def __iter__(self):
        if self._all is not None:
            yield from self._all
            return
        items = []
        for grid, idx in self._parts:
            for start in range(0, len(idx), self._CHUNK):
                chunk = self._items(grid, idx[start:start + self._CHUNK])
                items += chunk
                yield from chunk
        self._all = tuple(items)

    def __eq__(self, other) -> bool:
        if isinstance(other, (GridPoints, tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._len} points)"


class PrunedPoints(GridPoints):
    """The pruned points of knob grids as ``(point, reason)`` pairs, built on access (see
    :class:`GridPoints`; a reason is a formatted sentence)."""

    def _items(self, grid: Any, indices: Sequence[int]) -> list:
        return [(p, grid.why(i)) for p, i in zip(grid.points(indices), indices)]


@dataclass(frozen=True)
class KnobSpace:
    """The knob space of one operator instance (``config``, workload, epilogue) under a template.

    Points are plain dicts of knob values (what :meth:`OpTemplate.build` accepts and what tuning
    records hold), in the template's enumeration order, which is deterministic.

    Attributes
    ----------
    names : tuple of str
        The knob names, in the order of the template's knob type.
    points : sequence of dict
        The valid points: each fits the scratchpads, the micro-op buffer and the instruction fields
        (a :class:`GridPoints`, whose dicts are built when read, or a tuple).
    pruned : sequence of (dict, str)
        The points of the enumeration that break a limit, each with the reason; never measured
        (a :class:`PrunedPoints` or a tuple).
    tps : dict or None
        The default point (the Tiling Parameter Search: fewest modelled DRAM bytes that fit).
    fallback : dict or None
        The original stack's point without tuned records (every inner tile 1, one thread).
    default : dict or None
        The point the default knob policy (``"cycles"``) builds, where it differs from TPS (the
        CSP templates: fewest estimated cycles that fit); None means :attr:`tps`.
    """

    names: Tuple[str, ...] = ()
    points: Sequence[Point] = ()
    pruned: Sequence[Tuple[Point, str]] = ()
    tps: Optional[Point] = None
    fallback: Optional[Point] = None
    default: Optional[Point] = None

    @property
    def seed(self) -> Optional[Point]:
        """The point a tuner starts from: the default knob policy's point (:attr:`default`, the
        fewest estimated cycles for the CSP templates), else :attr:`tps`."""
        return self.default if self.default is not None else self.tps

    def __len__(self) -> int:
        return len(self.points)

    def __contains__(self, point: Point) -> bool:
        return self.index(point) is not None

    def index(self, point: Point) -> Optional[int]:
        """The position of ``point`` among :attr:`points` (missing knobs take no default), or None."""
        for i, p in enumerate(self.points):
            if p == dict(point):
                return i
        return None

    def __repr__(self) -> str:
        if not self.names:
            return "KnobSpace(no tunable knobs)"
        return (f"KnobSpace({len(self.points)} valid, {len(self.pruned)} pruned points over "
                f"{', '.join(self.names)}; tps {self.tps})")


class OpTemplate:
    """The part of a strategy that handles one operator kind. Subclass and register it.

    Subclasses set :attr:`kind`, :attr:`strategy` and :attr:`workload_type`, and implement
    :meth:`plan` and :meth:`build`.
    """

    kind: str = ""
    strategy: str = ""
    workload_type: type = object
    #: text of the build report, e.g. "stock template"
    report_text: str = "template"

    def plan(self, op: MatchedOp, config) -> OpPlan:
        """Workload, packed layouts and packing code of ``op``; raise :class:`TemplateRefusal`
        (with the reason) for instances this template does not implement."""
        raise NotImplementedError

    def build(self, config, workload, epilogue: Sequence[tuple], knobs) -> Any:
        """Compile ``workload`` + ``epilogue`` with ``knobs`` (``"tps"``, ``"fallback"`` or a dict
        of knob values) into an object with ``.program`` and ``.run(*packed, simulator=)``."""
        raise NotImplementedError

    def refusal(self, op: MatchedOp, config) -> Optional[str]:
        """Why this template will refuse ``op``, where that is known cheaply before planning.

        The offload pass's pre-pass asks it of every matched operator, so that an operator sure
        to stay on the CPU does not count as a VTA consumer of its producer's output
        (:func:`~vta_ext.offload.consumers.consumer_flags`).

        Returns
        -------
        str or None
            The refusal's reason; None when none is known (:meth:`plan` may still refuse). The
            default knows none.
        """
        return None

    def prefetch(self, ops: Sequence[MatchedOp], config) -> None:
        """Work this template can do for all of a module's operators of its kind at once, before
        :meth:`plan` is called for each in turn (e.g. solving their distinct workloads
        concurrently). The default does nothing; errors are left for :meth:`plan` to report."""

    def start_prefetched(self, order: Sequence[str]) -> None:
        """Called once every template has had its :meth:`prefetch`, before any :meth:`plan`:
        start the work :meth:`prefetch` queued, first for the operators first in ``order`` (the
        names of the module's matched operators, ``MatchedOp.name``, in the order they are
        planned). The default does nothing."""

    def workload_from_dict(self, values: Dict[str, Any]):
        """The workload object of a cache key's ``workload`` entry."""
        return self.workload_type(**values)

    def plan_summary(self, plan: OpPlan, config) -> str:
        """The strategy and embedding of ``plan`` in a few words, for the build report's line of
        the operator (e.g. ``"stock"``, ``"csp-relaxed NHWC x=1 y=k16 z=c16"``).

        Parameters
        ----------
        plan : OpPlan
            What :meth:`plan` returned for the operator.
        config : VTAConfig
            The configuration it was planned for.

        Returns
        -------
        str
            What the function registered for the type of ``plan.workload``
            (:func:`register_plan_summary`) returns, else the strategy's name.
        """
        summarise = _PLAN_SUMMARIES.get(type(plan.workload))
        return summarise(self, plan, config) if summarise is not None else self.strategy

    def knob_space(self, config, workload, epilogue: Sequence[tuple]) -> KnobSpace:
        """The tunable knobs of ``workload`` + ``epilogue`` on ``config`` (see :class:`KnobSpace`).

        The default is the empty space: the template has nothing to tune and always builds its
        ``"tps"`` point. Templates with knobs return every point of their enumeration, valid or
        pruned with the reason, plus their ``tps`` and ``fallback`` points.
        """
        return KnobSpace()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.kind!r} of strategy {self.strategy!r}>"


@dataclass(frozen=True)
class Strategy:
    """A named way of generating VTA code.

    Attributes
    ----------
    name : str
        The name users pass to ``vta_ext.build_options(strategy=...)``.
    description : str
        One line for ``repr`` and error messages.
    fallback : str or None
        The strategy that handles operator kinds this one registers no template for (the CSP
        strategies fall back to ``"stock"`` for average pools and element-wise operators).
    """

    name: str
    description: str = ""
    fallback: Optional[str] = None

    def template(self, kind: str) -> "OpTemplate":
        """The template of ``kind`` under this strategy (or its fallback chain)."""
        return get_template(kind, self.name)

    def __repr__(self) -> str:
        return f"Strategy({self.name!r}: {self.description})"


_STRATEGIES: Dict[str, Strategy] = {}
_TEMPLATES: Dict[Tuple[str, str], Union[str, OpTemplate]] = {}
_PLAN_SUMMARIES: Dict[type, Callable[[OpTemplate, OpPlan, Any], str]] = {}
_DEFAULT: List[str] = ["stock"]


def register_strategy(strategy: Strategy) -> Strategy:
    """Register ``strategy`` under its name (re-registering a name replaces it)."""
    _STRATEGIES[strategy.name] = strategy
    return strategy


def register_template(kind: str, strategy: str, template: Union[str, OpTemplate]) -> None:
    """Register the template of operator ``kind`` under ``strategy``: an :class:`OpTemplate` or
    the lazy path ``"package.module:attribute"`` of one (imported on first use)."""
    _TEMPLATES[(kind, strategy)] = template


def register_plan_summary(workload_type: type,
                          summarise: Callable[[OpTemplate, OpPlan, Any], str]) -> None:
    """Make :meth:`OpTemplate.plan_summary` of plans whose workload is a ``workload_type`` return
    ``summarise(template, plan, config)`` (a template may also override the method).

    Parameters
    ----------
    workload_type : type
        The workload class of the plans (exact type, not its subclasses).
    summarise : callable
        ``(template, plan, config) -> str``: the strategy and embedding in a few words.
    """
    _PLAN_SUMMARIES[workload_type] = summarise


def registered_strategies() -> List[str]:
    """Names of the registered strategies, sorted."""
    return sorted(_STRATEGIES)


def registered_templates() -> List[Tuple[str, str]]:
    """The registered ``(operator kind, strategy)`` keys, sorted."""
    return sorted(_TEMPLATES)


def get_strategy(name: str) -> Strategy:
    """The strategy registered as ``name``; the error lists the valid names."""
    try:
        return _STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown VTA strategy {name!r}; registered strategies: "
                         f"{registered_strategies()}") from None


def _load(path: str) -> OpTemplate:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise VTABuildError(f"the template module {module_name!r} cannot be imported: {err}") from err
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise VTABuildError(f"the template module {module_name!r} has no {attr!r} "
                            f"(registered as {path!r})") from None
    return obj() if isinstance(obj, type) else obj


def get_template(kind: str, strategy: str) -> OpTemplate:
    """The template of ``kind`` under ``strategy``, following the strategy's ``fallback`` chain.

    Raises :class:`TemplateRefusal` if no strategy of the chain has a template for ``kind`` (its
    message names a registered strategy that has one, e.g. ``no stock template for batched matmul;
    build with vta_ext.build_options(strategy='csp-relaxed') ...``), and :class:`VTABuildError` if a
    registered template cannot be imported.
    """
    name: Optional[str] = strategy
    seen = []
    while name is not None and name not in seen:
        seen.append(name)
        key = (kind, name)
        if key in _TEMPLATES:
            entry = _TEMPLATES[key]
            if isinstance(entry, str):
                entry = _TEMPLATES[key] = _load(entry)
            return entry
        name = get_strategy(name).fallback
    raise TemplateRefusal(_no_template_text(kind, strategy, seen))


#: how refusals name the operator kinds that only some strategies implement
KIND_WORDS = {"batch_matmul": "batched matmul", "conv1d": "conv1d",
              "dilated_conv2d": "dilated conv2d"}


def _no_template_text(kind: str, strategy: str, tried: Sequence[str]) -> str:
    """The refusal of ``kind`` under ``strategy``, saying which strategy to build with instead
    (the default strategy if it has a template for ``kind``, else the first by name)."""
    words = KIND_WORDS.get(kind, kind)
    others = sorted({s for k, s in _TEMPLATES if k == kind} - set(tried))
    if others:
        use = default_strategy() if default_strategy() in others else others[0]
        return (f"no {strategy} template for {words}; build with "
                f"vta_ext.build_options(strategy={use!r}) (strategies with one: "
                f"{', '.join(others)}; tried: {', '.join(tried)})")
    hint = ("; the CSP strategies of tvm_csp_embed have one: import tvm_csp_embed and build with "
            "vta_ext.build_options(strategy='csp-relaxed')" if kind in KIND_WORDS else "")
    return f"no VTA template for {words} (strategies tried: {', '.join(tried)}){hint}"


def default_strategy() -> str:
    """The strategy ``relax.build`` uses when no ``build_options(strategy=...)`` is in effect."""
    return _DEFAULT[0]


def set_default_strategy(name: str) -> None:
    """Make ``name`` (a registered strategy) the default; ``import tvm_csp_embed`` does this."""
    get_strategy(name)
    _DEFAULT[0] = name


register_strategy(Strategy("stock", "the fixed operator templates of the original VTA stack"))

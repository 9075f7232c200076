"""Affine expressions over integer loop variables: the index algebra of the lowering.

An :class:`Aff` is ``sum(coef * var) + const``; variables are the unique Python identifiers the TIR
conversion gives to loop variables. Index expressions of flattened buffers, padding conditions and
SRAM/DRAM offsets are all Affs; :meth:`Aff.py` renders one as Python source for the generated
program.
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional, Union

__all__ = ["Aff"]


class Aff:
    """``sum(coef * var) + const`` over integer loop variables (identified by unique names).

    Parameters
    ----------
    c : dict, optional
        Coefficient of each variable; zero coefficients are dropped.
    k : int
        The constant term.
    """

    __slots__ = ("c", "k")

    def __init__(self, c: Optional[Dict[str, int]] = None, k: int = 0) -> None:
        self.c = {v: x for v, x in (c or {}).items() if x}
        self.k = int(k)

    def __add__(self, o: Union["Aff", int]) -> "Aff":
        if isinstance(o, int):
            return Aff(self.c, self.k + o)
        c = dict(self.c)
        for v, x in o.c.items():
            c[v] = c.get(v, 0) + x
        return Aff(c, self.k + o.k)

    def __sub__(self, o: Union["Aff", int]) -> "Aff":
        return self + o.scale(-1) if isinstance(o, Aff) else self + (-o)

    def scale(self, s: int) -> "Aff":
        """``s`` times this expression."""
        return Aff({v: x * s for v, x in self.c.items()}, self.k * s)

    def coef(self, v: str) -> int:
        """Coefficient of variable ``v`` (0 if absent)."""
        return self.c.get(v, 0)

    def without(self, vs: Iterable[str]) -> "Aff":
        """This expression with the terms of the variables ``vs`` dropped."""
        vs = set(vs)
        return Aff({v: x for v, x in self.c.items() if v not in vs}, self.k)

    def subst(self, env: Dict[str, int]) -> "Aff":
        """This expression with the variables of ``env`` replaced by their values."""
        c, k = {}, self.k
        for v, x in self.c.items():
            if v in env:
                k += x * env[v]
            else:
                c[v] = x
        return Aff(c, k)

    def divisible(self, e: int) -> bool:
        """Whether every coefficient and the constant are multiples of ``e``."""
        return self.k % e == 0 and all(x % e == 0 for x in self.c.values())

    def div(self, e: int) -> "Aff":
        """This expression divided by ``e`` (exact when :meth:`divisible`)."""
        return Aff({v: x // e for v, x in self.c.items()}, self.k // e)

    @property
    def is_const(self) -> bool:
        """Whether no variable occurs."""
        return not self.c

    def py(self) -> str:
        """Python source of the expression, parenthesised, variables in sorted order."""
        terms = []
        for v, x in sorted(self.c.items()):
            terms.append(v if x == 1 else f"{x}*{v}")
        if self.k or not terms:
            terms.append(str(self.k))
        return "(" + " + ".join(terms) + ")"

    def __repr__(self) -> str:
        return self.py()

"""Tuning callbacks, as in AutoTVM: ``callback(tuner, inputs, results)`` after each measurement.

* :func:`progress_bar` -- a tqdm bar with the best cycles so far;
* :func:`log_to_file` -- append each result as a JSON line (:func:`~.records.record_line`),
  flushed at once, so an interrupted job keeps every finished measurement and a restarted one
  skips them (:meth:`~.tuner.Tuner.tune` reads the file back).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, List, Optional, Sequence

__all__ = ["progress_bar", "log_to_file", "LogToFile", "ProgressBar"]


class LogToFile:
    """Append every result to a JSON-lines records file (see :func:`log_to_file`)."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        self.written = 0

    def __call__(self, tuner, inputs: Sequence[Any], results: Sequence[Any]) -> None:
        from .records import record_line

        if not results:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            for result in results:
                f.write(record_line(tuner.task, result) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.written += len(results)

    def __repr__(self) -> str:
        return f"log_to_file({str(self.path)!r}, {self.written} lines written)"


def log_to_file(path) -> LogToFile:
    """A callback appending each measurement to the records file ``path`` (created if needed)."""
    return LogToFile(path)


class ProgressBar:
    """A tqdm progress bar over the trials of one task (see :func:`progress_bar`)."""

    def __init__(self, total: int, prefix: str = "", leave: bool = True) -> None:
        self.total, self.prefix, self.leave = total, prefix, leave
        self._bar = None
        self._task = None

    def __call__(self, tuner, inputs: Sequence[Any], results: Sequence[Any]) -> None:
        from tqdm.auto import tqdm

        if not results and (self._bar is None or self._task is not tuner.task):
            return
        if self._bar is None or self._task is not tuner.task:
            if self._bar is not None:
                self._bar.close()
            self._task = tuner.task
            desc = self.prefix or tuner.task.name
            self._bar = tqdm(total=min(self.total, len(tuner.task.knob_space)) or None,
                             desc=desc, leave=self.leave, unit="trial")
        measured = [r for r in results if not r.verified]
        self._bar.update(len(measured))
        best = tuner.best_cycles
        self._bar.set_postfix_str(f"best {best:,} cycles" if best is not None else "no result yet")
        if tuner.done:
            self.close()

    def close(self) -> None:
        """Close the bar (done automatically when the task's tuning ends)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __repr__(self) -> str:
        return f"progress_bar({self.total})"


def progress_bar(total: int, prefix: str = "", leave: bool = True) -> ProgressBar:
    """A callback showing a tqdm progress bar of ``total`` trials (capped at the space size)."""
    return ProgressBar(total, prefix, leave)

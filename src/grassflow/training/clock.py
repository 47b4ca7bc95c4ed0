"""Budget clocks: the process's CPU time (the default) or wall-clock time.

A budget in CPU seconds buys the same amount of work on an idle machine and on a busy one:
other processes slow the wall clock of a run, not the CPU time its steps take. With several
intra-op threads a second of wall time can cost up to that many CPU seconds, so rows are
comparable across loads at equal thread counts, and not across processors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["CLOCKS", "Stopwatch"]

CLOCKS = ("cpu", "wall")
"""``"cpu"``: ``time.process_time()`` (all threads of this process; per rank under torchrun);
``"wall"``: ``time.monotonic()``."""

# module attributes, so that tests replace them with a clock they control instead of sleeping
_cpu = time.process_time
_wall = time.monotonic


def read(kind: str) -> float:
    """Seconds of the ``kind`` clock (an arbitrary origin)."""
    if kind == "cpu":
        return _cpu()
    if kind == "wall":
        return _wall()
    raise ValueError(f"clock must be one of {CLOCKS}, got {kind!r}")


@dataclass
class Stopwatch:
    """CPU and wall seconds accumulated over the spans it ran (``start`` ... ``stop``).

    Attributes:
        cpu: CPU seconds of the finished spans.
        wall: wall seconds of the finished spans.
    """

    cpu: float = 0.0
    wall: float = 0.0
    _since: tuple[float, float] | None = None

    def start(self) -> Stopwatch:
        if self._since is None:
            self._since = (_cpu(), _wall())
        return self

    def stop(self) -> Stopwatch:
        if self._since is not None:
            self.cpu, self.wall = self.seconds("cpu"), self.seconds("wall")
            self._since = None
        return self

    @property
    def running(self) -> bool:
        return self._since is not None

    def seconds(self, kind: str) -> float:
        """Seconds of the ``kind`` clock so far, the running span included."""
        done = {"cpu": self.cpu, "wall": self.wall}[kind]
        if self._since is None:
            return done
        return done + read(kind) - self._since[CLOCKS.index(kind)]

    def __enter__(self) -> Stopwatch:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

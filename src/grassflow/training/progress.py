"""One progress line for a whole command: the phase (training, validating, evaluating, ...),
how far it is, and times on the CPU clock, which a busy machine does not stretch.

While a long call blocks (an exact validation, a test log-likelihood), a background thread
redraws the line every few seconds with the CPU time the phase has taken so far, so the
display never freezes without a word.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from tqdm.auto import tqdm

from . import clock

__all__ = ["Progress", "minutes", "progress_line"]


def minutes(seconds: float) -> str:
    """``seconds`` as a short count of minutes (``"0.04"``, ``"2.5"``, ``"12"``)."""
    m = seconds / 60
    return f"{m:.2f}" if m < 1 else f"{m:.1f}" if m < 10 else f"{m:.0f}"


@contextmanager
def progress_line(progress: bool | Progress, name: str, kind: str = "cpu") -> Iterator[Progress]:
    """``progress`` itself when it is a `Progress` shared by a command's phases (its owner
    closes it); else a new line named ``name``, shown if ``progress``, closed at the end."""
    if isinstance(progress, Progress):
        yield progress
        return
    line = Progress(name, enabled=progress, kind=kind)
    try:
        yield line
    finally:
        line.close()


class Progress:
    """A progress line (tqdm on stderr) shared by the phases of one command.

    Args:
        name: what the command works on (a run directory's name).
        enabled: False draws nothing (every method is then a cheap no-op).
        kind: the clock of the times shown, ``"cpu"`` (default) or ``"wall"``.
        tick_s: wall seconds between redraws while a phase blocks.
    """

    def __init__(self, name: str = "", enabled: bool = True, kind: str = "cpu",
                 tick_s: float = 5.0):  # fmt: skip
        self.name, self.enabled, self.kind, self.tick_s = name, enabled, kind, tick_s
        self.bar: tqdm | None = None
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- a counted phase
    def start(self, phase: str, total: float, bar_text: str = "") -> None:
        """Begin ``phase`` (e.g. ``"flow training"``) with ``total`` units (a budget's
        permille, iterations, clouds); ``bar_text`` follows the bar (tqdm fields allowed)."""
        self.close()
        if not self.enabled:
            return
        self.bar = tqdm(total=total, desc=self._desc(phase), dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| " + bar_text
                                   + "{postfix}")  # fmt: skip

    def update(self, n: float, postfix: dict[str, str] | None = None) -> None:
        """Set the count to ``n`` (and the fields after the bar)."""
        if self.bar is None:
            return
        with self._lock:
            self.bar.update(min(n, self.bar.total) - self.bar.n)
            if postfix is not None:
                self.bar.set_postfix(postfix, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def write(self, line: str) -> None:
        """Print ``line`` above the bar; nothing when disabled (a quiet run)."""
        if self.enabled:
            tqdm.write(line)

    # ---------------------------------------------------------------- a blocking phase
    @contextmanager
    def blocking(self, what: str, expected_s: float | None = None) -> Iterator[None]:
        """Name the blocking work ``what`` on the line, and redraw it with the CPU time
        taken so far (and ``expected_s``, the cost of the last such call) until it ends."""
        if self.bar is None:
            yield
            return
        start, stop = clock.read(self.kind), threading.Event()
        before = self.bar.desc

        def draw() -> None:
            text = f"{what}: {minutes(clock.read(self.kind) - start)}"
            if expected_s is not None:
                text += f" of ~{minutes(expected_s)}"
            with self._lock:
                if self.bar is not None:
                    self.bar.set_description_str(f"{before}, {text} {self.kind} min")

        def tick() -> None:
            while not stop.wait(self.tick_s):
                draw()

        draw()
        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            with self._lock:
                if self.bar is not None:
                    self.bar.set_description_str(before)

    def _desc(self, phase: str) -> str:
        return f"{self.name} {phase}".strip()

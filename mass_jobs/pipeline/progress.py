"""Progress display of long work: `mass run` / `mass demo` steps and `mass model tiny --warm` steps.

    mass run examples/tiny.yaml                 # a live display: steps bar, current step, ETA
    mass run examples/tiny.yaml --no-progress   # the same as plain lines (logs, CI, pipes)

The ETA sums the steps left, each at this run's mean time of the same step (a second generation's
train like the first's; stored, skipped steps take no time and are not counted). While a step left
has not run in this run yet the ETA is unknown: a guess from other steps' times said 0:45 for
fourteen steps that took four minutes, since the steps a run reaches last (train, evaluate) are its
longest. Known from the second generation on.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def estimate(left: list[str], timed: dict[str, list[float]]) -> float | None:
    """Seconds for the steps `left` (step names, e.g. "train"): each at the mean of the same step's
    timings so far (a generation's train is like the last one's, not like a guard); None while one
    of them has no timing of its own."""
    if any(not timed.get(n) for n in left):
        return None
    return sum(sum(timed[n]) / len(timed[n]) for n in left)


def untimed(left: list[str], timed: dict[str, list[float]]) -> int:
    """How many of the steps left have no timing of their own yet (what makes an ETA unknown)."""
    return sum(1 for n in left if not timed.get(n))


class Eta:
    """Remaining time over the planned steps (their names, in order), from this run's own timings of
    each step (`estimate`); skipped steps (stored already) cost nothing and are not timed."""

    def __init__(self, names: list[str]):
        self.names, self.finished = list(names), 0
        self.timed: dict[str, list[float]] = {}

    @property
    def total(self) -> int:
        return len(self.names)

    def add(self, seconds: float, skipped: bool) -> None:
        if not skipped:
            self.timed.setdefault(self.names[self.finished], []).append(seconds)
        self.finished += 1

    def text(self) -> str:
        left = self.names[self.finished :]
        if not left:
            return "ETA 0:00"
        eta = estimate(left, self.timed)
        if eta is None:
            return f"ETA unknown: {untimed(left, self.timed)} steps left not timed yet"
        return f"ETA ~{clock(eta)}"


class Display:
    """The runner's display: one bar over the run's steps with an ETA, one line for the current
    step's tasks/episodes/rollouts. `enabled=False` (`--no-progress`) prints the same as lines:
    each step's start and end, and its notes at most every `note_every_s` seconds (plus the last)."""

    def __init__(
        self, steps: list[str], enabled: bool = True, stream: TextIO | None = None, note_every_s: float = 10.0
    ):
        self.enabled, self.eta = enabled, Eta(steps)
        self.stream = stream or sys.stderr
        self.note_every_s, self._last_note = note_every_s, None
        self.label = ""
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.console = Console(stderr=True)
            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self.steps = self.progress.add_task("steps", total=len(steps))
            self.detail = self.progress.add_task("", total=None)

    def _line(self, text: str) -> None:
        print(text, file=self.stream, flush=True)

    def __enter__(self):
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.progress.update(self.detail, visible=False)  # no stale task/episode line at the end
            self.progress.stop()

    def step(self, label: str) -> None:
        self.label = label
        position = f"step {self.eta.finished + 1}/{self.eta.total}"
        if self.enabled:
            self.progress.update(self.steps, description=f"[bold]{label}[/bold] ({self.eta.text()})")
            self.progress.update(self.detail, description="", completed=0, total=None)
        else:
            self._line(f"start {label} ({position}, {self.eta.text()})")
            self._last_note = None  # a step's first note is always shown

    def done(self, label: str, skipped: bool, seconds: float) -> None:
        self.eta.add(seconds, skipped)
        line = f"{'skip' if skipped else 'done'} {label} ({seconds:.1f}s; {self.eta.finished}/{self.eta.total} steps, {self.eta.text()})"
        if self.enabled:
            self.progress.advance(self.steps)
            self.console.print(line)
        else:
            self._line(line)

    def note(self, text: str, completed: int | None = None, total: int | None = None) -> None:
        if self.enabled:
            self.progress.update(self.detail, description=text, completed=completed or 0, total=total)
            return
        now = time.monotonic()
        last = total is not None and completed is not None and completed >= total
        if last or self._last_note is None or now - self._last_note >= self.note_every_s:
            self._last_note = now
            count = f" [{completed}/{total}]" if total is not None and completed is not None else ""
            self._line(f"  {self.label}: {text}{count}")


class PerKey:
    """Counts per key (e.g. per generation), so a counter shown against a per-key total never
    runs past it when one step works through several keys (rollouts of L_G and its baselines)."""

    def __init__(self):
        self.counts: dict = {}

    def add(self, key) -> int:
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key]


def warm_printer(stream: TextIO | None = None, every: int = 50):
    """`on_step(step, steps, loss)` for `tiny_warm.build_warm_model`: a line every `every` steps
    (and the first and last) with the mean loss since the previous line, elapsed time and ETA. The
    ETA runs from the end of the first step: the first pays for setting up (threads, kernels,
    allocations), and counted in the rate it made the first ETA hours long."""
    out = stream or sys.stderr
    started = time.monotonic()
    first_done: list[float] = []
    window: list[float] = []

    def on_step(step: int, steps: int, loss: float) -> None:
        window.append(loss)
        now = time.monotonic()
        if step == 1:
            first_done.append(now)
        if step == 1 or step % every == 0 or step == steps:
            elapsed = now - started
            eta = "unknown" if step == 1 else clock((now - first_done[0]) / (step - 1) * (steps - step))
            print(
                f"warm-up step {step}/{steps}  loss {sum(window) / len(window):.3f}  "
                f"elapsed {clock(elapsed)}  ETA {eta}",
                file=out,
                flush=True,
            )
            window.clear()

    return on_step

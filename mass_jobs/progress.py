"""Progress display of long work: `mass run` / `mass demo` steps and `mass model tiny --warm` steps.

    mass run examples/tiny.yaml                 # a live display: steps bar, current step, ETA
    mass run examples/tiny.yaml --no-progress   # the same as plain lines (logs, CI, pipes)

The ETA is the mean wall time of the steps that did work so far times the steps left (stored,
skipped steps take no time and are not counted): rough, since steps differ, but it moves.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


def clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


class Eta:
    """Remaining time from the mean of the steps that did work (skipped ones cost nothing)."""

    def __init__(self, total: int):
        self.total, self.finished, self.worked, self.worked_s = total, 0, 0, 0.0

    def add(self, seconds: float, skipped: bool) -> None:
        self.finished += 1
        if not skipped:
            self.worked, self.worked_s = self.worked + 1, self.worked_s + seconds

    def text(self) -> str:
        left = self.total - self.finished
        if left <= 0:
            return "ETA 0:00"
        if not self.worked:
            return "ETA unknown"
        return f"ETA ~{clock(self.worked_s / self.worked * left)}"


class Display:
    """The runner's display: one bar over the run's steps with an ETA, one line for the current
    step's tasks/episodes/rollouts. `enabled=False` (`--no-progress`) prints the same as lines:
    each step's start and end, and its notes at most every `note_every_s` seconds (plus the last)."""

    def __init__(self, total: int, enabled: bool = True, stream: TextIO | None = None, note_every_s: float = 10.0):
        self.enabled, self.eta = enabled, Eta(total)
        self.stream = stream or sys.stderr
        self.note_every_s, self._last_note = note_every_s, None
        self.label = ""
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.console = Console(stderr=True)
            self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), console=self.console, transient=False)
            self.steps = self.progress.add_task("steps", total=total)
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
    (and the first and last) with the mean loss since the previous line, elapsed time and ETA."""
    out = stream or sys.stderr
    started = time.monotonic()
    window: list[float] = []

    def on_step(step: int, steps: int, loss: float) -> None:
        window.append(loss)
        if step == 1 or step % every == 0 or step == steps:
            elapsed = time.monotonic() - started
            eta = elapsed / step * (steps - step)
            print(f"warm-up step {step}/{steps}  loss {sum(window) / len(window):.3f}  "
                  f"elapsed {clock(elapsed)}  ETA {clock(eta)}", file=out, flush=True)
            window.clear()

    return on_step

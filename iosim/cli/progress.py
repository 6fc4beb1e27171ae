"""A progress bar for long runs of the L2 model: a ``progress(done, total)`` callback for :func:`simulate_l2`.

Part of the command line, not of the model: the model only calls the ``progress`` it is given, so that ``import
iosim`` does not load rich. Nothing is shown unless a caller passes one (``iosim simulate`` does, when stderr is a
terminal); it prints to stderr, and only once the run has taken ``delay`` seconds, so short runs stay silent.
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn


class ProgressBar:
    """``with ProgressBar() as bar: simulate_l2(..., progress=bar)``: a transient bar of the accesses walked."""

    def __init__(self, description: str = "L2 model", delay: float = 1.5, stream=None):
        self.description, self.delay = description, delay
        self.console = Console(file=stream if stream is not None else sys.stderr)
        self.t0 = time.perf_counter()
        self._bar: Progress | None = None
        self._task = None

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:
            if time.perf_counter() - self.t0 < self.delay:
                return
            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TimeElapsedColumn(), console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.description, total=total)
        self._bar.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""The one progress bar of every command.

On a terminal it is tqdm's. Written to a file or a pipe, tqdm's carriage-return redraws flood
the log with one "line" per refresh; there :class:`LineProgress` prints one plain line each
time another ``every`` share of the total is done (10 % by default; every ``every_s`` seconds
when the total is unknown) and one at the end. Both show the rate and the time left; a step
with no count of its own (a scikit-learn fit) gets :func:`timed`, a bar that only shows its
clock.

    with progress_bar(total=len(rows), desc="privatize", unit="row") as bar:
        for chunk in chunks:
            ...
            bar.update(len(chunk))
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from rapt.numfmt import count, seconds

__all__ = ["LineProgress", "is_terminal", "progress_bar", "quiet_library_bars", "timed"]


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` is an interactive terminal (tqdm's redraws are welcome there)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a real stream
        return False


def progress_bar(iterable: Iterable | None = None, *, total: float | None = None,
                 desc: str = "", unit: str = "it", file: TextIO | None = None,
                 leave: bool = True, disable: bool = False, every: float = 0.1,
                 every_s: float = 30.0, initial: float = 0, elapsed: float = 0.0):
    """A tqdm bar on a terminal, else a :class:`LineProgress` (same calls: ``update``,
    ``set_postfix``, ``n``/``total``, ``refresh``, ``close``, iteration, ``with``).
    A resumed job's bar starts at ``initial`` done, ``elapsed`` seconds already spent: its
    count and time are the whole job's, its rate this run's."""
    file = sys.stderr if file is None else file
    if disable or is_terminal(file):
        from tqdm import tqdm

        bar = tqdm(iterable, total=total, desc=desc, unit=unit, file=file, leave=leave,
                   disable=disable, initial=initial)
        if hasattr(bar, "start_t"):  # a disabled tqdm has no clock
            bar.start_t -= elapsed
        return bar
    return LineProgress(iterable, total=total, desc=desc, unit=unit, file=file, every=every,
                        every_s=every_s, initial=initial, elapsed=elapsed)


def quiet_library_bars(file: TextIO | None = None) -> None:
    """Turn off the libraries' own bars (transformers' "Loading weights") when ``file`` (the
    command's stderr) is not a terminal: they would flood a log the same way."""
    if not is_terminal(sys.stderr if file is None else file):
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:  # pragma: no cover - transformers is a dependency
            return
        hf_logging.disable_progress_bar()


class LineProgress:
    """Plain-line progress for logs: ``desc: 30% (300/1,000 step) loss=0.61`` at each further
    ``every`` of the total (or every ``every_s`` seconds without a total), and a last line with
    the time taken at :meth:`close`."""

    def __init__(self, iterable: Iterable | None = None, *, total: float | None = None,
                 desc: str = "", unit: str = "it", file: TextIO | None = None,
                 every: float = 0.1, every_s: float = 30.0, initial: float = 0,
                 elapsed: float = 0.0) -> None:
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.total, self.desc, self.unit = iterable, total, desc, unit
        self.file = sys.stderr if file is None else file
        self.every, self.every_s = every, every_s
        self.n = self.initial = initial  # a resumed job: done before this run
        self.postfix = ""
        self.t_run = self._last_t = time.monotonic()
        self.t0 = self.t_run - elapsed  # the job's start, earlier runs included
        self._last_step = 0  # how many ``every`` shares were already reported
        # (time, count) at the first update: the rate is measured from there on, since a
        # first step that loads or warms up would otherwise set the rate of every line
        self._first: tuple[float, float] | None = None
        self.closed = False

    # -- tqdm's interface -----------------------------------------------------------------------
    def update(self, n: float = 1) -> None:
        self.n += n
        if self._first is None:
            self._first = (time.monotonic(), self.n)
        self.refresh()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = " ".join(f"{k}={v}" for k, v in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        """Print a line when another ``every`` share is done (or ``every_s`` passed)."""
        now = time.monotonic()
        if self.total:
            step = int(min(self.n / self.total, 1.0) / self.every + 1e-9)
            if step > self._last_step:
                self._last_step = step
                self._line()
        elif now - self._last_t >= self.every_s:
            self._last_t = now
            self._line()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        complete = self.total is not None and self.n >= self.total
        if not (complete and self._last_step > 0):  # the final state is not printed yet
            self._line()
        word = "done" if complete or self.total is None else "ended"
        self.file.write(f"{self._head()}{word} in {seconds(time.monotonic() - self.t0)}\n")
        self.file.flush()

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lines ------------------------------------------------------------------------------------
    def _head(self) -> str:
        return f"{self.desc}: " if self.desc else ""

    def rate(self) -> float | None:
        """Units per second since the first update (None before two updates' worth of
        time): a slow first step (loading, warm-up) does not set the rate of the rest."""
        now = time.monotonic()
        if self._first is not None and self.n > self._first[1] and now > self._first[0]:
            return (self.n - self._first[1]) / (now - self._first[0])
        done = self.n - self.initial
        return done / (now - self.t_run) if done > 0 and now > self.t_run else None

    def _line(self) -> None:
        if self.total:
            n = f"{self.n:,.0f}" if float(self.n).is_integer() else f"{self.n:,.2f}"
            what = f"{100 * self.n / self.total:.0f}% ({n}/{count(self.total, self.unit)})"
        else:
            what = count(self.n, self.unit)
        rate = self.rate()
        speed = "" if rate is None else f", {rate:.3g} {self.unit}/s"
        if rate and self.total and self.n < self.total:
            speed += f", {seconds((self.total - self.n) / rate)} left"
        tail = f" {self.postfix}" if self.postfix else ""
        self.file.write(f"{self._head()}{what}{speed}{tail}\n")
        self.file.flush()


@contextmanager
def timed(desc: str, *, file: TextIO | None = None, refresh_s: float = 1.0) -> Iterator[None]:
    """A step that reports no count of its own (a scikit-learn fit) with its clock: on a
    terminal a tqdm line whose elapsed time ticks every ``refresh_s`` seconds, in a log one
    line when it starts and one with the time it took."""
    file = sys.stderr if file is None else file
    if not is_terminal(file):
        t0 = time.monotonic()
        file.write(f"{desc}: ...\n")
        file.flush()
        try:
            yield
        finally:
            file.write(f"{desc}: done in {seconds(time.monotonic() - t0)}\n")
            file.flush()
        return
    from tqdm import tqdm

    bar = tqdm(total=None, desc=desc, file=file, bar_format="{desc}: {elapsed}")
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(refresh_s):
            bar.refresh()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        bar.close()



"""Progress of long work, shown one way everywhere: a tqdm bar (rate, time left) when stderr is a terminal; in a log
file a plain line ``FIRST_LINE`` seconds in, then every ``LINE_EVERY`` seconds and at the end (never one line per
step; work done within ``FIRST_LINE`` seconds prints none), with what is done of the total, its share, the rate and
the time left at a rate smoothed over about half a minute (:class:`Pace`), so that a slow first step (allocation,
compilation, a cold cache) or one slow batch does not swing it."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

LINE_EVERY = 10.0  # seconds between plain progress lines in a log
FIRST_LINE = 2.0  # seconds into the work before its first line (quick work stays quiet)
PACE_WINDOW = 30.0  # seconds over which the rate behind the time left is averaged


def format_seconds(seconds: float) -> str:
    """``42s``, ``3m07s``, ``2h05m``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


class Pace:
    """The rate of some work, an exponential average of the rates between updates with a time constant of
    ``window`` seconds: steady against one slow step, and it follows a lasting change within about a window."""

    def __init__(self, window: float = PACE_WINDOW) -> None:
        self.window = window
        self.mark: tuple[float, float] | None = None  # (done, time) at the last update
        self.rate: float | None = None

    def left(self, done: float, total: float, now: float) -> float | None:
        """Seconds left to ``total`` at the averaged rate; None until two updates apart in work and time."""
        if self.mark is None:
            self.mark = (done, now)
            return None
        work, seconds = done - self.mark[0], now - self.mark[1]
        if work > 0 and seconds > 0:
            rate = work / seconds
            weight = 1.0 if self.rate is None else 1.0 - math.exp(-seconds / self.window)
            self.rate = rate if self.rate is None else self.rate + weight * (rate - self.rate)
            self.mark = (done, now)
        return max(0.0, total - done) / self.rate if self.rate else None


def parts_left(done: int, total: int, seconds: list[float]) -> str:
    """``1 of 5 done in 1m35s; about 6m20s left (1m35s each)``: after part ``done`` of ``total`` alike parts (a
    few-shot protocol's splits, each the same phases on as many rows), the parts left at the mean of ``seconds``,
    those measured. Steadier than a rate inside a part, whose phases (training, labelling, a student) differ."""
    each = sum(seconds) / len(seconds)
    return (
        f"{done} of {total} done in {format_seconds(seconds[-1])}; about {format_seconds(each * (total - done))} "
        f"left ({format_seconds(each)} each)"
    )


def _amount(n: float, unit: str) -> str:
    if unit == "B":
        return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"
    return f"{n:,.0f}"


class Progress:
    """Work of ``total`` units (``unit``, plural: ``rows``, ``texts``, ``B`` for bytes), ``initial`` done before.

    ``enabled``: ``"auto"`` a bar in a terminal, plain lines otherwise; True a bar; False nothing (notes still
    print). ``first``: a line at the first update, however soon. ``counts=False`` (a training run, whose total is its
    budget): the line is ``[ 12.5%]`` and the fields given to :meth:`to`, the time left being the caller's (it
    knows a time budget)."""

    def __init__(
        self,
        desc: str,
        total: float,
        *,
        unit: str = "rows",
        initial: float = 0,
        enabled: bool | str = "auto",
        counts: bool = True,
        first: bool = False,
        leave: bool = True,
        every: float = LINE_EVERY,
    ) -> None:
        self.desc, self.total, self.unit, self.counts, self.every = desc, total, unit, counts, every
        self.done = self.start = initial
        self.t0 = time.perf_counter()
        # when the last line was printed: the first is due at the first update (``first``) or FIRST_LINE s in
        self.last: float | None = None if first else self.t0 - every + FIRST_LINE
        self.shown = False
        self.pace = Pace()
        use_bar = sys.stderr.isatty() if enabled == "auto" else bool(enabled)
        self.lines = bool(enabled) and not use_bar
        self.bar: Any = None
        if use_bar:
            from tqdm.auto import tqdm

            fmt = "{desc} {percentage:3.0f}%|{bar}|{postfix}" if not counts else None  # tqdm puts ", " first
            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit=unit,
                unit_scale=unit == "B",
                dynamic_ncols=True,
                leave=leave,
                **({"bar_format": fmt} if fmt else {}),
            )

    def update(self, n: float) -> None:
        """``n`` more units done."""
        self.to(self.done + n)

    def to(self, done: float, fields: dict[str, str] | None = None, *, force: bool = False) -> bool:
        """``done`` units done in all; ``fields`` shown after the counts (``loss=2.31 lr=1e-4``); ``force``: a
        line now (the last before a stop), however soon after the previous one. Whether ``fields`` were shown
        (a bar shows each; a log only its lines)."""
        self.done = done
        extra = " ".join(f"{k}={v}" for k, v in (fields or {}).items())
        now = time.perf_counter()
        left = self.pace.left(done, self.total, now)
        if self.bar is not None:  # tqdm redraws at most every 0.1 s however often it is updated
            if extra:
                self.bar.set_postfix_str(extra, refresh=False)
            self.bar.update(done - self.bar.n)
            return True
        if not self.lines:
            return False
        due = self.last is None or now - self.last >= self.every or (done >= self.total and self.shown)
        if not (due or force):
            return False
        self.last, self.shown = now, True
        share = 100 * done / self.total if self.total else 100.0
        if not self.counts:
            print(f"[{share:5.1f}%] {extra}".rstrip(), file=sys.stderr, flush=True)
            return True
        seconds = now - self.t0
        rate = (done - self.start) / seconds if seconds > 0 else 0.0
        if left is None and rate > 0:
            left = max(0.0, self.total - done) / rate
        per_s = f"{rate / 1e6:,.1f} MB/s" if self.unit == "B" else f"{rate:,.1f} {self.unit}/s"
        eta = format_seconds(left) if left is not None else "?"
        line = f"{self.desc}: {_amount(done, self.unit)} of {_amount(self.total, self.unit)}"
        line += "" if self.unit == "B" else f" {self.unit}"
        print(f"{line} ({share:.1f}%), {per_s}, {eta} left {extra}".rstrip(), file=sys.stderr, flush=True)
        return True

    def note(self, text: str) -> None:
        """A line of its own, above the bar in a terminal."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

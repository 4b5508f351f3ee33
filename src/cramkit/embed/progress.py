"""A progress line for long embeddings: tqdm in a terminal (rate and ETA), a line every 10 s otherwise."""

from __future__ import annotations

import sys
import time


class ProgressBar:
    """tqdm in a terminal (rate and ETA), a line every 10 s otherwise."""

    def __init__(self, enabled: bool | str, desc: str, total: int, initial: int) -> None:
        self.tty = sys.stderr.isatty() if enabled == "auto" else bool(enabled)
        self.enabled = bool(enabled)
        self.total, self.desc, self.last = total, desc, time.perf_counter()
        self.bar = None
        if self.enabled and self.tty:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit="ex", dynamic_ncols=True)

    def update(self, done: int, new: int, seconds: float) -> None:
        if self.bar is not None:
            self.bar.update(done - self.bar.n)
        elif self.enabled and (time.perf_counter() - self.last > 10 or done == self.total):
            self.last = time.perf_counter()
            rate = new / seconds if seconds > 0 else 0.0
            eta = (self.total - done) / rate if rate > 0 else float("nan")
            print(
                f"{self.desc}: {done}/{self.total} ({100 * done / max(self.total, 1):.1f}%) "
                f"{rate:,.1f} examples/s, ETA {eta:,.0f}s",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

"""The one progress display: in a log (stderr not a terminal) a line two seconds in (or at the first update), one per
LINE_EVERY seconds and one at the end, never one per update; the counts, share, rate and time left in each; nothing
when disabled or done within two seconds."""

from __future__ import annotations

import math
import re

import pytest

import cramkit.progress as progress
from cramkit.progress import Pace, Progress, format_seconds


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(progress.time, "perf_counter", c)
    return c


def test_a_log_gets_a_line_at_the_start_every_ten_seconds_and_at_the_end(clock: Clock, capsys) -> None:
    bar = Progress("teacher logits", 1000, unit="rows", initial=100, first=True)
    for done in range(110, 1001, 10):  # 90 updates, one a second
        clock.now += 1.0
        bar.to(done)
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 + 89 // 10 + 1  # the first, one per 10 s, the last
    assert lines[0].startswith("teacher logits: 110 of 1,000 rows (11.0%), 10.0 rows/s, ")
    assert lines[-1] == "teacher logits: 1,000 of 1,000 rows (100.0%), 10.0 rows/s, 0s left"
    middle = re.fullmatch(r"teacher logits: ([\d,]+) of 1,000 rows \(([\d.]+)%\), 10\.0 rows/s, (\S+) left", lines[3])
    assert middle is not None
    done = int(middle.group(1).replace(",", ""))
    assert middle.group(3) == format_seconds((1000 - done) / 10)  # at 10 rows/s


def test_bytes_read_as_megabytes_and_a_forced_line_comes_at_once(clock: Clock, capsys) -> None:
    bar = Progress("staging train.bin", 3e9, unit="B")
    clock.now += 1.0
    bar.update(5e8)  # under two seconds from the start: not shown
    clock.now += 1.0
    bar.update(5e8)  # two seconds in: the first line
    clock.now += 1.0
    bar.update(5e8)  # within ten seconds of it: not shown
    clock.now += 1.0
    bar.to(2e9, {"file": "2/3"}, force=True)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("staging train.bin: 1.00 GB of 3.00 GB (33.3%), 500.0 MB/s, ")
    assert lines[1].startswith("staging train.bin: 2.00 GB of 3.00 GB (66.7%), 500.0 MB/s, ")
    assert lines[1].endswith(" left file=2/3") and len(lines) == 2


def test_work_done_within_two_seconds_prints_nothing(clock: Clock, capsys) -> None:
    with Progress("embedding", 100, unit="texts") as bar:
        for _ in range(10):
            clock.now += 0.19
            bar.update(10)
    assert capsys.readouterr().err == ""


def test_a_training_run_shows_its_share_and_fields_and_disabled_shows_nothing(clock: Clock, capsys) -> None:
    bar = Progress("pretrain", 100.0, counts=False, first=True)
    assert bar.to(12.5, {"loss": "2.310", "left": "~1m00s"})  # shown: the caller starts its next average
    clock.now += 1.0
    assert not bar.to(13.0, {"loss": "2.300"})  # not shown: the caller keeps averaging
    assert bar.to(100.0, {"loss": "2.000"})
    assert capsys.readouterr().err.splitlines() == ["[ 12.5%] loss=2.310 left=~1m00s", "[100.0%] loss=2.000"]
    quiet = Progress("pretrain", 100.0, enabled=False)
    quiet.to(50.0)
    quiet.note("a note still prints")
    assert capsys.readouterr().err == "a note still prints\n"


def test_pace_averages_over_its_window() -> None:
    pace = Pace(window=30.0)
    assert pace.left(0, 100, 0.0) is None  # one point: no rate yet
    assert pace.left(10, 100, 1.0) == pytest.approx(9.0)  # 10 per second
    assert pace.left(10, 100, 2.0) == pytest.approx(9.0)  # no work done: the rate stands
    left = pace.left(20, 100, 12.0)  # 10 more in the 11 s since the last work, weighted 1 - e^(-11/30)
    assert left == pytest.approx(80 / (10 + (1 - math.exp(-11 / 30)) * (10 / 11 - 10)), rel=1e-9)

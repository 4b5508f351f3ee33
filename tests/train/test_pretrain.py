"""The trainer end to end on real text: learning, bit-exact resume after SIGTERM, NaN handling, errors."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cramkit.cli import main as cli_main
from cramkit.errors import CramkitError
from cramkit.recipes.pretrain import pretrain
from cramkit.train.metrics import read_metrics

KEYS = ("step", "tokens", "loss", "lr", "grad_norm", "batch_size", "val_loss")


def _curve(run: Path) -> list[dict]:
    return [{k: r[k] for k in KEYS if k in r} for r in read_metrics(run)]


@pytest.mark.integration
def test_pretrain_raw_text_learns(tmp_path: Path, tiny: list[str], wiki_files: list[str]) -> None:
    run = pretrain(
        wiki_files,
        budget="200steps",
        out=tmp_path / "run",
        overrides=[
            *tiny,
            "tokenizer.vocab_size=1000",
            "train.eval_every=50steps",
            "train.lr=3e-3",
            "train.micro_batch=16",
            "train.batch_size=16",
        ],
    )
    assert {p.name for p in run.iterdir()} >= {
        "checkpoints",
        "config.yaml",
        "data",
        "loss.png",
        "metrics.jsonl",
        "run.json",
        "tokenizer",
    }
    assert (run / "tokenizer" / "tokenizer.json").is_file() and (run / "data" / "train.bin").is_file()
    records = read_metrics(run)
    val = [r["val_loss"] for r in records if "val_loss" in r]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in records if "val_loss" in r] == [50, 100, 150, 200]
    assert len(train) == 200 and train[-1]["tokens"] == 200 * 16 * 64
    assert all(r["batch_size"] == 16 and r["tokens_per_s"] > 0 for r in train)
    vocab = json.loads((run / "config.yaml").read_text().split("vocab_size:")[1].split()[0])
    assert 900 <= vocab <= 1000
    # learning: the loss starts near ln(vocab) and validation loss falls well below it, step after step
    assert abs(train[0]["loss"] - math.log(vocab)) < 0.5
    assert val[0] > val[1] > val[2] > val[3] and val[3] < math.log(vocab) - 1.0
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-000200"
    assert (run / "loss.png").stat().st_size > 1000
    # resume with a larger budget: the cached tokenizer and store are reused, training goes on
    stamps = {p: p.stat().st_mtime_ns for p in [run / "data" / "train.bin", run / "tokenizer" / "tokenizer.json"]}
    assert pretrain(resume=run, budget="210steps") == run
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert [r["step"] for r in read_metrics(run) if "loss" in r][-1] == 210
    assert "budget: 210steps" in (run / "config.yaml").read_text()


def test_store_input_and_tokenizer_mismatch(
    tiny: list[str], tmp_path: Path, small_store: Path, wiki_files: list[str]
) -> None:
    from cramkit.text.sources import iter_documents
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    other = tmp_path / "other-tokenizer"
    save_tokenizer(train_tokenizer(iter_documents(wiki_files[:1]), 500), other)
    with pytest.raises(CramkitError, match="built with another tokenizer"):
        pretrain(str(small_store), budget="2steps", out=tmp_path / "bad", overrides=tiny, tokenizer=str(other))
    # the store's own tokenizer (saved beside it) is used when none is given
    run = pretrain(str(small_store), budget="2steps", out=tmp_path / "good", overrides=tiny)
    assert not (run / "data").exists() and json.loads((run / "run.json").read_text())["inputs"] == [str(small_store)]
    with pytest.raises(CramkitError, match="already holds a run"):
        pretrain(str(small_store), budget="2steps", out=run, overrides=tiny)


@pytest.mark.smoke
def test_sigterm_saves_and_resume_is_bit_exact(tmp_path: Path, tiny: list[str], small_store: Path) -> None:
    settings = [*tiny, "train.eval_every=25steps", "train.checkpoint_every=never"]
    budget = "150steps"
    # a run that is stopped by SIGTERM part-way, in a separate process
    stopped = tmp_path / "stopped"
    cmd = [
        sys.executable,
        "-m",
        "cramkit",
        "pretrain",
        str(small_store),
        "--budget",
        budget,
        "--out",
        str(stopped),
    ]
    for s in settings:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if (stopped / "metrics.jsonl").exists() and len(read_metrics(stopped)) >= 5:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM" in err and "--resume" in err and "Traceback" not in err
    assert "error" not in err  # a stop asked for is not an error
    saved = json.loads(
        (stopped / "checkpoints" / (stopped / "checkpoints" / "latest").read_text().strip() / "state.json").read_text()
    )
    assert 5 <= saved["step"] < 150 and saved["trainer"]["reason"] == "signal 15"

    # resume it to the end, in this process
    assert pretrain(resume=stopped) == stopped
    # a run that never stopped
    reference = pretrain(str(small_store), budget=budget, out=tmp_path / "reference", overrides=settings)
    got, want = _curve(stopped), _curve(reference)
    assert len(want) == 150 + 6 + 0  # 150 steps logged, validation at 25, 50, ..., 150
    assert got == want  # bit for bit: the same floats, not just close ones


def test_nan_steps_are_skipped_then_stop(
    tiny: list[str], tmp_path: Path, small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cramkit.model import heads

    real_forward = heads.MaskedLM.forward
    calls = {"n": 0}
    poisoned: set[int] = set()

    def forward(self, input_ids, labels=None, *args, **kwargs):
        out = real_forward(self, input_ids, labels, *args, **kwargs)
        if self.training:
            calls["n"] += 1
            if calls["n"] in poisoned or ("from" in calls and calls["n"] >= calls["from"]):
                return out._replace(loss=out.loss * float("nan"))
        return out

    monkeypatch.setattr(heads.MaskedLM, "forward", forward)
    poisoned.update({3, 4})
    run = pretrain(
        str(small_store), budget="8steps", out=tmp_path / "skip", overrides=[*tiny, "train.eval_every=never"]
    )
    records = [r for r in read_metrics(run) if "loss" in r]
    assert [r["skipped"] for r in records if "skipped" in r] == [1, 2, 2, 2, 2, 2]
    assert [r["loss"] for r in records if r["step"] in (3, 4)] == ["nan", "nan"]
    assert all(isinstance(r["loss"], float) for r in records if r["step"] not in (3, 4))

    calls.update(n=0, **{"from": 3})
    poisoned.clear()
    with pytest.raises(CramkitError, match=r"not finite for 3 steps in a row \(step 5\)"):
        pretrain(
            str(small_store),
            budget="20steps",
            out=tmp_path / "stop",
            overrides=[*tiny, "train.max_nan_steps=3", "train.checkpoint_every=1steps"],
        )
    # the last good checkpoint is kept
    assert (tmp_path / "stop" / "checkpoints" / "latest").read_text().strip() == "step-000002"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["pretrain", "--preset", "tiny-gpu"],
            "known presets: bert-base, bert-lamb, continue, crammed-bert, tiny-cpu",
        ),
        (["pretrain", "--set", "train.learning_rate=1"], "valid settings in 'train': "),
        (["pretrain", "--set", "modle.layers=2"], "did you mean 'model'"),
        (["pretrain", "--budget", "5 minutes"], "write it as '30s', '5m'"),
        (["pretrain", "--set", "train.optimizer=sgd"], "'adamw', 'lamb'"),
        # a setting typed as a flag: the --set form, with its value
        (["pretrain", "--lr", "1e-3"], "unknown option --lr; did you mean --set train.lr=1e-3?"),
        (["finetune", "--epocs=3"], "unknown option --epocs; did you mean --set epochs=3?"),
        (
            ["distill", "--teacher", "t", "--student", "bilstm", "--n-iter", "5"],
            "did you mean --set n_iter=5?",
        ),
        (["pretrain", "--budgt", "5m"], "unknown option --budgt; did you mean --budget?"),
    ],
)
def test_cli_config_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert cli_main([*argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_resume_of_a_foreign_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "x.txt").write_text("x")
    assert cli_main(["pretrain", "--resume", str(tmp_path)]) == 2
    assert "not a cramkit run directory" in capsys.readouterr().err


def test_compile_on_cpu_runs(tmp_path: Path, tiny: list[str], small_store: Path) -> None:
    run = pretrain(str(small_store), budget="3steps", out=tmp_path / "c", overrides=[*tiny, "train.compile=true"])
    assert [r["step"] for r in read_metrics(run) if "loss" in r] == [1, 2, 3]


def _command(store: Path, out: Path, budget: str, settings: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "cramkit", "pretrain", str(store), "--budget", budget, "--out", str(out)]
    for item in settings:
        cmd += ["--set", item]
    return cmd


@pytest.mark.integration
def test_second_process_on_the_same_run_is_refused(tiny: list[str], tmp_path: Path, small_store: Path) -> None:
    """Two `cramkit pretrain` on one --out: the second gets one line and touches nothing (issue 12, item 5)."""
    run = tmp_path / "run"
    cmd = _command(small_store, run, "10m", tiny)
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (run / "metrics.jsonl").exists():
            time.sleep(0.05)
        assert first.poll() is None
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "in use by another cramkit process" in second.stderr
        assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
        resume = subprocess.run([*cmd[:4], "--resume", str(run)], capture_output=True, text=True, timeout=120)
        assert resume.returncode == 2 and "in use by another cramkit process" in resume.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 128 + signal.SIGTERM  # the first run was not disturbed: it saved and stopped
    assert not list((run / "checkpoints").glob("*.tmp"))


@pytest.mark.integration
def test_resume_of_a_finished_run_says_so_and_extending_explains_the_schedule(
    tiny: list[str], tmp_path: Path, small_store: Path
) -> None:
    run = pretrain(str(small_store), budget="4steps", out=tmp_path / "run", overrides=tiny)
    cmd = [sys.executable, "-m", "cramkit", "pretrain", "--resume", str(run)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "already spent its budget of 4steps" in done.stderr
    assert "--budget 8steps" in done.stderr and "resuming" not in done.stderr
    more = subprocess.run([*cmd, "--budget", "6steps"], capture_output=True, text=True, timeout=300)
    assert more.returncode == 0, more.stderr
    assert "budget 4steps -> 6steps" in more.stderr and "schedule" in more.stderr and "resuming" in more.stderr
    assert max(r["step"] for r in read_metrics(run) if "loss" in r) == 6


@pytest.mark.integration
def test_second_ctrl_c_aborts_without_damaging_what_is_saved(
    tiny: list[str], tmp_path: Path, small_store: Path
) -> None:
    """First Ctrl-C: said at once (saving); a second one aborts; earlier checkpoints stay complete (item 6)."""
    run = tmp_path / "run"
    cmd = _command(small_store, run, "10m", [*tiny, "train.checkpoint_every=3steps", "train.keep_checkpoints=5"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "checkpoints" / "latest").is_file():
        time.sleep(0.02)
    assert proc.poll() is None
    proc.send_signal(signal.SIGINT)
    time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"two Ctrl-C did not end the run within 120 s; its stderr:\n{err[-3000:]}")
    assert "press Ctrl-C again to abort without saving" in err
    assert proc.returncode in (130, 128 + signal.SIGINT), err
    assert "Traceback" not in err
    from cramkit import load
    from cramkit.train import checkpoint as ckpt

    latest = ckpt.find_latest(run)
    assert latest is not None  # (an aborted save may leave a .tmp: never chosen, removed on the next start)
    ckpt.verify(latest)  # every file of the newest complete checkpoint matches its checksum
    assert load(run).kind == "mlm"
    resumed = subprocess.run(
        [*cmd[:4], "--resume", str(run), "--budget", "12steps"], capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert not list((run / "checkpoints").glob("*.tmp"))

"""--report-to: the real `cramkit pretrain` reports to each tracker installed here, in its local/offline mode, and
each tracker's own reader gives back the losses of metrics.jsonl; a resumed run continues the same tracker run."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_pretrain

pytestmark = pytest.mark.integration  # trackers read back in processes of their own

INSTALLED = [name for name in ("tensorboard", "wandb", "mlflow", "trackio") if importlib.util.find_spec(name)]
FIRST, LAST = 6, 9  # steps of the first attempt, then of the resumed run


def _tracker_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_DIR", "MLFLOW_TRACKING_URI", "TRACKIO_DIR")}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DISABLE_GIT="true", HF_HUB_OFFLINE="1")
    return env


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory, tok_dir: Path) -> Path:
    """A run of FIRST steps reporting to every installed tracker, then resumed (the trackers from its saved
    config) to LAST steps."""
    if not INSTALLED:
        pytest.skip("no tracker installed (pip install 'cramkit[tensorboard]', ...)")
    run = tmp_path_factory.mktemp("report") / "tracked"
    with pytest.MonkeyPatch.context() as mp:
        for key in ("WANDB_DIR", "MLFLOW_TRACKING_URI", "TRACKIO_DIR"):
            mp.delenv(key, raising=False)
        for key, value in _tracker_env().items():
            mp.setenv(key, value)
        every = ["--set", "train.log_every=1", "--set", "train.eval_every=never"]
        run_pretrain(run, "--tokenizer", str(tok_dir), *every, "--report-to", ",".join(INSTALLED), steps=FIRST)
        run_pretrain(run, "--resume", str(run), *every, steps=LAST)
    return run


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert sorted(losses) == list(range(1, LAST + 1))
    return losses


def _need(name: str) -> None:
    if name not in INSTALLED:
        pytest.skip(f"{name} is not installed (pip install 'cramkit[{name}]')")


def test_tensorboard_reads_back_the_losses(tracked: Path) -> None:
    _need("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tracked / "tb"))
    acc.Reload()
    got = {e.step: e.value for e in acc.Scalars("loss")}  # the resumed run's events in the same directory
    assert got == pytest.approx(_losses(tracked), rel=1e-6)
    assert "config/text_summary" in acc.Tags()["tensors"]  # the configuration, once


def test_mlflow_reads_back_the_losses_in_one_run(tracked: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _need("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    state = json.loads((tracked / "trackers.json").read_text())["mlflow"]
    client = MlflowClient(tracking_uri=(tracked / "mlruns").resolve().as_uri())
    runs = client.search_runs([client.get_experiment_by_name("cramkit").experiment_id])
    assert [r.info.run_id for r in runs] == [state["run_id"]]  # the resumed run continued the same run
    run = runs[0]
    assert run.info.run_name == "tracked" and run.info.status == "FINISHED"
    assert run.data.params["train.budget"] == f"{FIRST}steps"  # the configuration, once, at the start
    got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "loss")}
    assert got == pytest.approx(_losses(tracked), rel=1e-9)


def _wandb_records(path: Path) -> list:
    """The records of a .wandb file: W&B's header, then LevelDB log blocks of protobuf ``Record``s (wandb's own
    schema, wandb.proto)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block, records, pos, pending = path.read_bytes(), 32768, [], 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        if kind == 0 and length == 0:
            pos += room
            continue
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            rec = pb.Record()
            rec.ParseFromString(pending)
            records.append(rec)
            pending = b""
    return records


def test_wandb_offline_run_holds_the_losses(tracked: Path) -> None:
    _need("wandb")
    run_id = json.loads((tracked / "trackers.json").read_text())["wandb"]["id"]
    files = sorted((tracked / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2 and all(f.name == f"run-{run_id}.wandb" for f in files)  # one id, resumed
    got, names, config = {}, set(), {}
    for f in files:
        for rec in _wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
                if "loss" in items:
                    got[rec.history.step.num] = items["loss"]
            elif kind == "run":  # the run's name and its configuration, at the start
                names.add(rec.run.display_name)
                config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update if i.key})
    assert names == {"tracked"}
    assert config["train"]["report_to"] == ",".join(INSTALLED)  # (the resumed run's budget updates it)
    assert got == pytest.approx(_losses(tracked), rel=1e-9)


def test_trackio_local_store_holds_the_losses(tracked: Path) -> None:
    _need("trackio")
    read = (
        "import json; from trackio.sqlite_storage import SQLiteStorage; "
        "print(json.dumps(SQLiteStorage.get_logs('cramkit', 'tracked')))"
    )
    env = {**_tracker_env(), "TRACKIO_DIR": str(tracked / "trackio")}
    proc = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    got = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert got == pytest.approx(_losses(tracked), rel=1e-9)


def _cramkit(args: list[str], *, hide: str | None = None, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m cramkit ARGS`; ``hide``: a module made unimportable, as when it is not installed."""
    code = "import runpy, sys\n"
    if hide:
        code += f"sys.modules[{hide!r}] = None\n"
    code += f"sys.argv = ['cramkit', *{args!r}]\nrunpy.run_module('cramkit', run_name='__main__')\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=cwd)


def test_a_missing_tracker_names_its_extra_before_training(tmp_path: Path) -> None:
    args = ["pretrain", "--budget", "2steps", "--out", "r", "--report-to", "tensorboard,wandb"]
    proc = _cramkit(args, hide="wandb", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("cramkit: error:") and "pip install 'cramkit[wandb]'" in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()  # nothing started


def test_an_unknown_tracker_lists_the_choices(capsys: pytest.CaptureFixture) -> None:
    from cramkit.cli import main

    assert main(["finetune", "--from", "x", "--task", "glue/sst2", "--report-to", "tensorboard,neptune"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "cramkit: error: --report-to: unknown tracker 'neptune'; choose none, tensorboard, wandb, mlflow, trackio "
        "(several: comma-separated)"
    ]


def test_finetune_distill_and_eval_take_the_flag(capsys: pytest.CaptureFixture) -> None:
    _need("tensorboard")
    from cramkit.cli import main
    from cramkit.distillation.config import config_from

    assert main(["finetune", "--report-to", "tensorboard", "--print-config"]) == 0
    assert "report_to: tensorboard" in capsys.readouterr().out
    assert main(["finetune", "--objective", "simcse", "--report-to", "none", "--print-config"]) == 0
    assert "report_to: none" in capsys.readouterr().out
    assert main(["eval", "glue", "--from", "x", "--report-to", "tensorboard", "--print-config"]) == 0
    assert "report_to: tensorboard" in capsys.readouterr().out
    assert config_from({"report_to": "TensorBoard"}).report_to == "tensorboard"
    assert main(["eval", "sts", "--from", "x", "--data", "y", "--report-to", "wandb"]) == 2  # nothing trains
    assert "--report-to applies to the fine-tuning suites" in capsys.readouterr().err


def test_a_tracker_failing_mid_run_does_not_stop_training(
    tmp_path: Path, tok_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The Python facade's report_to=; the tracker's disk fails at the third record: one warning line, and the
    run finishes with every record in metrics.jsonl."""
    _need("tensorboard")
    import cramkit
    from conftest import TINY_MODEL_SETS

    calls = []

    def failing(self, tag, value, step=None, *args, **kwargs):
        calls.append(step)
        if step is not None and step >= 3:
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("torch.utils.tensorboard.SummaryWriter.add_scalar", failing)
    run = cramkit.pretrain(
        budget="5steps",
        out=tmp_path / "r",
        tokenizer=tok_dir,
        overrides=[*TINY_MODEL_SETS, "train.log_every=1", "train.progress=false", "train.eval_every=never"],
        report_to=["tensorboard"],
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5]
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "--report-to tensorboard failed (OSError" in warnings[0]
    assert max(calls) == 3  # dropped after its failure

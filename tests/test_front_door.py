"""One front door: the command line and the Python API resolve tasks and check outputs in the same library
code, so the same mistake gets the same line from both (and nothing is written)."""

from __future__ import annotations

import inspect

import pytest

import cramkit
from cramkit.errors import CramkitError
from infer.models import cli


def _same_line(args: list[str], call) -> str:
    proc = cli(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.startswith("cramkit: error: ")]
    assert len(lines) == 1, proc.stderr
    with pytest.raises(CramkitError) as exc:
        call()
    assert lines[0] == f"cramkit: error: {exc.value}"
    return str(exc.value)


def test_finetune_refuses_the_same_bad_out_from_both_doors(pretrained_run, glue_dir, tmp_path):
    taken = tmp_path / "notes.txt"
    taken.write_text("keep me")
    base = ["finetune", "--from", str(pretrained_run), "--task", "glue/sst2", "--data-dir", str(glue_dir)]

    def py(out):
        return lambda: cramkit.finetune(pretrained_run, task="glue/sst2", data_dir=glue_dir, out=out)

    said = _same_line([*base, "--out", str(taken)], py(taken))
    assert "is a file" in said and taken.read_text() == "keep me"
    inside = pretrained_run / "ft"
    said = _same_line([*base, "--out", str(inside)], py(inside))
    assert "which this command reads" in said and not inside.exists()
    said = _same_line(
        ["finetune", "--from", str(pretrained_run), "--train", str(taken)],
        lambda: cramkit.finetune(pretrained_run, train=taken),
    )
    assert "text column" in said
    said = _same_line(
        [*base, "--train", str(taken), "--text-a", "x"],
        lambda: cramkit.finetune(pretrained_run, task="glue/sst2", train=taken, text_a="x"),
    )
    assert "not both" in said


def test_the_python_verbs_have_typed_signatures():
    for verb in ("pretrain", "finetune", "evaluate", "predict", "export", "load"):
        sig = inspect.signature(getattr(cramkit, verb))
        assert not any(p.kind in (p.VAR_POSITIONAL,) for p in sig.parameters.values()), verb
        assert sig.return_annotation is not inspect.Signature.empty, verb
    assert "preset" in inspect.signature(cramkit.pretrain).parameters

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
    assert "cannot tell the format from the extension" in said  # (the text column is found from the header)
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


def test_print_config_and_config_files_round_trip(tmp_path):
    """--print-config prints what would run (nothing written); that file given back with --config is the same
    configuration; a bad file or a preset and a config together get one line."""
    import yaml

    proc = cli("pretrain", "--print-config", "--set", "train.lr=2e-3", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr
    printed = yaml.safe_load(proc.stdout)
    assert printed["train"]["lr"] == 2e-3 and printed["model"]["hidden"] == 256 and not (tmp_path / "run").exists()
    (tmp_path / "c.yaml").write_text(proc.stdout)
    again = cli("pretrain", "--config", str(tmp_path / "c.yaml"), "--print-config")
    assert again.returncode == 0 and again.stdout == proc.stdout
    both = cli("pretrain", "--config", str(tmp_path / "c.yaml"), "--preset", "tiny-cpu")
    assert both.returncode == 2 and "not both" in both.stderr
    ft = cli("finetune", "--print-config", "--set", "epochs=3", "--method", "ptuning")
    assert ft.returncode == 0, ft.stderr
    settings = yaml.safe_load(ft.stdout)["finetune"]
    assert settings["epochs"] == 3 and settings["method"] == "ptuning" and settings["lr"] == "auto"
    (tmp_path / "f.yaml").write_text(ft.stdout)
    mine = cli("finetune", "--config", str(tmp_path / "f.yaml"), "--set", "lr=1e-4", "--print-config")
    assert yaml.safe_load(mine.stdout)["finetune"] == {**settings, "lr": 1e-4}
    (tmp_path / "bad.yaml").write_text("epoch: 3\n")
    bad = cli("finetune", "--config", str(tmp_path / "bad.yaml"), "--print-config")
    assert bad.returncode == 2 and "did you mean 'epochs'" in bad.stderr and "Traceback" not in bad.stderr

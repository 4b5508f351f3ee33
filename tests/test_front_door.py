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


def test_every_verb_refuses_the_same_mistakes_from_both_doors(pretrained_run, glue_dir, tmp_path):
    """Mixtures, few-shot protocols, suites, the contrastive stage, distillation and embedding: the command line
    and the Python verb give the same line for the same mistake, and write nothing."""
    run, missing = str(pretrained_run), str(tmp_path / "no-such-model")
    ft = ["finetune", "--from", run, "--data-dir", str(glue_dir)]
    said = _same_line(
        [*ft, "--mixture", "glue/mrpc,glue/cola", "--task", "glue/sst2"],
        lambda: cramkit.finetune(run, mixture="glue/mrpc,glue/cola", task="glue/sst2"),
    )
    assert "not both" in said
    said = _same_line(
        [*ft, "--task", "glue/sst2", "--rates", "1,1"], lambda: cramkit.finetune(run, task="glue/sst2", rates="1,1")
    )
    assert "--rates applies to --mixture" in said
    said = _same_line(
        [*ft, "--mixture", "glue/mrpc,glue/cola", "--primary", "glue/sst2"],
        lambda: cramkit.finetune(run, mixture="glue/mrpc,glue/cola", primary="glue/sst2"),
    )
    assert "glue/sst2" in said
    said = _same_line(
        [*ft, "--task", "glue/sst2", "--few-shot", "8", "--fewshot-splits", "0"],
        lambda: cramkit.finetune(run, task="glue/sst2", few_shot=8, fewshot_splits="0"),
    )
    assert "two protocols" in said
    out = tmp_path / "mix"
    said = _same_line(
        [
            "finetune",
            "--from",
            missing,
            "--mixture",
            "glue/mrpc,glue/cola",
            "--data-dir",
            str(glue_dir),
            "--out",
            str(out),
        ],
        lambda: cramkit.finetune(missing, mixture="glue/mrpc,glue/cola", data_dir=glue_dir, out=out),
    )
    assert "no such directory" in said and not out.exists()
    said = _same_line(
        ["eval", "glue", "--from", missing, "--data-dir", str(glue_dir), "--out", str(out)],
        lambda: cramkit.evaluate(missing, glue_dir, out),
    )
    assert "no such directory" in said and not out.exists()
    said = _same_line(["eval", "glu", "--from", run], lambda: cramkit.evaluate(run, suite="glu"))
    assert "glue" in said
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"a": "one", "b": "two"}\n')
    said = _same_line(
        ["finetune", "--objective", "contrastive", "--from", missing, "--train", str(pairs), "--out", str(out)],
        lambda: cramkit.train_embeddings(missing, train=pairs, out=out),
    )
    assert "no such directory" in said and not out.exists()
    said = _same_line(
        ["distill", "--teacher", run, "--student", "bilsm", "--out", str(out)],
        lambda: cramkit.distill(run, student="bilsm", out=out),
    )
    assert "did you mean bilstm" in said and not out.exists()
    said = _same_line(
        ["distill", "--teacher", missing, "--student", "bilstm", "--task", "glue/sst2", "--data-dir", str(glue_dir)]
        + ["--out", str(out)],
        lambda: cramkit.distill(missing, student="bilstm", task="glue/sst2", data_dir=glue_dir, out=out),
    )
    assert "--teacher" in said and "no such directory" in said and not out.exists()
    text = tmp_path / "texts.txt"
    text.write_text("a line\n")
    said = _same_line(
        ["embed", str(text), "--from", missing, "--out", str(out)], lambda: cramkit.embed(text, missing, out)
    )
    assert "no such directory" in said and not out.exists()


def test_embed_and_evaluate_stay_verbs_beside_their_packages():
    """``cramkit.embed(...)`` is ``cramkit embed``'s verb, and ``cramkit.embed`` still the package of embedding at
    scale; ``cramkit.evaluate`` stays the suites' verb when the package cramkit.evaluate's modules are imported
    (in-process: whichever modules were imported first)."""
    import cramkit.embeddings.parquet
    import cramkit.evaluation.retrieval
    import cramkit.index  # imports modules of cramkit.embed: the verb stays
    from cramkit.api import evaluate
    from cramkit.embeddings.verb import embed_source
    from cramkit.evaluation.sts import evaluate_sts

    assert callable(cramkit.embed) and inspect.signature(cramkit.embed) == inspect.signature(embed_source)
    assert cramkit.embeddings.parquet.read_vectors is cramkit.embeddings.read_vectors
    assert cramkit.index.CramkitEmbedder is cramkit.embeddings.CramkitEmbedder
    assert cramkit.evaluate is evaluate and cramkit.evaluate_sts is evaluate_sts


@pytest.mark.integration
def test_the_verbs_are_one_function_each_and_distill_stays_a_package():
    """Every verb of the command line has its typed Python function; ``cramkit.distill`` is the verb and still
    the package (``import cramkit.distillation.core``); ``import cramkit`` imports no torch."""
    import subprocess
    import sys

    for verb in ("train_embeddings", "evaluate_sts", "evaluate_retrieval", "embed", "distill"):
        sig = inspect.signature(getattr(cramkit, verb))
        assert sig.return_annotation is not inspect.Signature.empty, verb
        assert not any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values()), verb
    assert "student" in inspect.signature(cramkit.distill).parameters
    code = (
        "import sys, cramkit; assert 'torch' not in sys.modules; import cramkit.distillation.core as c; "
        "from cramkit.distillation import DistillConfig; assert c.DistillConfig is DistillConfig is "
        "cramkit.distillation.DistillConfig; assert callable(cramkit.distill)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

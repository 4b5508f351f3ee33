"""One request per verb (``cramkit finetune``, ``cramkit eval``): the command line and the Python verb build the same
request, check its route rules in one method (the same line from both doors), decide the default output directory
in one method, and the processes of ``--nproc`` read the request the command parsed."""

from __future__ import annotations

from pathlib import Path

import pytest

import cramkit
from clirun import cli, one_line
from cramkit import request
from cramkit.cli import build_parser
from cramkit.errors import CramkitError
from cramkit.evaluation.request import EvalRequest
from cramkit.recipes.finetune_request import ContrastiveRequest, FinetuneRequest

MIX = "glue/mrpc,glue/cola"


def _same_line(argv: list[str], call) -> str:
    said = one_line(cli(*argv)).removeprefix("cramkit: error: ")
    with pytest.raises(CramkitError) as exc:
        call()
    assert str(exc.value) == said
    return said


@pytest.mark.parametrize(
    ("flags", "keywords", "needle"),
    [
        (["--mixture", MIX, "--unlabelled", "u.txt"], {"mixture": MIX, "unlabelled": "u.txt"}, "leave out --mixture"),
        (["--task", "glue/sst2", "--budget", "5m"], {"task": "glue/sst2", "budget": "5m"}, "--objective contrastive"),
        (
            ["--objective", "simcse", "--mixture", MIX],
            {"objective": "simcse", "mixture": MIX},
            "--mixture do not apply",
        ),
        (["--task", "glue/sst2", "--prefix-len", "4"], {"task": "glue/sst2", "prefix_len": 4}, "--method ptuning"),
        (["--task", "glue/sst2", "--seeds", "1,x"], {"task": "glue/sst2", "seeds": "1,x"}, "comma-separated"),
        (["--task", "glue/sst2", "--weighting", "sum"], {"task": "glue/sst2", "weighting": "sum"}, "--mixture"),
    ],
)
def test_a_route_rule_is_one_line_the_same_from_both_doors(tmp_path: Path, flags, keywords, needle) -> None:
    model = str(tmp_path / "model")
    said = _same_line(["finetune", "--from", model, *flags], lambda: cramkit.finetune(model, **keywords))
    assert needle in said and not list(tmp_path.iterdir())  # checked before anything is read or written


def test_eval_refuses_a_suites_flag_for_an_embedding_evaluation_from_both_doors(tmp_path: Path) -> None:
    model, data = str(tmp_path / "model"), str(tmp_path / "sts.tsv")
    said = _same_line(
        ["eval", "sts", "--from", model, "--data", data, "--seeds", "1"],
        lambda: cramkit.evaluate(model, suite="sts", data=data, seeds="1"),
    )
    assert said.startswith("--seeds applies to the fine-tuning suites")
    said = _same_line(["eval", "glue", "--from", model, "--k", "5"], lambda: cramkit.evaluate(model, k=5))
    assert said.startswith("--k applies to cramkit eval sts / retrieval")


def test_the_verbs_take_a_request_or_its_fields(tiny_run: Path, glue_dir: Path, tmp_path: Path) -> None:
    wrong = FinetuneRequest(tiny_run, task="glue/sst2", few_shot=8, fewshot_splits="0")
    with pytest.raises(CramkitError, match="two protocols") as exc:
        cramkit.finetune(wrong)
    with pytest.raises(CramkitError) as again:
        cramkit.finetune(tiny_run, task="glue/sst2", few_shot=8, fewshot_splits="0")
    assert str(exc.value) == str(again.value)
    with pytest.raises(CramkitError, match="unknown suite .glu."):
        cramkit.evaluate(EvalRequest(tiny_run, suite="glu"))
    settings = {"max_train_examples": 32, "max_eval_examples": 16, "min_steps": 0, "epochs": 1, "batch_size": 16}
    req = FinetuneRequest(
        tiny_run,
        task="glue/sst2",
        data_dir=str(glue_dir),
        seeds="3",
        out=tmp_path / "ft",
        progress=False,
        settings={**settings, "eval_every": "never"},
    )
    res = cramkit.finetune(req)
    assert res["dev_examples"] == {"dev": 16} and [s["seed"] for s in res["seeds"]] == [3]
    assert cramkit.load(tmp_path / "ft").kind == "classifier"


def test_each_route_decides_its_output_directory_in_one_place() -> None:
    one = FinetuneRequest("m", task="glue/sst2")
    assert one.out_dir() is None and one.out_dir(keep=True) == "finetune-glue-sst2"  # Python keeps no model
    assert FinetuneRequest("m", task="glue/sst2", few_shot=16).out_dir() == "finetune-glue-sst2-16shot"
    assert FinetuneRequest("m", task="clue/tnews", fewshot_splits="0-4").out_dir() == "finetune-clue-tnews-fewshot"
    assert FinetuneRequest("m", train="data/reviews.csv").out_dir(keep=True) == "finetune-reviews"
    assert FinetuneRequest("m", train="data/reviews.csv", name="mine").out_dir(keep=True) == "finetune-mine"
    mix = FinetuneRequest("m", mixture=MIX)
    assert mix.out_dir(mix.resolve()[1]) == "finetune-mrpc+cola"
    assert FinetuneRequest("m", task="glue/sst2", out=Path("x")).out_dir() == "x"
    assert EvalRequest("m", suite="GLUE").out_dir() == "eval-glue"
    assert EvalRequest("m", suite="sts", data="d").out_dir() == "eval-sts"
    pairs = ContrastiveRequest("m", train="data/pairs.tsv", objective="simcse")
    assert pairs.out_dir(pairs.resolve()) == "simcse-pairs"


def test_the_nproc_workers_read_the_request_the_command_parsed(tmp_path: Path) -> None:
    """``finetune --nproc N`` writes the request it checked; each process reads it (``--request FILE``) to the
    same request and the same settings; what cannot run on several processes is refused before any starts."""
    argv = ["finetune", "--from", "m", "--mixture", MIX, "--data-dir", "glue=a", "--data-dir", "clue=b"]
    argv += ["--seeds", "1,2", "--set", "lr=3e-5", "--set", "epochs=2", "--out", "o", "--no-progress"]
    req = request.from_args(FinetuneRequest, build_parser().parse_args(argv))
    written = tmp_path / "request.yaml"
    request.write_request(req, "finetune", written)
    assert request.read_request(FinetuneRequest, written, "finetune") == req
    printed = cli(*argv, "--print-config")
    assert printed.returncode == 0 and "lr: 3.0e-05" in printed.stdout
    assert cli("finetune", "--request", written, "--print-config").stdout == printed.stdout
    one_line(cli("finetune", "--from", "m", "--task", "glue/sst2", "--nproc", "2"), "--nproc needs --out DIR")
    one_line(
        cli("finetune", "--from", "m", "--task", "glue/sst2", "--unlabelled", "u.txt", "--nproc", "2", "--out", "o"),
        "--unlabelled self-trains one task in one process",
    )


def test_eval_help_before_the_suite_is_every_suites() -> None:
    """SUITE is required on the command line (``cramkit.evaluate``'s default, glue, is Python's only)."""
    assert cli("eval", "--help").stdout.startswith("usage: cramkit eval [-h]")
    assert cli("eval", "clue", "--help").stdout.startswith("usage: cramkit eval clue")
    assert "required: --from, SUITE" in cli("eval").stderr

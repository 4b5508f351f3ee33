"""One reader of the fine-tuning settings file for both doors: what `cramkit finetune --print-config` writes,
`cramkit.finetune(config=FILE)` (and `cramkit.evaluate`) reads, to the same settings; a bad file is the same line."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import cramkit
from cramkit.cli import main
from cramkit.errors import CramkitError
from cramkit.recipes.finetune_request import FinetuneRequest


def test_print_config_is_what_the_python_verbs_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["finetune", "--task", "glue/sst2", "--from", str(tmp_path / "none"), "--print-config"]
    assert main([*args, "--set", "lr=3e-5", "--set", "epochs=2", "--seeds", "4,5", "--method", "setfit"]) == 0
    written = tmp_path / "settings.yaml"
    written.write_text(capsys.readouterr().out)
    cfg = FinetuneRequest("x", config=written).finetune_config()
    assert (cfg.lr, cfg.epochs, cfg.seeds, cfg.method) == (3e-5, 2, [4, 5], "setfit")
    # the CLI reads the same file to the same settings
    assert main(["finetune", "--task", "glue/sst2", "--from", "x", "--config", str(written), "--print-config"]) == 0
    assert capsys.readouterr().out == written.read_text()
    # keywords on top of the file, as on the command line
    assert (
        dataclasses.replace(cfg, lr=1e-4)
        == FinetuneRequest("x", config=written, settings={"lr": 1e-4}).finetune_config()
    )
    # a bad file: one line naming it, from cramkit.finetune before anything is read
    bad = tmp_path / "bad.yaml"
    bad.write_text("finetune:\n  lr: [1, 2\n")
    with pytest.raises(CramkitError, match=str(bad)):
        cramkit.finetune(tmp_path / "none", task="glue/sst2", config=bad)

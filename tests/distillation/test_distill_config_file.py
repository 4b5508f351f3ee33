"""`cramkit distill --config FILE` reads what `--print-config` writes (the one settings-file reader,
cramkit.config.section_file, as finetune's), `--set` goes on top, and a bad file is one line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cramkit.cli import main


def test_print_config_then_config_gives_the_same_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["distill", "--teacher", str(tmp_path / "t"), "--student", "bilstm", "--out", str(tmp_path / "o")]
    assert main([*base, "--set", "epochs=5", "--set", "p_pos=0", "--print-config"]) == 0
    written = capsys.readouterr().out
    assert written.startswith("distill:\n") and "  epochs: 5" in written and "  p_pos: 0" in written
    settings = tmp_path / "distill.yaml"
    settings.write_text(written)
    assert main([*base, "--config", str(settings), "--print-config"]) == 0
    assert capsys.readouterr().out == written
    # --set on top of the file
    assert main([*base, "--config", str(settings), "--set", "epochs=2", "--print-config"]) == 0
    assert "  epochs: 2" in capsys.readouterr().out
    # a bad file and an unknown setting in it: one line each, nothing run
    bad = tmp_path / "bad.yaml"
    bad.write_text("distill:\n  epochs: [1\n")
    assert main([*base, "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(bad) in err[0]
    bad.write_text("distill:\n  epoch: 3\n")
    assert main([*base, "--config", str(bad), "--print-config"]) == 2
    assert "epoch" in capsys.readouterr().err

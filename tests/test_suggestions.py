"""What a mistyped command line gets back: one line naming the nearest command, flag or preset."""

from __future__ import annotations

import pytest

from cramkit.cli import main
from cramkit.recipes.evaluate import plus_minus


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["pretrian"], ["unknown command 'pretrian'; did you mean 'pretrain'?", "(commands: tokenizer, data,"]),
        (["xyzzy"], ["unknown command 'xyzzy' (commands: "]),
        (["finetune", "--text-column", "review"], ["did you mean --text-a (and --text-b for a pair's second text)?"]),
        (["pretrain", "--text-column", "review"], ["unknown option --text-column; did you mean --text-field?"]),
        (["pretrain", "--preset", "tiny", "--budget", "1steps"], ["did you mean 'tiny-cpu' or 'tiny-zh'?"]),
    ],
)
def test_a_mistyped_line_names_the_nearest(argv, needles, capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cramkit: error: ") and len(err.strip().splitlines()) == 1, err
    for needle in needles:
        assert needle in err, err


def test_help_is_a_command(capsys) -> None:
    assert main(["help"]) == 0
    assert "pretrain" in capsys.readouterr().out


def test_one_fewshot_split_shows_no_spread() -> None:
    assert plus_minus({"splits": ["0"], "std": 0.0}) == ""
    assert plus_minus({"splits": ["0", "1"], "std": 1.234}) == " ± 1.23"

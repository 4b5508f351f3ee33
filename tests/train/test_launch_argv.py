"""What the processes of ``--nproc N`` run: the command as typed without the launcher's flags."""

from __future__ import annotations

from cramkit.train.launch import without_flags

LAUNCHER = ("--nproc", "--nnodes", "--node-rank", "--rdzv-endpoint")


def test_the_launchers_flags_go_and_everything_else_stays() -> None:
    typed = ["pretrain", "docs.txt", "--nproc", "2", "--set", "train.lr=1e-3", "--nnodes=1", "--new-flag", "x"]
    assert without_flags(typed, LAUNCHER) == ["pretrain", "docs.txt", "--set", "train.lr=1e-3", "--new-flag", "x"]
    # argparse's abbreviations of them too (a worker given "--npro 2" would relaunch inside torchrun)
    assert without_flags(["finetune", "--npro", "2", "--node-r", "0", "--no-progress"], LAUNCHER) == [
        "finetune",
        "--no-progress",
    ]
    assert without_flags(["x", "--rdzv-endpoint=host:29400", "--nodes"], LAUNCHER) == ["x", "--nodes"]

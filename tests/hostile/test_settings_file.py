"""A crafted settings file and a costly setting (issue 66, items 8 and 9): ``--config FILE.yaml`` / ``--preset FILE``
of finetune, eval and pretrain bounded in size, depth, aliases and numbers before anything is built (a 303-byte alias
bomb once passed 3 GB), each refusal one short line naming the file and the key; ``--prefix-len`` bounded by the
memory deep prompts that long would take on this machine."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from clirun import cli, one_line
from cramkit.config import load_yaml, parse_overrides

BOMB = (  # the 303-byte "billion laughs": 9 ** 9 strings once expanded
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    "b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
    "c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
    "d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
    "e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]\n"
    "f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
    "g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]\n"
)

CASES: dict[str, tuple[bytes, tuple[str, ...]]] = {
    "bomb": (BOMB.encode(), ("a uses a YAML anchor or alias",)),
    "alias of a section": (b"train: &t {lr: 1}\nmodel: *t\n", ("train uses a YAML anchor",)),
    "deep flow": (b"train:\n  lr: " + b"[" * 5000 + b"]" * 5000 + b"\n", ("train.lr[0]", "nests over 8 levels")),
    "deep blocks": (
        "".join("  " * i + f"k{i}:\n" for i in range(12)).encode() + b"  " * 12 + b"x: 1\n",
        ("k0.k1.k2", "nests over 8 levels"),
    ),
    "invalid UTF-8": (b"train:\n  lr: 1\xff\xfe\n", ("is not UTF-8 text (byte 14)", "save it as UTF-8")),
    "UTF-16": ("train:\n  lr: 1\n".encode("utf-16"), ("is UTF-16 text",)),
    "binary": (bytes(range(256)) * 4, ("is a binary file",)),
    "5,000-digit integer": (b"train:\n  steps: " + b"7" * 5000 + b"\n", ("train.steps is a number of 5,000",)),
    "5,000-digit float": (b"lr: 0." + b"7" * 5000 + b"\n", ("lr is a number of 5,002",)),
    "tagged integer": (b'lr: !!int "' + b"7" * 5000 + b'"\n', ("lr is a number of 5,000",)),
    "2 MB": (b"note: " + b"x" * (2 << 20) + b"\n", ("is over 1 MiB",)),
    "a month 13": (b"train:\n  lr: 2001-13-01\n", ("holds a value that cannot be read", "month")),
    "a python tag": (b'lr: !!python/object/apply:os.system ["echo no"]\n', ("is not valid YAML",)),
    "long key": (b"k" * 900 + b": 1\n", ("a key of 900 characters",)),
    "longer key": (b"k" * 5000 + b": 1\n", ("is not valid YAML",)),
    "not a mapping": (b"- lr\n- 1\n", ("must hold a mapping",)),
    "a control character": (b"lr: \x07\n", ("is not valid YAML",)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_crafted_settings_file_is_one_short_line(name, tmp_path) -> None:
    data, needles = CASES[name]
    path = tmp_path / "settings.yaml"
    path.write_bytes(data)
    t0 = time.perf_counter()
    with pytest.raises(Exception) as err:
        load_yaml(path)
    assert type(err.value).__name__ in ("CramkitError", "_Alias") and time.perf_counter() - t0 < 10
    msg = str(err.value)
    assert str(path) in msg and "\n" not in msg and len(msg) < 400, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def _verbs(model: Path, path: Path, tmp_path: Path) -> dict[str, list]:
    return {
        "finetune --config": ["finetune", "--task", "glue/sst2", "--from", model, "--config", path],
        "eval --config": ["eval", "glue", "--from", model, "--config", path, "--out", tmp_path / "e"],
        "pretrain --config": ["pretrain", "--config", path, "--out", tmp_path / "p"],
        "pretrain --preset": ["pretrain", "--preset", path, "--out", tmp_path / "p"],
    }


@pytest.mark.parametrize("name", ["bomb", "deep flow", "invalid UTF-8", "UTF-16", "binary", "5,000-digit integer"])
def test_every_verb_that_reads_a_settings_file_refuses_it_in_one_line(name, pretrained_run, tmp_path) -> None:
    data, needles = CASES[name]
    path = tmp_path / "settings.yaml"
    path.write_bytes(data)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for verb, argv in _verbs(pretrained_run, path, tmp_path).items():
        line = one_line(cli(*argv), str(path), *needles)
        assert len(line) < 400, (verb, line)
        assert not (tmp_path / "p").exists() and not (tmp_path / "e").exists(), verb
    grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before  # KiB on Linux
    assert grown < 200_000, f"reading {name} grew this process by {grown:,} KiB"


def test_a_plain_settings_file_still_reads_and_set_values_stay_text(tmp_path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("train:\n  lr: 0.001\n  steps: 10\nmodel:\n  layers: [1, 2]\n", encoding="utf-8")
    assert load_yaml(path) == {"train": {"lr": 0.001, "steps": 10}, "model": {"layers": [1, 2]}}
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbflr: 1\n")
    assert load_yaml(tmp_path / "bom.yaml") == {"lr": 1}
    # --set: an alias-looking value is the text itself; a huge number is one line naming the key
    assert parse_overrides(["prompt=*great*", "x=&a 1", "lr=1e-3"]) == {"prompt": "*great*", "x": "&a 1", "lr": "1e-3"}
    proc = cli("finetune", "--task", "glue/sst2", "--from", tmp_path, "--set", "lr=" + "9" * 5000)
    one_line(proc, "--set lr is a number of 5,000 characters")


# ------------------------------------------------------------------ 9: --prefix-len bounded by its memory


def _train(tmp_path: Path) -> Path:
    train = tmp_path / "train.csv"
    rows = "".join(f"row {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(40))
    train.write_text("sentence,label\n" + rows)
    return train


@pytest.mark.parametrize("how", [("--prefix-len", "99999"), ("--set", "prefix_len=99999")])
def test_a_prefix_too_long_for_this_machine_is_one_line_before_training(
    how, pretrained_run, tmp_path, monkeypatch
) -> None:
    from cramkit import runtime

    monkeypatch.setattr(runtime, "machine_memory", lambda device: (8 << 30, "RAM"))  # an 8 GiB machine
    out = tmp_path / "ft"
    t0 = time.perf_counter()
    proc = cli("finetune", "--from", pretrained_run, "--train", _train(tmp_path), "--text-a", "sentence",
               "--method", "ptuning", "--out", out, "--no-progress", *how)  # fmt: skip
    line = one_line(proc, "--prefix-len 99,999", "GiB", "8.0 GiB of RAM", "at most", "fits here")
    assert time.perf_counter() - t0 < 20 and len(line) < 400
    assert not (out / "model.safetensors").exists()


def test_the_most_that_fits_is_accepted_and_one_more_is_not(pretrained_run, monkeypatch) -> None:
    import re

    import cramkit
    from cramkit import runtime
    from cramkit.errors import CramkitError
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.recipes.finetune_prompt import check_prefix_memory, prefix_bytes

    monkeypatch.setattr(runtime, "machine_memory", lambda device: (4 << 30, "RAM"))
    loaded = cramkit.load(pretrained_run)
    cfg = FinetuneConfig(method="ptuning", prefix_len=99_999, device="cpu")
    with pytest.raises(CramkitError) as err:
        check_prefix_memory(loaded, cfg)
    found = re.search(r"at most ([\d,]+) fits here", str(err.value))
    assert found is not None, str(err.value)
    most = int(found[1].replace(",", ""))
    assert 16 <= most < 99_999
    check_prefix_memory(loaded, FinetuneConfig(method="ptuning", prefix_len=most, device="cpu"))
    assert prefix_bytes(loaded, cfg, most + 1) > 0.8 * (4 << 30) >= prefix_bytes(loaded, cfg, most)
    with pytest.raises(CramkitError):
        check_prefix_memory(loaded, FinetuneConfig(method="ptuning", prefix_len=most + 1, device="cpu"))
    # the usual lengths pass on any machine that holds the model
    check_prefix_memory(loaded, FinetuneConfig(method="ptuning", prefix_len=128, device="cpu"))

"""Files cramkit reads back from its own folders, crafted (issue 66, items 4, 5 and 10): self-training's teacher-label
cache and its progress record, the embedding cache of the prior and the neighbours, the doctor's ceilings cache, any
JSON read back (bounded in size and depth), and an empty ``--unlabelled`` file. A bad cache is computed again with
one line saying so, and the labels equal a clean run's; a bad input is one line before anything trains."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import cramkit
from clirun import cli, one_line
from cramkit.distillation.teacher import teacher_key, teacher_logits
from cramkit.errors import CramkitError
from cramkit.io import BadJson, json_loads, read_json
from cramkit.readback import BadCache, read_array, read_progress
from cramkit.selftraining.prior import embed_rows

TEXTS = [f"a {w} film about {t}" for w in ("fine", "dull", "bright", "slow", "sharp") for t in "abcdefghij"]
CHUNK = 16


def _npy(arr: np.ndarray, **kw) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, **kw)
    return buf.getvalue()


def _header_only(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A .npy header claiming ``shape`` over a few bytes of data (a 3·10¹¹-row file is 2 KB)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue() + b"\0" * 64


def crafted_arrays(good: np.ndarray) -> dict[str, bytes]:
    """A complete cache's crafted or damaged forms, by name (``good`` the clean [rows, width] float32 array)."""
    n, w = good.shape
    nan, inf = good.copy(), good.copy()
    nan[3, 0], inf[5, -1] = np.nan, -np.inf
    return {
        "one column": _npy(good[:, :1].copy()),
        "wider": _npy(np.ones((n, w + 3), np.float32)),
        "fewer rows": _npy(good[:-1].copy()),
        "empty file": b"",
        "3e11-row header": _header_only((300_000_000_000, w)),
        "negative shape": _header_only((-5, w)),
        "cut short": _npy(good)[:-40],
        "NaN": _npy(nan),
        "infinity": _npy(inf),
        "float64": _npy(good.astype(np.float64)),
        "big-endian": _npy(good.astype(">f4")),
        "Fortran order": _npy(np.asfortranarray(good)),
        "a pickle": _npy(np.array([{"x": 1}] * n, dtype=object).reshape(n, 1), allow_pickle=True),
        "not npy": b"PK\x03\x04 a zip",
    }


@pytest.fixture(scope="module")
def teacher(ft_model: Path):
    return cramkit.load(ft_model)


@pytest.fixture(scope="module")
def clean_labels(teacher, tmp_path_factory) -> np.ndarray:
    root = tmp_path_factory.mktemp("clean-labels")
    got, done = _label(teacher, root)
    assert not done["cached"] and got.shape == (len(TEXTS), teacher.num_labels)
    return np.array(got)


def _label(teacher, root: Path):
    return teacher_logits(teacher, TEXTS, [None] * len(TEXTS), root, max_length=48, chunk=CHUNK, progress=False)


# ------------------------------------------------------------------ 4: the teacher's label cache


def test_a_crafted_label_cache_is_labelled_again_with_one_line(teacher, clean_labels, tmp_path, capsys) -> None:
    key = teacher_key(teacher, 48)
    for name, data in crafted_arrays(clean_labels).items():
        root = tmp_path / name.replace(" ", "-")
        root.mkdir()
        (root / f"teacher-{key}.npy").write_bytes(data)
        got, done = _label(teacher, root)
        err = capsys.readouterr().err
        assert not done["cached"] and done["rows_computed"] == len(TEXTS), name
        np.testing.assert_allclose(np.asarray(got), clean_labels, atol=1e-5, err_msg=name)
        said = [line for line in err.splitlines() if "damaged" in line]
        assert len(said) == 1 and f"teacher-{key}.npy" in said[0] and "computing it again" in said[0], (name, err)
        assert "Traceback" not in err
        # now a good cache: read back as it is, said nothing of
        again, done = _label(teacher, root)
        assert done["cached"] and "damaged" not in capsys.readouterr().err
        np.testing.assert_array_equal(np.asarray(again), np.asarray(got))


def _progress_cases(n: int) -> dict[str, bytes]:
    deep = "[" * 100_000 + "]" * 100_000
    return {
        "done past the rows": json.dumps({"done": 999_999, "rows": n}).encode(),
        "done null": json.dumps({"done": None, "rows": n}).encode(),
        "done a list": json.dumps({"done": [16], "rows": n}).encode(),
        "done a string": json.dumps({"done": "16", "rows": n}).encode(),
        "done negative": json.dumps({"done": -16, "rows": n}).encode(),
        "done true": json.dumps({"done": True, "rows": n}).encode(),
        "done a fraction": json.dumps({"done": 16.5, "rows": n}).encode(),
        "other rows": json.dumps({"done": 16, "rows": n + 1}).encode(),
        "not an object": b"[16]",
        "nested 100,000 deep": deep.encode(),
        "10 MB": b'{"done": 16, "rows": ' + str(n).encode() + b', "x": "' + b"x" * 10_000_000 + b'"}',
        "not UTF-8": b'{"done": \xff16}',
        "done but never written": json.dumps({"done": n, "rows": n}).encode(),  # zeros published as labels
    }


def test_a_crafted_progress_record_starts_the_labelling_over(teacher, clean_labels, tmp_path, capsys) -> None:
    key = teacher_key(teacher, 48)
    n, width = clean_labels.shape
    for name, state in _progress_cases(n).items():
        root = tmp_path / name.replace(" ", "-")
        root.mkdir()
        part = np.lib.format.open_memmap(root / f"teacher-{key}.partial.npy", "w+", np.float32, (n, width))
        part[:16] = clean_labels[:16]  # one chunk really done
        part.flush()
        del part
        (root / f"teacher-{key}.progress.json").write_bytes(state)
        got, done = _label(teacher, root)
        err = capsys.readouterr().err
        assert done["rows_computed"] == n and not done["resumed_from"], name
        np.testing.assert_allclose(np.asarray(got), clean_labels, atol=1e-5, err_msg=name)
        said = [line for line in err.splitlines() if "damaged" in line]
        assert len(said) == 1 and "Traceback" not in err, (name, err)
        assert len(said[0].replace(str(root), "")) < 300  # bounded, whatever the folder's path
        assert not (root / f"teacher-{key}.progress.json").exists()


def test_a_good_progress_record_resumes_and_a_crafted_partial_array_does_not(
    teacher, clean_labels, tmp_path, capsys
) -> None:
    key = teacher_key(teacher, 48)
    n, width = clean_labels.shape

    def partial(root: Path, data: bytes | None = None) -> None:
        root.mkdir()
        path = root / f"teacher-{key}.partial.npy"
        if data is None:
            arr = np.lib.format.open_memmap(path, "w+", np.float32, (n, width))
            arr[:32] = clean_labels[:32]
            arr.flush()
            del arr
        else:
            path.write_bytes(data)
        (root / f"teacher-{key}.progress.json").write_text(json.dumps({"done": 32, "rows": n}))

    partial(tmp_path / "good")
    got, done = _label(teacher, tmp_path / "good")
    assert done["resumed_from"] == 32 and done["rows_computed"] == n - 32
    np.testing.assert_allclose(np.asarray(got), clean_labels, atol=1e-5)
    assert "damaged" not in capsys.readouterr().err
    nan = clean_labels.copy()
    nan[7, 0] = np.nan
    for name, data in {
        "NaN in a done row": _npy(nan),
        "one column": _npy(clean_labels[:, :1].copy()),
        "3e11-row header": _header_only((300_000_000_000, width)),
        "empty": b"",
    }.items():
        root = tmp_path / name.replace(" ", "-")
        partial(root, data)
        got, done = _label(teacher, root)
        assert done["rows_computed"] == n, name
        np.testing.assert_allclose(np.asarray(got), clean_labels, atol=1e-5, err_msg=name)
        err = capsys.readouterr().err
        assert err.count("damaged") == 1 and "Traceback" not in err, (name, err)


def test_self_training_relabels_a_crafted_label_cache_to_the_clean_labels(
    tiny_run: Path, real_glue_dir: Path, tmp_path: Path
) -> None:
    """Through the real command: the teacher's cache crafted to one column (for two classes, once broadcast into
    meaningless labels) between two runs; the rerun says so in one line and labels the rows to the clean labels."""
    from selftraining.test_selftrain import _fewshot, sst2_unlabelled

    unlabelled = sst2_unlabelled(real_glue_dir, tmp_path / "unlabelled.tsv", n=120)
    out = tmp_path / "st"
    proc = _fewshot(tiny_run, real_glue_dir, out, unlabelled, "--splits", "1")
    assert proc.returncode == 0, proc.stderr
    (cache,) = (out / "split-0" / "labels").glob("*/teacher-*[0-9a-f].npy")
    clean = np.load(cache)
    cache.write_bytes(_npy(clean[:, :1].copy()))
    shutil.rmtree(out / "split-0" / "student", ignore_errors=True)
    (out / "split-0" / "results.json").unlink()
    again = _fewshot(tiny_run, real_glue_dir, out, unlabelled, "--splits", "1")
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("damaged") == 1 and cache.name in again.stderr and "Traceback" not in again.stderr
    np.testing.assert_allclose(np.load(cache), clean, atol=1e-5)


# ------------------------------------------------------------------ 4: the embedding cache


def test_a_crafted_embedding_cache_is_embedded_again(teacher, tmp_path, capsys) -> None:
    from cramkit.infer.engine import Engine

    engine = Engine(teacher, device="cpu", max_length=48)
    clean = embed_rows(engine, TEXTS, tmp_path / "clean", progress=False)
    assert clean.shape[0] == len(TEXTS)
    cases = crafted_arrays(clean)
    cases["longer than 1"] = _npy(clean * 3)
    key = teacher_key(teacher, 48)
    for name, data in cases.items():
        root = tmp_path / name.replace(" ", "-")
        root.mkdir()
        (root / f"embeddings-{key}-a.npy").write_bytes(data)
        got = embed_rows(engine, TEXTS, root, progress=False)
        err = capsys.readouterr().err
        np.testing.assert_allclose(got, clean, atol=1e-5, err_msg=name)
        said = [line for line in err.splitlines() if "damaged" in line]
        assert len(said) == 1 and "embedding cache" in said[0] and "Traceback" not in err, (name, err)
        np.testing.assert_allclose(embed_rows(engine, TEXTS, root, progress=False), clean, atol=1e-5)
        assert "damaged" not in capsys.readouterr().err  # the rebuilt cache is read back


def test_read_array_checks_the_header_against_the_size_before_mapping(tmp_path) -> None:
    good = np.arange(12, dtype=np.float32).reshape(6, 2)
    (tmp_path / "good.npy").write_bytes(_npy(good))
    np.testing.assert_array_equal(read_array(tmp_path / "good.npy", rows=6, width=2), good)
    for name, data in crafted_arrays(good).items():
        (tmp_path / "bad.npy").write_bytes(data)
        with pytest.raises(BadCache) as err:
            read_array(tmp_path / "bad.npy", rows=6, width=2, bound=1e6)
        assert "bad.npy" in str(err.value) and "\n" not in str(err.value), name
    (tmp_path / "p.json").write_text(json.dumps({"done": 3, "rows": 6}))
    assert read_progress(tmp_path / "p.json", 6) == 3


# ------------------------------------------------------------------ 5: every JSON read back, bounded


def test_json_read_back_is_bounded_in_depth_and_size(tmp_path) -> None:
    assert json_loads("[" * 64 + "]" * 64) is not None
    assert json_loads('{"a": "' + "[" * 500 + '"}') == {"a": "[" * 500}  # brackets in strings are text
    for text in ("[" * 65 + "]" * 65, '{"a":' * 200 + "1" + "}" * 200, "[{" * 50_000 + "}]" * 50_000):
        with pytest.raises(BadJson, match="nested too deep"):
            json_loads(text)
    big = tmp_path / "big.json"
    big.write_text('{"x": "' + "y" * (70 << 20) + '"}')
    with pytest.raises(CramkitError, match="big.json is not readable JSON \\(over ") as err:
        read_json(big, "rebuild it")
    assert len(str(err.value)) < 300


DEEP_CEILINGS = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    "crafted",
    [DEEP_CEILINGS, '{"a":' * 500 + "1" + "}" * 500, "[1]", "\udcff", "x" * (2 << 20)],
    ids=["deep", "nested objects", "a list", "not UTF-8", "2 MB"],
)
def test_a_damaged_ceilings_cache_is_ignored_with_one_line(crafted, monkeypatch, tmp_path, capsys) -> None:
    from cramkit import doctor

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(doctor, "_SAID", set())
    (tmp_path / "cramkit").mkdir()
    (tmp_path / "cramkit" / doctor.CEILINGS_FILE).write_text(crafted, encoding="utf-8", errors="surrogateescape")
    assert doctor.cpu_ceiling("fp32", 1) is None
    assert doctor.cpu_ceiling("bf16", 1) is None  # said once per process
    err = capsys.readouterr().err
    assert err.count("cramkit: the measured ceilings") == 1 and "ignored" in err and "cramkit doctor" in err


def test_doctor_measures_again_over_a_deeply_nested_ceilings_cache(monkeypatch, tmp_path) -> None:
    from cramkit import doctor

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(doctor, "_SAID", set())
    cache = tmp_path / "cramkit" / doctor.CEILINGS_FILE
    cache.parent.mkdir()
    cache.write_text(DEEP_CEILINGS)
    proc = cli("doctor", "--seconds", "0.01", "--tokens", "64", "--hidden", "64", "--intermediate", "128")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("measured ceilings") == 1 and "damaged" in proc.stderr
    assert doctor.cpu_ceiling("fp32", 1) is not None  # measured again and kept


def test_pretrain_over_a_deeply_nested_ceilings_cache(monkeypatch, tmp_path, tok_dir) -> None:
    from conftest import TINY_MODEL_SETS
    from cramkit import doctor

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(doctor, "_SAID", set())
    (tmp_path / "cache" / "cramkit").mkdir(parents=True)
    (tmp_path / "cache" / "cramkit" / doctor.CEILINGS_FILE).write_text(DEEP_CEILINGS)
    sets = [x for item in TINY_MODEL_SETS for x in ("--set", item)]
    proc = cli("pretrain", "--budget", "2steps", "--tokenizer", tok_dir, "--out", tmp_path / "run", *sets)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("measured ceilings") == 1


# ------------------------------------------------------------------ 10: an empty --unlabelled file


@pytest.mark.parametrize("content", ["", "\n\n  \n\t\n"], ids=["empty", "blank lines"])
def test_an_empty_unlabelled_file_is_one_line_before_anything_trains(
    content, tiny_run, real_glue_dir, tmp_path
) -> None:
    path = tmp_path / "unlabelled.txt"
    path.write_text(content, encoding="utf-8")
    out = tmp_path / "out"
    base = ["finetune", "--task", "glue/sst2", "--from", tiny_run, "--data-dir", real_glue_dir]
    for extra in (["--few-shot", "4"], []):
        proc = cli(*base, *extra, "--unlabelled", path, "--out", out)
        one_line(proc, str(path), "holds no text", "one text per line")
        assert not out.exists()

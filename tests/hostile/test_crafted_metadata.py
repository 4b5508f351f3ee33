"""Crafted metadata of the new surfaces: a Parquet part's schema metadata (`cramkit embed --join`), an
``embed.json`` and its parts (`cramkit index build` from Parquet embeddings), a shard's record
(`cramkit data join`), ``--prefix-len``: every number is checked before it sizes anything, every refusal is
one line naming the file (or flag) and the fix, exit 2, no traceback, and no index is published."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from clirun import cli, ok, one_line

PART0, PART1 = "part-00000-of-00002.parquet", "part-00001-of-00002.parquet"


@pytest.fixture(scope="module")
def lines(tmp_path_factory, builtin_docs) -> Path:
    rows = [" ".join(d.split()[:40]) for d in builtin_docs[:80] if len(d.split()) > 6][:40]
    path = tmp_path_factory.mktemp("lines") / "lines.txt"
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def parquet(tmp_path_factory, lines, pretrained_run) -> Path:
    """The lines embedded into two Parquet parts (`--shard 0/2`, `--shard 1/2`), joined."""
    out = tmp_path_factory.mktemp("emb") / "parquet"
    for i in range(2):
        ok("embed", lines, "--from", pretrained_run, "--out", out, "--format", "parquet", "--shard", f"{i}/2",
           "--device", "cpu")  # fmt: skip
    assert (out / "embed.json").is_file()
    return out


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _meta(part: Path) -> dict:
    return json.loads(pq.read_schema(part).metadata[b"cramkit"])


def _rewrite(folder: Path, name: str, table: pa.Table, meta: dict | None = None) -> None:
    """Write ``table`` as the part ``name`` (its cramkit metadata ``meta``, else the old part's) and record its
    new size and checksum in ``embed.json``: what an attacker does, so only the content is wrong."""
    meta = _meta(folder / name) if meta is None else meta
    table = table.replace_schema_metadata({b"cramkit": json.dumps(meta).encode()})
    pq.write_table(table, folder / name)
    _record(folder, name)


def _record(folder: Path, name: str) -> None:
    if not (folder / "embed.json").is_file():
        return
    m = json.loads((folder / "embed.json").read_text())
    for part in m["parts"]:
        if part["file"] == name:
            part["bytes"] = (folder / name).stat().st_size
            part["sha256"] = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "embed.json").write_text(json.dumps(m))


def _build(src: Path, encoder: Path, out: Path):
    return cli("index", "build", src, "--encoder", encoder, "--out", out, "--device", "cpu")


# ----------------------------------------------------------------------------------- embed --join (case 8)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"parts": 1e10}, "field 'parts' must be an integer from 1 to 99,999, got 10000000000.0"),
        ({"parts": 10**10}, "field 'parts' must be an integer from 1 to 99,999, got 10000000000"),
        ({"parts": "2"}, "field 'parts' must be an integer"),
        ({"parts": None}, "field 'parts' must be an integer"),
        ({"parts": [2]}, "field 'parts' must be an integer"),
        ({"parts": True}, "field 'parts' must be an integer"),
        ({"start": "0"}, "field 'start' must be an integer"),
        ({"end": "20"}, "field 'end' must be an integer"),
        ({"end": 10**12}, "field 'end' must be an integer"),
        ({"key": [1, 2]}, "field 'key' must be a string"),
        ({"dim": 1e3}, "field 'dim' must be an integer"),
        ({"rows_total": -1}, "field 'rows_total' must be an integer"),
        ({"part": 7}, "field 'part' must be an integer from 0 to 1"),
        ({"part": 1}, "says part 1 of 2, its name another"),
        ({"world_size": "1"}, "field 'world_size' must be an integer"),
    ],
)
def test_join_refuses_crafted_part_metadata(parquet, tmp_path, change, says) -> None:
    d = _copy(parquet, tmp_path / "e")
    (d / "embed.json").unlink()
    _rewrite(d, PART0, pq.read_table(d / PART0), _meta(d / PART0) | change)
    one_line(cli("embed", "--join", d), f"{d / PART0} (its cramkit schema metadata)", says, "embed its shard again")
    assert not (d / "embed.json").exists()


def test_join_refuses_a_part_whose_rows_or_columns_are_not_its_metadata(parquet, tmp_path) -> None:
    d = _copy(parquet, tmp_path / "e")
    (d / "embed.json").unlink()
    t = pq.read_table(d / PART0)
    _rewrite(d, PART0, t.slice(0, 3))  # fewer rows than its start..end
    one_line(cli("embed", "--join", d), f"{d / PART0} holds 3 rows, its record {t.num_rows}")
    _rewrite(d, PART0, t.drop_columns(["text"]).append_column("text", pa.array(range(t.num_rows), pa.int64())))
    one_line(cli("embed", "--join", d), f"{d / PART0}: column 'text' is of type int64, not string")


# ------------------------------------------------------------------------ embed.json in index build (case 9)


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("rows", "abc", "field 'rows' must be an integer"),
        ("rows", 1e12, "field 'rows' must be an integer"),
        ("rows", None, "field 'rows' must be an integer"),
        ("dim", 100, "column 'vector' is of type fixed_size_list<"),
        ("dim", "64", "field 'dim' must be an integer"),
        ("dim", 10**9, "field 'dim' must be an integer from 1 to 65,536"),
        ("encoder", ["x"], "field 'encoder' must be a JSON object"),
        ("pooling", "max", "field 'pooling' must be mean or cls"),
        ("prompt", 5, "field 'prompt' must be a string"),
    ],
)
def test_index_build_refuses_crafted_embed_json(parquet, pretrained_run, tmp_path, field, value, says) -> None:
    d = _copy(parquet, tmp_path / "e")
    m = json.loads((d / "embed.json").read_text())
    (d / "embed.json").write_text(json.dumps(m | {field: value}))
    out = tmp_path / "idx"
    one_line(_build(d, pretrained_run, out), says)
    assert not (out / "index.json").exists()


def test_rows_beyond_the_parts_publish_no_index(parquet, pretrained_run, tmp_path) -> None:
    d = _copy(parquet, tmp_path / "e")
    m = json.loads((d / "embed.json").read_text())
    (d / "embed.json").write_text(json.dumps(m | {"rows": m["rows"] + 5}))
    out = tmp_path / "idx"
    one_line(_build(d, pretrained_run, out), f"records {m['rows'] + 5} rows, its parts {m['rows']}")
    assert not (out / "index.json").exists()
    # a part's own row count raised too: its footer says otherwise
    m["parts"][0]["rows"] += 5
    (d / "embed.json").write_text(json.dumps(m | {"rows": m["rows"] + 5}))
    one_line(_build(d, pretrained_run, out), f"{d / PART0} holds {m['parts'][0]['rows'] - 5} rows, its record")
    assert not (out / "index.json").exists()
    # the honest folder builds an index that opens and answers
    ok("index", "build", parquet, "--encoder", pretrained_run, "--out", tmp_path / "good", "--device", "cpu")
    assert "1." in ok("index", "query", tmp_path / "good", "the", "-k", "1")


# ----------------------------------------------------------------------------- Parquet parts (case 10)


def _vectors(table: pa.Table, values: np.ndarray) -> pa.Table:
    dim = table.schema.field("vector").type.list_size
    col = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1).astype(np.float32)), dim)
    return table.set_column(table.schema.get_field_index("vector"), "vector", col)


def test_crafted_parts_are_refused_by_index_build(parquet, pretrained_run, tmp_path) -> None:
    t = pq.read_table(parquet / PART0)
    n, dim = t.num_rows, t.schema.field("vector").type.list_size
    ragged = pa.array([[0.5] * (dim if i % 2 else dim - 1) for i in range(n)], pa.list_(pa.float32()))
    cases = {
        "zeros": (None, f"{PART0} is not a readable Parquet file"),
        "no-vector": (t.drop_columns(["vector"]), "column 'vector' is missing"),
        "ragged": (t.set_column(1, "vector", ragged), "column 'vector' is of type list<"),
        "text-int64": (
            t.set_column(2, "text", pa.array(np.arange(n), pa.int64())),
            "column 'text' is of type int64, not string",
        ),
        "nan": (_vectors(t, np.full((n, dim), np.nan)), f"{PART0}: row 0 (id 0) holds NaN or infinite values"),
        "inf": (
            _vectors(t, np.where(np.arange(n)[:, None] == 3, np.inf, np.ones((n, dim)))),
            f"{PART0}: row 3 (id 3) holds NaN or infinite values (1 such rows)",
        ),
    }
    for name, (table, says) in cases.items():
        d = _copy(parquet, tmp_path / name)
        if table is None:  # the same size, all zeros: the size recorded still matches
            (d / PART0).write_bytes(bytes((d / PART0).stat().st_size))
        else:
            _rewrite(d, PART0, table)
        out = tmp_path / f"idx-{name}"
        one_line(_build(d, pretrained_run, out), str(d), says)
        assert not (out / "index.json").exists(), name


def test_read_vectors_refuses_nan_parts(parquet, tmp_path) -> None:
    from cramkit.embeddings import read_vectors
    from cramkit.errors import CramkitError

    d = _copy(parquet, tmp_path / "nan")
    t = pq.read_table(d / PART1)
    n, dim = t.num_rows, t.schema.field("vector").type.list_size
    _rewrite(d, PART1, _vectors(t, np.full((n, dim), np.nan)))
    with pytest.raises(CramkitError, match=r"part-00001-of-00002.parquet: row 0 \(id 20\) holds NaN"):
        read_vectors(d)


# ---------------------------------------------------------------------------------------- data join (case 11)


@pytest.fixture(scope="module")
def shards(tmp_path_factory, builtin_docs, tok_dir) -> Path:
    """Two shards of four text files (`cramkit data build --shard i/2`, one after the other in this process)."""
    base = tmp_path_factory.mktemp("shards")
    src = base / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.txt").write_text("\n\n".join(builtin_docs[i * 10 : i * 10 + 10]), encoding="utf-8")
    out = base / "store"
    for i in range(2):
        ok("data", "build", src, "--tokenizer", tok_dir, "--out", out, "--shard", f"{i}/2", "--workers", "1", "--quiet")
    return out


@pytest.mark.parametrize(
    "change, says",
    [
        ({"shard": {"count": 10**10}}, "field 'count' must be an integer from 1 to 99,999, got 10000000000"),
        ({"shard": {"count": 1e10}}, "field 'count' must be an integer from 1 to 99,999"),
        ({"shard": {"count": "2"}}, "field 'count' must be an integer"),
        ({"shard": {"count": 1}}, "is shard 1 of 1: no such shard"),
        ({"shard": {"files": [["a.txt"]]}}, "field 'files' must be a list of strings"),
        ({"shard": {"files": "a.txt"}}, "field 'files' must be a list of strings"),
        ({"num_sequences": None}, "field 'num_sequences' must be an integer"),
        ({"num_sequences": "12"}, "field 'num_sequences' must be an integer"),
        ({"num_sequences": 10**10}, "records 10000000000 sequences"),
        ({"num_tokens": 1.5}, "field 'num_tokens' must be an integer"),
        ({"max_token_id": [1]}, "field 'max_token_id' must be an integer"),
        ({"counts": {"documents": "12"}}, "(counts): field 'documents' must be an integer"),
        ({"counts": {"tokens": 1e10}}, "(counts): field 'tokens' must be an integer"),
        ({"counts": [1]}, "field 'counts' must be a JSON object"),
        ({"checksums": {"train-00001.bin": 5}}, "field 'checksums' must map file names to strings"),
        ({"dtype": None}, "field 'dtype' must be a string"),
    ],
)
def test_data_join_refuses_crafted_shard_records(shards, tmp_path, change, says) -> None:
    d = _copy(shards, tmp_path / "store")
    rec_file = d / "train-00001.json"
    rec = json.loads(rec_file.read_text())
    for key, value in change.items():
        rec[key] = rec[key] | value if isinstance(value, dict) and key == "shard" else value
    rec_file.write_text(json.dumps(rec))
    one_line(cli("data", "join", d), str(rec_file), says, "rebuild that shard")
    assert not (d / "train.json").exists()


def test_data_join_refuses_a_missing_count(shards, tmp_path) -> None:
    d = _copy(shards, tmp_path / "store")
    rec = json.loads((d / "train-00000.json").read_text())
    del rec["num_sequences"]
    (d / "train-00000.json").write_text(json.dumps(rec))
    one_line(cli("data", "join", d), f"{d / 'train-00000.json'}: field 'num_sequences' is missing")
    # the honest shards join
    assert "joined 2 shards" in ok("data", "join", _copy(shards, tmp_path / "good"))


# ------------------------------------------------------------------------------------- --prefix-len (case 14)


@pytest.mark.parametrize(
    "args",
    [
        ("--prefix-len", "100001"),
        ("--prefix-len", "1000000000"),
        ("--prefix-len", "0"),
        ("--set", "prefix_len=1e9"),
        ("--set", "prefix_len=100001"),
        ("--set", "prefix_len=true"),
    ],
)
def test_prefix_len_beyond_what_loads_is_one_line(pretrained_run, tmp_path, args) -> None:
    train = tmp_path / "train.csv"
    rows = "".join(f"row {i} is {'good' if i % 2 else 'bad'},{i % 2}\n" for i in range(40))
    train.write_text("sentence,label\n" + rows)
    out = tmp_path / "ft"
    proc = cli("finetune", "--from", pretrained_run, "--train", train, "--text-a", "sentence", "--method", "ptuning",
               "--out", out, "--no-progress", *args)  # fmt: skip
    says = {"0": "must be positive", "prefix_len=true": "finetune.prefix_len: expected an integer"}.get(
        args[-1], "must be an integer from 1 to 100,000"
    )
    one_line(proc, says)
    assert not out.exists() or not any(out.iterdir())


def test_prefix_classifier_refuses_what_it_cannot_allocate() -> None:
    from cramkit.errors import CramkitError
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import ClassifierConfig
    from cramkit.model.prompting import PrefixClassifier

    cfg = ModelConfig(vocab_size=100, hidden=1024, layers=4096, heads=16, intermediate=64)
    with pytest.raises(CramkitError, match=r"--prefix-len 100000: the prefixes alone need 3,125.0 GiB"):
        PrefixClassifier(cfg, 2, ClassifierConfig(), 100_000, encoder=torch_stub())
    with pytest.raises(CramkitError, match="must be an integer from 1 to 100,000, got 100001"):
        PrefixClassifier(cfg, 2, ClassifierConfig(), 100_001, encoder=torch_stub())


def torch_stub():
    from torch import nn

    return nn.Identity()


# ------------------------------------------------- the on-disk build's prepared state (a resumable writer's record)


def test_on_disk_build_refuses_a_crafted_part_count(builtin_docs, pretrained_run, tmp_path) -> None:
    docs = tmp_path / "docs.txt"
    docs.write_text("\n\n".join(d.replace("\n\n", "\n") for d in builtin_docs[:120]), encoding="utf-8")
    idx = tmp_path / "idx"
    build = ["index", "build", docs, "--encoder", pretrained_run, "--out", idx, "--on-disk", "--device", "cpu",
             "--chunk-tokens", "32", "--overlap", "0"]  # fmt: skip
    ok(*build, "--shard", "0/2")
    prepared = idx / ".build" / "ondisk" / "prepared.json"
    good = json.loads(prepared.read_text())
    for parts in (1e10, 10**10, "2", None, [2]):
        prepared.write_text(json.dumps(good | {"parts": parts}))
        one_line(cli(*build, "--shard", "1/2"), f"{prepared}: field 'parts' must be an integer", "remove it")
        assert not (idx / "index.json").exists()
    prepared.write_text(json.dumps(good))
    ok(*build, "--shard", "1/2")
    assert json.loads((idx / "index.json").read_text())["plan"]["on_disk"]

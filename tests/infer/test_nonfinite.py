"""issue 66, item 6: NaN or infinity never leaves a model as an answer. A weight table holding NaN or inf (a
crafted or broken export of every format, a model directory; the attacker rewrites the SHA-256s too) is
refused when the model is opened, in one line naming the file and the table; finite weights whose forward
pass overflows are a one-line error from `predict` and `embed` (exit 2), with nothing written. The server's
side (a 500 naming the model, the server up) is in tests/serve/test_base_route.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import cramkit
from clirun import one_line
from cramkit.backends.finite import NonFiniteOutput
from cramkit.infer import Engine

from .models import cli

TEXTS = ["the value of the key is returned", "a gorgeous, witty film", "a list of numbers"]
# a token the texts above hold (the overflow tests make its row of the word table huge)
HUGE_TOKEN = "value"


def crafted(good: Path, bad: Path, marker: str, change: Callable[[Path], None], key: str = "files") -> Path:
    """A copy of ``good`` at ``bad`` with its files changed by ``change(bad)``; every file's SHA-256 in the
    manifest ``marker`` (under ``key``) rewritten, as an attacker would."""
    shutil.copytree(good, bad)
    change(bad)
    man = json.loads((bad / marker).read_text())
    man[key] = {name: hashlib.sha256((bad / name).read_bytes()).hexdigest() for name in man[key]}
    (bad / marker).write_text(json.dumps(man))
    return bad


def _rows(tmp_path: Path, texts: list[str] = TEXTS) -> Path:
    rows = tmp_path / "rows.txt"
    rows.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return rows


def _refused_everywhere(bad: Path, tmp_path: Path, *said: str) -> None:
    """`predict` and `embed` of ``bad``: one line holding ``said`` (exit 2), nothing written."""
    rows = _rows(tmp_path)
    out = tmp_path / f"{bad.name}.predictions.jsonl"
    one_line(cli("predict", rows, "--from", bad, "--out", out), *said)
    assert not out.exists()
    emb = tmp_path / f"{bad.name}-emb"
    one_line(cli("embed", rows, "--from", bad, "--out", emb), *said)
    _unfinished(emb)


def _unfinished(emb: Path) -> None:
    """An embedding run that stopped: no embed.json (the mark of a finished one) and no NaN in what a resume
    would keep."""
    assert not (emb / "embed.json").exists()
    if (emb / "embeddings.npy").exists():
        assert np.isfinite(np.load(emb / "embeddings.npy")).all()


def _weights(model_dir: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = load_file(model_dir / "model.safetensors")
    tensors = {k: v.copy() for k, v in tensors.items()}
    edit(tensors)
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


WORD = "encoder.embeddings.word.weight"


# ------------------------------------------------------------------------------------------ at load


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_model_directory_with_nan_or_inf_weights_is_refused_at_load(ft_model, tmp_path, value) -> None:
    def poison(d: Path) -> None:
        _weights(d, lambda t: t[WORD].__setitem__((7, 3), value))

    bad = crafted(ft_model, tmp_path / "bad", "cramkit-model.json", poison, key="sha256")
    _refused_everywhere(bad, tmp_path, str(bad), WORD, "NaN or infinite", "train it again")
    # the server refuses to start with it, in the same line (before it listens)
    one_line(cli("serve", f"bad={bad}", "--port", "0", "--threads", "1"), str(bad), WORD, "NaN or infinite")


def test_an_onnx_export_with_a_nan_table_is_refused_at_load(ft_onnx, ft_onnx_int8, tmp_path) -> None:
    import onnx
    from onnx import numpy_helper

    def poison(d: Path) -> None:
        model = onnx.load(d / "model.onnx")
        floats = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
        table = max(floats, key=lambda t: int(np.prod(t.dims)))
        values = numpy_helper.to_array(table).copy()
        values.flat[5] = np.nan
        table.CopyFrom(numpy_helper.from_array(values, table.name))
        onnx.save(model, d / "model.onnx")

    for good in (ft_onnx, ft_onnx_int8):  # int8: the scales and the fp32 tables kept
        bad = crafted(good, tmp_path / f"bad-{good.name}", "cramkit-onnx.json", poison)
        _refused_everywhere(bad, tmp_path, "model.onnx", "NaN or infinite", "export the model again")


@pytest.fixture(scope="module")
def ft_openvino(ft_model, tmp_path_factory) -> Path:
    pytest.importorskip("openvino")
    return cramkit.export(ft_model, tmp_path_factory.mktemp("ov") / "ft-ov", format="openvino", progress=False)


@pytest.fixture(scope="module")
def ft_ct2(ft_model, tmp_path_factory) -> Path:
    pytest.importorskip("ctranslate2")
    return cramkit.export(ft_model, tmp_path_factory.mktemp("ct2") / "ft-ct2", format="ct2", progress=False)


def test_an_openvino_export_whose_word_table_is_nan_is_refused_at_load(ft_openvino, tmp_path) -> None:
    """The round's case: the word table of model.bin overwritten with NaN (the IR says where it lies)."""
    import xml.etree.ElementTree as ET

    from cramkit.backends.openvino import MANIFEST

    def poison(d: Path) -> None:
        net = ET.fromstring((d / "model.xml").read_text())
        data = next(
            layer.find("data")
            for layer in net.iter("layer")
            if layer.get("type") == "Const" and str(layer.get("name")).endswith("embeddings.word.weight")
        )
        assert data is not None and data.get("element_type") == "f32"
        offset, size = int(data.get("offset", "")), int(data.get("size", ""))
        blob = bytearray((d / "model.bin").read_bytes())
        blob[offset : offset + size] = np.full(size // 4, np.nan, np.float32).tobytes()
        (d / "model.bin").write_bytes(bytes(blob))

    bad = crafted(ft_openvino, tmp_path / "bad-ov", MANIFEST, poison)
    _refused_everywhere(bad, tmp_path, "model.bin", "embeddings.word.weight", "NaN or infinite")
    one_line(cli("serve", f"bad={bad}", "--port", "0", "--threads", "1"), "model.bin", "NaN or infinite")


def test_a_ctranslate2_export_with_a_nan_table_is_refused_at_load(ft_ct2, tmp_path) -> None:
    from safetensors.numpy import load_file, save_file

    from hostile.test_crafted import _ct2_variables, _ct2_write

    header, variables = _ct2_variables((ft_ct2 / "model.bin").read_bytes())

    def encoder(d: Path) -> None:
        out = []
        for name, shape, dtype, raw in variables:
            if name == "encoder/embeddings_0/weight":
                values = np.frombuffer(raw, np.float32).copy()
                values[11] = -np.inf
                raw = values.tobytes()
            out.append((name, shape, dtype, raw))
        (d / "model.bin").write_bytes(_ct2_write(header, out))

    def head(d: Path) -> None:
        tensors = {k: v.copy() for k, v in load_file(d / "head.safetensors").items()}
        tensors["classifier.weight"][0, 0] = np.nan
        save_file(tensors, str(d / "head.safetensors"))

    bad = crafted(ft_ct2, tmp_path / "bad-ct2", "cramkit-ct2.json", encoder)
    _refused_everywhere(bad, tmp_path, "model.bin", "encoder/embeddings_0/weight", "NaN or infinite")
    bad = crafted(ft_ct2, tmp_path / "bad-ct2-head", "cramkit-ct2.json", head)
    _refused_everywhere(bad, tmp_path, "head.safetensors", "classifier.weight", "NaN or infinite")


# ------------------------------------------------------------------------------------------ at answer time


def huge_row_model(ft_model: Path, out: Path) -> Path:
    """``ft_model`` with the word table's row of :data:`HUGE_TOKEN` at 3e38: every weight finite, but a text
    holding that token overflows to NaN in the forward pass (the other texts are answered as before)."""
    tid = cramkit.load(ft_model).tokenizer.token_to_id(HUGE_TOKEN)
    assert tid is not None

    def huge(d: Path) -> None:
        _weights(d, lambda t: t[WORD].__setitem__(tid, 3e38))

    return crafted(ft_model, out, "cramkit-model.json", huge, key="sha256")


def test_an_output_that_overflows_is_one_line_and_nothing_is_written(ft_model, tmp_path) -> None:
    bad = huge_row_model(ft_model, tmp_path / "huge")
    rows = _rows(tmp_path)
    out = tmp_path / "predictions.jsonl"
    one_line(cli("predict", rows, "--from", bad, "--out", out), str(bad), "NaN or infinite", "overflows")
    assert not out.exists()
    emb = tmp_path / "emb"
    one_line(cli("embed", rows, "--from", bad, "--out", emb), str(bad), "NaN or infinite")
    _unfinished(emb)
    # the texts without the token: answered, and every line of the file is JSON with finite numbers
    fine = _rows(tmp_path, [t for t in TEXTS if HUGE_TOKEN not in t])
    proc = cli("predict", fine, "--from", bad, "--out", out)
    assert proc.returncode == 0, proc.stderr
    for line in out.read_text().splitlines():
        rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in predictions.jsonl"))
        assert np.isfinite(list(rec["probabilities"].values())).all()


@pytest.mark.parametrize("runner", ["OnnxRunner", "OpenVinoRunner", "Ct2Runner"])
def test_every_backend_s_outputs_are_checked(runner, ft_onnx, ft_openvino, ft_ct2, tmp_path, monkeypatch) -> None:
    """A runtime that answers NaN (its output replaced here): the same one line from `predict` and `embed`,
    and from the Engine in Python a NonFiniteOutput naming the export."""
    from cramkit.backends import ct2, onnx, openvino

    module, export = {
        "OnnxRunner": (onnx, ft_onnx),
        "OpenVinoRunner": (openvino, ft_openvino),
        "Ct2Runner": (ct2, ft_ct2),
    }[runner]
    cls = getattr(module, runner)
    engine = Engine(export, threads=1)  # opened (and checked on load) before the runtime turns bad
    real_pooled, real_logits = cls.pooled, cls.logits

    def nan_pooled(self, x):
        mean, first = real_pooled(self, x)
        return np.full_like(mean, np.nan), first

    def inf_logits(self, x):
        logits = real_logits(self, x)
        logits[0, 0] = np.inf
        return logits

    monkeypatch.setattr(cls, "pooled", nan_pooled)
    monkeypatch.setattr(cls, "logits", inf_logits)
    with pytest.raises(NonFiniteOutput, match="NaN or infinite") as err:
        engine.embed(TEXTS)
    assert str(export) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(NonFiniteOutput):
        engine.classify(TEXTS)
    _refused_everywhere(export, tmp_path, str(export), "NaN or infinite")

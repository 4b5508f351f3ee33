"""Crafted OpenVINO exports: refused in one line before OpenVINO reads them, nothing read outside the directory
(the attacker rewrites the manifest's SHA-256s too)."""

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
from cramkit.backends.openvino import MANIFEST, MAX_XML_BYTES
from cramkit.errors import CramkitError

from .models import cli

pytest.importorskip("openvino")


@pytest.fixture(scope="module")
def good(tok, tmp_path_factory) -> Path:
    """A tiny BERT-shaped encoder (learned positions) exported to OpenVINO (an embedding model: kind encoder)."""
    import torch

    from cramkit.loading import LoadedModel
    from cramkit.model.encoder import ModelConfig
    from cramkit.model.heads import MaskedLM

    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=tok.get_vocab_size(), hidden=64, layers=2, heads=2, intermediate=128, position="learned"
    )
    loaded = LoadedModel(model=MaskedLM(cfg).eval(), kind="mlm", config=cfg, tokenizer=tok, source="tiny")
    return cramkit.export(loaded, tmp_path_factory.mktemp("ov-good") / "good", format="openvino", progress=False)


def _crafted(
    good: Path, bad: Path, xml: Callable[[str], str] | None = None, files: dict[str, bytes] | None = None
) -> Path:
    """A copy of ``good`` at ``bad`` with model.xml rewritten by ``xml`` and/or ``files`` (name -> bytes)
    replaced, their SHA-256 rewritten in the manifest."""
    shutil.copytree(good, bad)
    man = json.loads((bad / MANIFEST).read_text())
    files = dict(files or {})
    if xml is not None:
        files["model.xml"] = xml((good / "model.xml").read_text()).encode()
    for name, data in files.items():
        (bad / name).write_bytes(data)
        man["files"][name] = hashlib.sha256(data).hexdigest()
    (bad / MANIFEST).write_text(json.dumps(man))
    return bad


def _refused(bad: Path, said: str, tmp_path: Path) -> None:
    """cramkit.load raises one CramkitError holding ``said``; `cramkit embed` is one line, exit 2."""
    with pytest.raises(CramkitError) as err:
        cramkit.load(bad)
    assert said in str(err.value) and "\n" not in str(err.value), str(err.value)
    rows = tmp_path / "rows.txt"
    rows.write_text("the value of the key is returned\na list\n")
    one_line(cli("embed", str(rows), "--from", str(bad), "--out", str(tmp_path / f"emb-{bad.name}")), said)


def test_external_entities_and_document_types_are_refused(good, tmp_path) -> None:
    """An entity naming a file outside the export (or a billion-laughs bomb): refused before any XML parser
    sees the file."""
    secret = tmp_path / "secret.txt"
    secret.write_text("API_KEY=hunter2")

    def xxe(text: str) -> str:
        head, _, rest = text.partition("\n")
        decl = f'<!DOCTYPE net [<!ENTITY leak SYSTEM "file://{secret}">]>\n'
        return head + "\n" + decl + rest.replace('name="Model0"', 'name="&leak;"', 1)

    def laughs(text: str) -> str:
        head, _, rest = text.partition("\n")
        entities = '<!ENTITY a "ha">' + "".join(
            f'<!ENTITY {c} "&{p};&{p};&{p};&{p};">' for p, c in zip("abcdefg", "bcdefgh", strict=True)
        )
        return head + f"\n<!DOCTYPE net [{entities}]>\n" + rest

    for name, change in (("xxe", xxe), ("laughs", laughs)):
        _refused(_crafted(good, tmp_path / name, change), "declares a document type or entities", tmp_path)


def test_truncated_weights_and_files_that_are_not_ir_are_refused(good, tmp_path) -> None:
    weights = (good / "model.bin").read_bytes()
    _refused(
        _crafted(good, tmp_path / "short", files={"model.bin": weights[: len(weights) // 2]}),
        "of model.bin, which holds",
        tmp_path,
    )
    for name, data in (("html", b"<html><body>hi</body></html>"), ("text", b"not xml at all <")):
        _refused(_crafted(good, tmp_path / name, files={"model.xml": data}), "is not an OpenVINO IR", tmp_path)
    _refused(_crafted(good, tmp_path / "utf", files={"model.xml": b"\xff\xfe<net/>"}), "is not UTF-8", tmp_path)

    def offset(text: str) -> str:  # a constant pointing far past the weights
        return text.replace('offset="0"', f'offset="{10 * len(weights)}"', 1)

    _refused(_crafted(good, tmp_path / "offset", offset), "of model.bin, which holds", tmp_path)

    def unknown_op(text: str) -> str:  # well-formed IR, an operator OpenVINO does not have
        return text.replace('type="Gelu" version="opset7"', 'type="Shell" version="opset1"', 1).replace(
            'type="Gelu" version="opset2"', 'type="Shell" version="opset1"', 1
        )

    _refused(_crafted(good, tmp_path / "op", unknown_op), "OpenVINO cannot load it", tmp_path)


def test_a_huge_xml_is_refused_before_it_is_read(good, tmp_path) -> None:
    bad = _crafted(good, tmp_path / "huge")
    with open(bad / "model.xml", "r+b") as f:  # sparse: nothing is written, nothing need be read
        f.truncate(MAX_XML_BYTES + 1)
    _refused(bad, "more than the 32 MiB", tmp_path)


def test_manifest_paths_outside_the_directory_and_lies_are_refused(good, tmp_path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes((good / "model.bin").read_bytes())
    for name, change, said in (
        ("escape", {"files": {"../outside.bin": "x"}}, "points outside the directory"),
        ("nobin", {"files": {"model.xml": "x"}}, "'files' must list model.xml, model.bin"),
        ("tok", {"tokenizer": "../../etc"}, "tokenizer path points outside"),
        ("inputs", {"inputs": ["input_ids", "secret"]}, "'inputs' must be input_ids, attention_mask"),
        ("outputs", {"outputs": ["hidden"]}, "'outputs' must name mean, cls and/or logits"),
        ("long", {"max_length": 8000}, "max_length 8000 is beyond the model's 512 positions"),
        ("kind", {"kind": "mlm"}, "unknown kind"),
        ("hidden", {"hidden": 65}, "mean of shape [1, 64] where the manifest says [1, 65]"),
        ("pad", {"pad_id": 2**63}, f"pad_id {2**63} is outside"),
    ):
        bad = _crafted(good, tmp_path / name)
        man = json.loads((bad / MANIFEST).read_text())
        if name == "escape":  # a file listed beside the real ones
            change["files"] = {**man["files"], **change["files"]}
        man.update(change)
        (bad / MANIFEST).write_text(json.dumps(man))
        _refused(bad, said, tmp_path)
    link = _crafted(good, tmp_path / "link")
    (link / "model.bin").unlink()
    (link / "model.bin").symlink_to(outside)
    _refused(link, "is a symbolic link", tmp_path)
    # the good one still runs
    got = cramkit.infer.Engine(good).embed(["the value of the key is returned", "a list"])
    assert got.shape == (2, 64) and np.isfinite(got).all()


def test_a_tokenizer_larger_than_the_word_table_is_refused(good, tmp_path) -> None:
    """The tokenizer is not checksummed: one with more ids than model.xml's word table (OpenVINO would read
    the extra ids as zero vectors) is refused on load."""
    bad = _crafted(good, tmp_path / "vocab")
    spec = json.loads((bad / "tokenizer" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    vocab.update({f"zzextra{i}": len(vocab) + i for i in range(10)})
    (bad / "tokenizer" / "tokenizer.json").write_text(json.dumps(spec))
    _refused(bad, "the word table has 3000 rows, the tokenizer 3010 ids", tmp_path)

"""`cramkit export --force` replaces only what an export's own manifest lists (issue 50, case 2): a model two
levels down in --out (out/sub/model), a user's file, or anything added to an earlier export's directory is
never deleted; the refusal is one line naming it, and everything is left as it was."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from clirun import cli, one_line


def _digest(d: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in d.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(d)).encode() + f.read_bytes())
    return h.hexdigest()


def test_force_never_deletes_a_model_two_levels_down(ft_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(ft_model, out / "sub" / "model")
    (out / "notes.txt").write_text("mine\n")
    before = _digest(out)
    for args in ((), ("--force",), ("--format", "onnx", "--force")):
        line = one_line(cli("export", ft_model, "--out", out, *args), str(out), "--force or not")
        assert "other files (notes.txt, sub)" in line, line
    assert _digest(out) == before and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_earlier_export_is_replaced_only_when_it_holds_nothing_else(ft_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    assert cli("export", ft_model, "--out", out).returncode == 0
    manifest = json.loads((out / "cramkit_export.json").read_text())
    assert "config.json" in manifest["entries"] and "cramkit_export.json" in manifest["entries"]
    assert cli("export", ft_model, "--out", out).returncode == 0  # its own earlier export: replaced
    shutil.copytree(ft_model, out / "sub" / "model")  # a user's model put inside the export, two levels down
    before = _digest(out)
    for args in ((), ("--force",)):
        one_line(cli("export", ft_model, "--out", out, *args), "sub/", "did not write", "--force or not")
    assert _digest(out) == before
    shutil.rmtree(out / "sub")
    # an export written before manifests listed their entries: its top-level names vouch for it, no more
    manifest.pop("entries")
    (out / "cramkit_export.json").write_text(json.dumps(manifest))
    (out / "my-notes.md").write_text("mine\n")
    one_line(cli("export", ft_model, "--out", out, "--force"), "my-notes.md", "did not write")
    (out / "my-notes.md").unlink()
    assert cli("export", ft_model, "--out", out).returncode == 0


def test_force_replaces_an_export_of_another_format(ft_model: Path, ft_onnx: Path, tmp_path: Path) -> None:
    out = tmp_path / "onnx"
    shutil.copytree(ft_onnx, out)
    before = _digest(out)
    one_line(cli("export", ft_model, "--out", out), "an ONNX export", "pass --force")
    (out / "extra").mkdir()
    (out / "extra" / "keep.txt").write_text("mine\n")
    one_line(cli("export", ft_model, "--out", out, "--force"), "extra/", "did not write")
    shutil.rmtree(out / "extra")
    assert _digest(out) == before
    proc = cli("export", ft_model, "--out", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert "holds an export of another format" in proc.stderr
    assert (out / "cramkit_export.json").is_file() and not (out / "cramkit-onnx.json").exists()

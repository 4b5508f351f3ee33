"""The documentation's commands are true: README.md and docs/*.md are read, and what they show is checked
against the real code.

- Every ``cramkit ...`` line of a ```bash block (also after ``torchrun ... -m cramkit``, after ``&&``, with
  ``\\`` continuations joined) parses with the real argument parser (``cramkit.cli.build_parser``): a verb
  that exists, the arguments it requires, and every ``--flag`` spelled exactly as the parser has it (argparse
  would accept an abbreviation, so a renamed flag whose old name is a prefix of the new one is caught here).
- The cheap ones run for real, in-process, in an empty directory: ``cramkit --help``,
  ``cramkit finetune --list-tasks``, every documented ``finetune`` / ``eval`` line with ``--print-config``
  (which checks its ``--set`` keys, ``--config`` file and flags without reading data), and every documented
  ``pretrain`` line's preset, budget and ``--set`` settings through ``cramkit pretrain --print-config`` (with
  ``--from`` and no preset: through the ``continue`` preset's ``resolve_config``). A
  line's ``> FILE`` is written, so that a later documented line can read it (``--config FILE``).
- ``cramkit distill`` lines: their ``--set`` settings are checked by the distillation config.
- Every ``--set KEY=`` in a code span or a bash block names a real setting (pretraining's ``section.key``,
  fine-tuning's or distillation's ``key``).
- Inline code spans that start with ``cramkit VERB``: their ``--flags`` exist on that verb.
- Every ``--flag`` in a code span or a bash block exists on some cramkit verb (a ``bench/SCRIPT.py`` span's:
  in that script), or is another tool's flag listed in OTHER_TOOLS_FLAGS.
- ```python blocks compile; the cramkit names they import exist; calls of cramkit's functions bind to their
  signatures (keywords that go to ``**settings`` must be fine-tuning settings).
- ```yaml blocks parse; one whose first line is ``# cramkit VERB --config`` runs as that verb's
  ``--config`` file. ```toml blocks parse.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import importlib
import inspect
import io
import re
import shlex
from pathlib import Path

import pytest
import yaml

from cramkit import cli
from cramkit.errors import CramkitError

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# flags of other programs that the pages show (torchrun, tensorboard, pip, ...), not cramkit's
OTHER_TOOLS_FLAGS = {"--nproc_per_node", "--logdir", "--check"}
# documented command lines whose arguments are placeholders that cannot parse (keep this small)
PLACEHOLDER_LINES: set[str] = set()
# `--set KEY=` spellings that stand for any setting
PLACEHOLDER_SETTINGS = {"section.key", "KEY"}
# pretrain flags that need a model, a run or text on disk: dropped before the real --print-config run
PRETRAIN_NEEDS_FILES = ("init", "inherit", "extend_vocab", "tokenizer", "resume", "inputs")


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclasses.dataclass
class Command:
    where: str
    text: str  # the documented line, continuations joined
    argv: list[str]  # after `cramkit`
    redirect: str | None = None  # `> FILE`


def _blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page (indented ones too), with their language."""
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
            body.append(lines[i])
            i += 1
        out.append(Block(page, start + 1, m.group(1), "\n".join(body)))
        i += 1
    return out


BLOCKS = [b for page in PAGES for b in _blocks(page)]


def _prose(page: Path) -> str:
    """A page without its fenced blocks."""
    text = page.read_text(encoding="utf-8")
    return re.sub(r"^\s*```\w*\s*$.*?^\s*```\s*$", "", text, flags=re.S | re.M)


def _spans(page: Path) -> list[str]:
    """Inline code spans of a page's prose (single backticks; a span may wrap a line)."""
    return [s.replace("\n", " ") for s in re.findall(r"(?<!`)`([^`]+)`(?!`)", _prose(page))]


def _commands(block: Block) -> list[Command]:
    """The cramkit command lines of a bash block."""
    out: list[Command] = []
    logical: list[str] = []
    pending = ""
    for raw in block.text.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        logical.append(pending + raw)
        pending = ""
    for line in logical:
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        tokens = shlex.split(line, comments=True)
        parts: list[list[str]] = [[]]
        for tok in tokens:
            if tok in ("&&", "||", ";"):
                parts.append([])
            else:
                parts[-1].append(tok)
        for words in parts:
            if words[:1] == ["torchrun"] and "-m" in words:
                words = words[words.index("-m") + 1 :]
            elif words[:3] == ["python", "-m", "cramkit"]:
                words = words[2:]
            if words[:1] != ["cramkit"]:
                continue
            redirect = None
            if ">" in words:
                k = words.index(">")
                redirect, words = words[k + 1], words[:k]
            out.append(Command(block.where, line.split("#", 1)[0].strip(), words[1:], redirect))
    return out


COMMANDS = [c for b in BLOCKS if b.lang in ("bash", "sh", "shell") for c in _commands(b)]


def _verb(argv: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    return cli._verb_parser(cli.build_parser(), argv)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


def _all_flags() -> set[str]:
    flags: set[str] = set()

    def walk(p: argparse.ArgumentParser) -> None:
        flags.update(_options(p))
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    walk(sub)

    walk(cli.build_parser())
    return flags


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


def test_the_pages_have_commands() -> None:
    pages = {c.where.split(":")[0] for c in COMMANDS}
    assert "README.md" in pages and len(COMMANDS) > 80, (len(COMMANDS), sorted(pages))
    stale = PLACEHOLDER_LINES - {c.text for c in COMMANDS}
    assert not stale, f"PLACEHOLDER_LINES no page shows any more: {sorted(stale)}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: f"{c.where} {' '.join(c.argv[:2])}")
def test_documented_command_parses(cmd: Command) -> None:
    if cmd.text in PLACEHOLDER_LINES:
        pytest.skip("placeholder arguments")
    parser = cli.build_parser()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            args = parser.parse_args(cmd.argv)
        except SystemExit as exc:
            if exc.code == 0 and {"--help", "-h", "--version"} & set(cmd.argv):
                return
            pytest.fail(f"{cmd.where}: `cramkit {' '.join(cmd.argv)}` does not parse: {err.getvalue().strip()}")
    assert getattr(args, "func", None), f"{cmd.where}: `cramkit {' '.join(cmd.argv)}` names no complete verb"
    verb, words = _verb(cmd.argv)
    known = _options(verb)
    for tok in cmd.argv:
        flag = tok.split("=", 1)[0]
        if flag.startswith("--") and flag != "--":
            assert flag in known, f"{cmd.where}: `cramkit {' '.join(words)}` has no flag {flag} (exact spelling)"


def _inline_commands() -> list[tuple[str, str]]:
    return [
        (page.relative_to(ROOT).as_posix(), span)
        for page in PAGES
        for span in _spans(page)
        if re.match(r"cramkit [a-z]", span)
    ]


@pytest.mark.parametrize(("page", "span"), _inline_commands())
def test_inline_command_flags_exist(page: str, span: str) -> None:
    words = shlex.split(span.replace("...", ""))[1:]
    verb, names = _verb(words)
    assert names, f"{page}: `{span}` names no verb"
    known = _options(verb)
    for tok in words:
        flag = tok.split("=", 1)[0]
        if flag.startswith("--"):
            assert flag in known, f"{page}: `{span}`: `cramkit {' '.join(names)}` has no flag {flag}"


def test_every_documented_flag_exists() -> None:
    flags = _all_flags() | OTHER_TOOLS_FLAGS
    missing = []
    for page in PAGES:
        code = _spans(page) + [b.text for b in _blocks(page) if b.lang in ("bash", "sh", "shell", "")]
        for text in code:
            script = re.match(r"(?:python )?(bench/\w+\.py)", text)
            for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9_-]*", text):
                if script:  # a benchmark's own flag: the script defines it
                    if f'"{flag}"' not in (ROOT / script.group(1)).read_text(encoding="utf-8"):
                        missing.append(f"{page.relative_to(ROOT)}: {script.group(1)} {flag}")
                elif flag not in flags:
                    missing.append(f"{page.relative_to(ROOT)}: {flag}")
    assert not missing, "flags no cramkit verb has:\n" + "\n".join(sorted(set(missing)))


def test_every_documented_setting_exists() -> None:
    """Every ``--set KEY=...`` in a code span or bash block names a real setting: ``section.key`` of
    pretraining, or a fine-tuning or distillation key (values are not checked here: they may be
    placeholders)."""
    known = set(cli._setting_keys("pretrain")) | set(cli._setting_keys("finetune")) | set(cli._setting_keys("distill"))
    missing = []
    for page in PAGES:
        code = _spans(page) + [b.text for b in _blocks(page) if b.lang in ("bash", "sh", "shell", "")]
        for text in code:
            for key in re.findall(r"--set ([\w.]+)=", text):
                if key not in PLACEHOLDER_SETTINGS and key.removeprefix("finetune.") not in known:
                    missing.append(f"{page.relative_to(ROOT)}: --set {key}=")
    assert not missing, "settings that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_cheap_commands_run(tmp_path, monkeypatch, capsys) -> None:
    """--help, --list-tasks, and every documented finetune / eval / pretrain line's settings through
    --print-config, in the order the pages give them (a `> FILE` is written for the lines after it)."""
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(["--help"], capsys)
    assert code == 0 and "pretrain" in out and "finetune" in out
    code, out, _ = _run(["finetune", "--list-tasks"], capsys)
    assert code == 0 and "glue/sst2" in out and "mixtures" in out
    ran = {"finetune": 0, "eval": 0, "pretrain": 0, "distill": 0}
    failed: list[str] = []
    from cramkit.config import parse_overrides
    from cramkit.distillation.config import config_from as distill_config
    from cramkit.train.config import resolve_config

    for cmd in COMMANDS:
        if cmd.text in PLACEHOLDER_LINES or not cmd.argv or cmd.argv[0] not in ran:
            continue
        args = cli.build_parser().parse_args(cmd.argv)
        verb = cmd.argv[0]
        if verb == "distill":
            try:
                distill_config(parse_overrides(args.overrides))
            except CramkitError as exc:
                failed.append(f"{cmd.where}: distill {args.overrides}: {exc}")
            ran[verb] += 1
            continue
        if verb == "finetune" and args.list_tasks:
            continue
        if verb == "pretrain":
            if args.resume:
                continue  # needs an earlier run
            preset = args.preset or args.config
            if preset is None and args.init:  # the continue preset wants the model: check its settings alone
                budget = [f"train.budget={args.budget}"] if args.budget else []
                try:
                    resolve_config("continue", [*args.overrides, *budget])
                except CramkitError as exc:
                    failed.append(f"{cmd.where}: pretrain --from {args.overrides}: {exc}")
                ran[verb] += 1
                continue
            argv = ["pretrain", *(["--preset", preset] if preset else [])]
            argv += ["--budget", args.budget] if args.budget else []
            for item in args.overrides:
                argv += ["--set", item]
        else:
            argv = [a for a in cmd.argv]
        if "--print-config" not in argv:
            argv.append("--print-config")
        code, out, err = _run(argv, capsys)
        if code != 0 or not out.strip():
            failed.append(f"{cmd.where}: `cramkit {' '.join(argv)}` failed ({code}): {err.strip()}")
            continue
        yaml.safe_load(out)
        if cmd.redirect:
            Path(cmd.redirect).write_text(out, encoding="utf-8")
        ran[verb] += 1
    assert not failed, "documented commands that fail:\n" + "\n".join(failed)
    assert all(ran.values()), ran


def _python_blocks() -> list[Block]:
    return [b for b in BLOCKS if b.lang == "python"]


def _fields_of(cls_path: str) -> set[str]:
    module, _, name = cls_path.rpartition(".")
    return {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))}


# functions whose **kwargs are settings of a config class
SETTINGS_OF = {
    "cramkit.finetune": "cramkit.recipes.finetune_config.FinetuneConfig",
    "cramkit.evaluate": "cramkit.recipes.finetune_config.FinetuneConfig",
    "cramkit.train_embeddings": "cramkit.recipes.contrastive_config.ContrastiveConfig",
}


@pytest.mark.parametrize("block", _python_blocks(), ids=lambda b: b.where)
def test_python_blocks_compile_and_name_real_api(block: Block) -> None:
    tree = ast.parse(compile(block.text, block.where, "exec", ast.PyCF_ONLY_AST))
    names: dict[str, object] = {}  # local name -> the cramkit object it stands for
    qualified: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "cramkit":
                    names[alias.asname or alias.name] = importlib.import_module(alias.name)
                    qualified[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "cramkit":
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{block.where}: {node.module} has no {alias.name}"
                names[alias.asname or alias.name] = getattr(module, alias.name)
                qualified[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, dotted = None, None
        if isinstance(node.func, ast.Name) and node.func.id in names:
            func, dotted = names[node.func.id], qualified[node.func.id]
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
            base = names.get(node.func.value.id)
            if inspect.ismodule(base):
                assert hasattr(base, node.func.attr), f"{block.where}: {base.__name__} has no {node.func.attr}"
                func, dotted = getattr(base, node.func.attr), f"{base.__name__}.{node.func.attr}"
        if func is None or not callable(func) or inspect.ismodule(func):
            continue
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            continue
        try:
            sig = inspect.signature(func)
        except ValueError:  # a builtin's (an exception class): nothing to bind against
            continue
        try:
            bound = sig.bind(*[None] * len(node.args), **{k.arg: None for k in node.keywords})
        except TypeError as exc:
            pytest.fail(f"{block.where}: {dotted}(...) does not match its signature {sig}: {exc}")
        extra = next((p for p in sig.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD), None)
        if extra is not None and dotted in SETTINGS_OF:
            unknown = set(bound.arguments.get(extra.name, {})) - _fields_of(SETTINGS_OF[dotted])
            assert not unknown, f"{block.where}: {dotted}: {sorted(unknown)} are not settings"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in ("yaml", "toml")], ids=lambda b: b.where)
def test_config_blocks(block: Block, tmp_path, monkeypatch, capsys) -> None:
    if block.lang == "toml":
        pytest.importorskip("tomllib").loads(block.text)  # Python 3.11 and later
        return
    data = yaml.safe_load(block.text)
    assert isinstance(data, dict), f"{block.where}: not a mapping"
    m = re.match(r"#\s*cramkit (\w+) --config", block.text)
    if not m:
        return
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(block.text, encoding="utf-8")
    code, out, err = _run([m.group(1), "--config", "c.yaml", "--print-config"], capsys)
    assert code == 0, f"{block.where}: cramkit {m.group(1)} --config refuses it: {err.strip()}"

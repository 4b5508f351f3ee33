"""What ``cramkit finetune`` and ``cramkit.finetune`` take, and the contrastive stage's ``cramkit.train_embeddings``,
declared once (:mod:`cramkit.request`): the command line's flags, the functions' keywords and the request file
torchrun's workers read come from here, and so do the route rules (which flags combine) and the default output
directory both doors use. :class:`Recipe` (the fine-tuning settings, few labels) is shared with ``cramkit eval``."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cramkit.errors import CramkitError
from cramkit.loading import LoadedModel
from cramkit.recipes import DEV_FRACTION, FEWSHOT_SPLITS
from cramkit.request import Training, param

if TYPE_CHECKING:
    from cramkit.recipes.contrastive_config import ContrastiveConfig
    from cramkit.recipes.finetune_config import FinetuneConfig
    from cramkit.tasks.mixtures import Mixture
    from cramkit.tasks.registry import Task
else:  # the settings classes import the engine; the flags' generator (typing.get_type_hints) reads them as objects
    ContrastiveConfig = FinetuneConfig = object

FEW = "few labels: prompts (PET / LM-BFF), deep prompts (P-tuning v2), SetFit"
FILES = "a task from your own files (instead of --task)"
EMBED = "an encoder that embeds: the contrastive stage (instead of a classifier)"
SETTINGS_HELP = (
    "override a fine-tuning setting, e.g. --set lr=2e-5 --set epochs=3; others: batch_size, max_length, warmup, "
    "weight_decay, dropout, pooling (auto|cls|mean), max_train_examples (use only the first N training rows; 0 = all), "
    "label_names (0=negative,1=positive: what the model answers), prior (LABEL=TEXT,...: the classes described), "
    "device, precision (an unknown key lists them all)"
)
# resolve_task's keywords, the request's fields of the same names
FILE_TASK = ("data_dir", "train", "dev", "test", "text_a", "text_b", "label", "regression", "name", "dev_fraction")
NEEDS_SOURCE = "cramkit finetune needs --from MODEL (a run directory, a model directory or hf:DIR)"


@dataclass(kw_only=True)
class TaskData:
    """What to train on (finetune, the contrastive stage): a registered task, or the user's files."""

    task: str | None = param(None, help="registered task name, e.g. glue/sst2 (see --list-tasks)")
    data_dir: list[str] | str | os.PathLike | None = param(
        None,
        metavar="[SUITE=]DIR",
        help="the benchmark's folder (GLUE: DIR/SST-2/train.tsv, ...; default $CRAMKIT_GLUE_DIR; CLUE: DIR/tnews/"
        "train.json or FewCLUE's DIR/eprstmt/train_0.json, default $CRAMKIT_CLUE_DIR); for a mixture across "
        "benchmarks, one per suite: --data-dir glue=DIR --data-dir clue=DIR2",
    )
    train: str | os.PathLike | None = param(
        None, group=FILES, help="training file (.csv, .tsv or .jsonl with a header / named fields)"
    )
    dev: str | os.PathLike | None = param(
        None, group=FILES, help="dev file, scored after training (default: hold out --dev-fraction of --train)"
    )
    text_a: str | None = param(None, group=FILES, help="column with the (first) text")
    text_b: str | None = param(None, group=FILES, help="column with the second text of a pair")
    skip_bad_rows: bool = param(False, help="skip (and count) malformed rows instead of stopping at the first one")


@dataclass(kw_only=True)
class Embedding:
    """The contrastive stage's own flags (``finetune --objective contrastive|simcse``)."""

    objective: str | None = param(
        None,
        choices=("classify", "contrastive", "simcse"),
        group=EMBED,
        help="classify (the default): a classifier; contrastive: in-batch negatives over pairs (--train FILE "
        "--text-a COL --text-b COL, or a pair task: --task glue/mrpc's paraphrases); simcse: single texts (a column, "
        "or a text file of lines), dropout as the positive; the output is an embedding model (embed, index, serve "
        "/embed). Settings (--set): batch_size, micro_batch (cached negatives), temperature, learn_temperature, "
        "symmetric, matryoshka (e.g. 256,128,64), lr, epochs, pooling, gather_negatives (with --nproc: every "
        "process's vectors are each anchor's negatives; default true)",
    )
    negative: str | None = param(
        None, metavar="COLUMN", group=EMBED, help="--objective contrastive: a column of hard negatives"
    )
    query_prompt: str | None = param(
        None,
        metavar="TEXT",
        group=EMBED,
        help="--objective contrastive: a text put before each anchor (E5's 'query: '), recorded as the model's "
        "prompt named query (embed/index/serve --prompt-name query; index queries get it)",
    )
    passage_prompt: str | None = param(
        None,
        metavar="TEXT",
        group=EMBED,
        help="--objective contrastive: a text put before each positive and negative (E5's 'passage: '), recorded "
        "as the prompt named passage (index documents get it)",
    )
    default_prompt_name: str | None = param(
        None,
        choices=("query", "passage"),
        group=EMBED,
        help="the prompt an input gets when a request names none (sentence-transformers' default_prompt_name)",
    )
    budget: str | None = param(
        None,
        group=EMBED,
        help="--objective contrastive|simcse: the training budget as in pretraining: '10m' (time), '2000steps' or "
        "'5e6tok' (default: --set epochs, 1)",
    )

    def embedding_settings(self) -> dict[str, Any]:
        """The contrastive settings these flags stand for (those given)."""
        keys = ("objective", "budget", "query_prompt", "passage_prompt", "default_prompt_name")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(kw_only=True)
class Recipe(Training):
    """What ``finetune`` and ``eval`` of a suite share: the fine-tuning settings and the few-labels protocols."""

    seeds: str | Sequence[int] | None = param(
        None, help="comma-separated seeds, e.g. 0,1,2 (the median is reported; per task for a suite)"
    )
    config: str | os.PathLike | FinetuneConfig | None = param(
        None,
        flags=("--config",),
        metavar="FILE.yaml",
        help="a YAML file of fine-tuning settings (keys of --set, at the top level or under 'finetune:', as "
        "--print-config writes them); --set and the flags override it",
    )
    fewshot_splits: str | Sequence[str] | None = param(
        None,
        metavar="SPLITS",
        help="a task in FewCLUE's layout: FewCLUE's protocol over these splits, e.g. 0-4, 0,2 or few_all (train on "
        "train_K, score on test_public; each split in --out/split-K, the mean and spread in --out)",
    )
    few_shot: int | None = param(
        None,
        metavar="K",
        group=FEW,
        help="LM-BFF's few-shot protocol: K training examples per class and a dev set of K per class (it keeps the "
        "best checkpoint) drawn from the training data, --splits times; scored on the task's dev split; the mean "
        "and standard deviation over the splits are reported",
    )
    splits: int = param(FEWSHOT_SPLITS, metavar="S", group=FEW, help="with --few-shot: how many splits")
    method: str | None = param(
        None,
        choices=("head", "prompt", "ptuning", "setfit", "auto"),
        group=FEW,
        help="head: a fresh classifier on the pooled output (default); prompt: the MLM head scores label words "
        "through a template; ptuning: the encoder frozen, trainable prefixes at every layer and a head (only those "
        "are stored, with the base model's checksum); setfit: the encoder trained on pairs of rows (same label or "
        "not), then a logistic-regression head (SetFit: no MLM head needed; --set setfit_pairs=20 pairs of each "
        "kind per row); auto: the one of them that cross-validation on the labelled rows scores best, trained on "
        "all of them (few labels; --set auto_folds=4)",
    )
    prefix_len: int | None = param(
        None, metavar="N", group=FEW, help="--method ptuning: prefix keys/values per layer (16)"
    )
    settings: dict[str, Any] = param(
        {},
        command_line=False,
        help="FinetuneConfig fields (lr=2e-5, epochs=3, ...): the verb's keywords that are not its own",
    )

    def finetune_config(self) -> FinetuneConfig:
        """The fine-tuning settings: ``config`` (a FinetuneConfig, or the file ``--print-config`` writes), then
        ``settings`` and ``--set``, then what the request's own fields say; a bad setting is one line."""
        from cramkit.model.prompting import check_prefix_len
        from cramkit.recipes.finetune_config import config_from, settings_file

        base = config_from(settings_file(self.config)) if isinstance(self.config, (str, os.PathLike)) else self.config
        cfg = config_from({**self.settings, **set_overrides(self.overrides), **self.own_settings()}, base=base)
        if self.prefix_len is not None and cfg.method not in ("ptuning", "auto"):
            raise CramkitError("--prefix-len sizes deep prompts: give it with --method ptuning")
        check_prefix_len(cfg.prefix_len)  # --prefix-len, --set or --config: bounded before any work
        return cfg

    def own_settings(self) -> dict[str, Any]:
        """The settings the request's own fields stand for (those given)."""
        own: dict[str, Any] = {k: getattr(self, k) for k in ("method", "prefix_len") if getattr(self, k) is not None}
        if isinstance(self.seeds, str):
            try:
                own["seeds"] = [int(s) for s in self.seeds.split(",") if s.strip()]
            except ValueError:
                raise CramkitError(f"--seeds {self.seeds!r}: give comma-separated integers, e.g. 0,1,2") from None
        elif self.seeds is not None:
            own["seeds"] = list(self.seeds)
        return {**own, **report_to(self.report_to)}

    def fewclue_splits(self) -> list[str] | None:
        """FewCLUE's splits (``fewshot_splits``: "0-4", "0,2", "few_all" or a list), None when not given."""
        if not self.fewshot_splits:
            return None
        from cramkit.tasks.clue import parse_fewshot_splits

        given = self.fewshot_splits
        return parse_fewshot_splits(given if isinstance(given, str) else ",".join(given))

    def check_method(self, cfg: FinetuneConfig, *, suite: bool = False) -> None:
        """``--method auto``: what it can run (enough rows per class for its folds; a suite only with few labels)."""
        if cfg.method == "auto":
            from cramkit.recipes.method_auto import check_route

            few = self.few_shot is not None or bool(self.fewshot_splits)
            check_route(cfg, few_shot=self.few_shot, suite=suite and not few)


@dataclass
class FinetuneRequest(TaskData, Recipe, Embedding):
    """A fine-tuning: one task (registered, or from files), a mixture, a few-shot protocol, self-training, or the
    contrastive stage (``objective``)."""

    source: str | os.PathLike | LoadedModel = param(
        flags=("--from",),
        metavar="MODEL",
        help="cramkit run / checkpoint directory, a model directory, or hf:PATH (a Hugging Face BERT directory)",
    )
    _: KW_ONLY
    mixture: str | None = param(
        None,
        metavar="MIXTURE",
        help="train several tasks together, one head each: a registered mixture (see --list-tasks) or task names "
        "separated by commas, e.g. glue/mrpc,glue/rte",
    )
    rates: str | None = param(
        None,
        metavar="RULE",
        help="with --mixture: how often each task's batches are drawn: proportional (default: by size), capped:N "
        "(size, at most N), temperature:T, equal, or one weight per task (2,1,1)",
    )
    weighting: str | None = param(
        None,
        metavar="RULE",
        help="with --mixture: every step takes one batch of every task and combines their gradients on the encoder: "
        "sum (of the losses), gradnorm (each task's gradient scaled to the mean norm) or pcgrad (conflicting "
        "components projected away); default without it: one task per step, drawn by --rates",
    )
    primary: str | None = param(
        None,
        metavar="TASK",
        help="with --mixture: the task that matters; the other tasks' gradients are kept only where they do not "
        "oppose its gradient (implies --weighting sum unless given gradnorm)",
    )
    out: str | os.PathLike | None = param(
        None,
        help="output directory: the fine-tuned model (median seed; cramkit.load / predict / export / serve), "
        "results.json, test predictions (default: finetune-TASK; cramkit.finetune keeps one task's model only "
        "when given)",
    )
    unlabelled: str | os.PathLike | Sequence[str] | None = param(
        None,
        metavar="FILE",
        help="self-training: texts without labels (a .txt of one per line, or a table read with --train's columns; "
        "in Python also a list of texts); the model fine-tuned on the labels labels them, and a student learns "
        "from the labels and the confident pseudo-labels (with --few-shot: on every split); settings: --set "
        "self_train_*",
    )
    prompt: str | None = param(
        None,
        metavar="TEMPLATE",
        group=FEW,
        help="prompt-based fine-tuning: the template, with the task's fields and one [MASK], e.g. "
        "'{text_a} It was [MASK] .' or '{premise} ? [MASK] , {hypothesis}' (default: the task's built-in)",
    )
    label_words: str | Mapping[str, str] | None = param(
        None,
        metavar="LABEL=WORD,...",
        group=FEW,
        help="the word for each label, scored at the mask, e.g. positive=great,negative=terrible",
    )
    label: str = param("label", group=FILES, help="label column")
    regression: bool = param(False, group=FILES, help="the label is a number (MSE, Pearson/Spearman)")
    dev_fraction: float = param(
        DEV_FRACTION,
        group=FILES,
        help="without --dev: this fraction of the shuffled train rows is held out for scoring",
    )
    test: str | os.PathLike | None = param(
        None, group=FILES, help="test file (labels optional); predictions are written"
    )
    choices: str | Sequence[str] | None = param(
        None,
        metavar="COL[,COL...]",
        group=FILES,
        help="multiple choice: the choice columns (or one JSONL field holding a list); --text-a is the context, "
        "--label the right choice's index from 0",
    )
    name: str | None = param(None, group=FILES, help="name of the task (default: the train file's stem)")

    def own_settings(self) -> dict[str, Any]:
        own = super().own_settings()
        if self.prompt is not None:
            own["prompt"] = self.prompt
        if isinstance(self.label_words, Mapping):
            own["label_words"] = ",".join(f"{k}={v}" for k, v in self.label_words.items())
        elif self.label_words is not None:
            own["label_words"] = self.label_words
        return own

    def embeds(self) -> bool:
        """Whether this is the contrastive stage (``objective`` contrastive or simcse); its flags without it are
        one line."""
        if self.objective in ("contrastive", "simcse"):
            return True
        prompts = (self.query_prompt, self.passage_prompt, self.default_prompt_name)
        if self.negative or self.budget or any(v is not None for v in prompts):
            raise CramkitError(
                "--negative, --budget and the --*-prompt flags belong to --objective contrastive or simcse; add it"
            )
        return False

    def contrastive(self) -> ContrastiveRequest:
        """The contrastive stage this request asks for; a classifier's flags given with it are one line."""
        unfit = [f for f, v in (("--mixture", self.mixture), ("--prompt", self.prompt)) if v]
        unfit += ["--few-shot"] * (self.few_shot is not None) + ["--unlabelled"] * (self.unlabelled is not None)
        unfit += ["--fewshot-splits"] * bool(self.fewshot_splits)
        if unfit:
            raise CramkitError(
                f"--objective {self.objective} trains an embedding model; {', '.join(unfit)} do not apply"
            )
        return ContrastiveRequest(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ContrastiveRequest)})

    def resolve(self, processes: int = 1) -> tuple[FinetuneConfig, Mixture | None]:
        """The settings and the mixture (None: one task) after the route rules, each one line and the same from
        both doors, checked before anything is read; ``processes``: the command line's ``--nproc``."""
        if self.source is None:
            raise CramkitError(NEEDS_SOURCE)
        cfg = self.finetune_config()
        mix = self.resolved_mixture(cfg)
        fewshot = "--few-shot" if self.few_shot is not None else "--fewshot-splits" if self.fewshot_splits else None
        if self.few_shot is not None and self.fewshot_splits:
            raise CramkitError(
                "--few-shot K (LM-BFF's protocol) and --fewshot-splits (FewCLUE's) are two protocols: give one"
            )
        if self.few_shot is not None and self.splits < 1:
            raise CramkitError(f"--splits must be at least 1, got {self.splits}")
        if self.unlabelled is not None and mix is not None:
            raise CramkitError("--unlabelled self-trains one task; leave out --mixture")
        self.check_method(cfg)
        if processes != 1 and cfg.method == "auto":
            raise CramkitError("--method auto trains its candidates one by one in one process: leave out --nproc")
        if fewshot and (mix is not None or processes != 1):
            raise CramkitError(f"{fewshot} runs one task in one process; leave out --nproc and --mixture")
        if processes != 1:
            self._check_processes(mix)
        return cfg, mix

    def resolved_mixture(self, cfg: FinetuneConfig) -> Mixture | None:
        """The mixture (None: one task), its flags checked against the other flags and the settings."""
        if self.mixture is None:
            if self.rates is not None:
                raise CramkitError("--rates applies to --mixture; give the tasks with --mixture glue/mrpc,glue/rte,...")
            if self.weighting is not None or self.primary is not None:
                flag = "--weighting" if self.weighting is not None else "--primary"
                raise CramkitError(
                    f"{flag} applies to --mixture; give the tasks with --mixture glue/mrpc,glue/cola,..."
                )
            return None
        from cramkit.tasks.mixtures import resolve_mixture

        if self.task or self.train:
            raise CramkitError("give either --mixture or --task/--train, not both")
        mix = resolve_mixture(self.mixture, self.rates)  # an unknown name or a bad rate: one line
        if self.weighting is not None or self.primary is not None:
            from cramkit.recipes.multitask import check_weighting_settings

            if self.rates:
                raise CramkitError(
                    "--rates draws one task per step; --weighting/--primary train every task at every step: give one "
                    "of them"
                )
            check_weighting_settings(self.weighting, self.primary, list(mix.tasks), cfg)
        return mix

    def _check_processes(self, mix: Mixture | None) -> None:
        """What else cannot run on several processes (``--nproc``)."""
        if self.unlabelled is not None:
            raise CramkitError("--unlabelled self-trains one task in one process; leave out --nproc")
        if mix is not None and (self.weighting is not None or self.primary is not None):
            from cramkit.recipes.weighting import check_weighting, needs_task_gradients

            weighting, index = check_weighting(self.weighting, self.primary, list(mix.tasks))
            if needs_task_gradients(weighting, index):
                raise CramkitError(
                    f"--weighting {weighting}{' with --primary' if index is not None else ''} combines the tasks' "
                    "gradients in one process; leave out --nproc (only --weighting sum trains on several processes)"
                )
        one_directory(self.out)

    def out_dir(self, mixture: Mixture | None = None, *, keep: bool = False) -> str | None:
        """Where the run writes: ``out``; else finetune-MIXTURE, finetune-NAME-Kshot (LM-BFF's protocol),
        finetune-NAME-fewshot (FewCLUE's), and for one task finetune-NAME when its model is kept (``keep``: the
        command line), else None (``cramkit.finetune``: a temporary directory). NAME: the task's, or the file
        task's (``name``, else the train file's stem)."""
        if self.out is not None:
            return os.fspath(self.out)
        if mixture is not None:
            return f"finetune-{mixture.name}"
        name = (self.name or Path(self.train).stem) if self.train else str(self.task)
        stem = f"finetune-{name.replace('/', '-')}"
        if self.few_shot is not None:
            return f"{stem}-{self.few_shot}shot"
        if self.fewshot_splits:
            return f"{stem}-fewshot"
        return stem if keep else None

    def fewshot_keys(self) -> list[str]:
        """The splits of the few-shot protocol: LM-BFF's 0..splits-1, or FewCLUE's named ones."""
        if self.few_shot is not None:
            return [str(i) for i in range(self.splits)]
        return self.fewclue_splits() or []

    def resolved_task(self) -> Task:
        """The one task: registered (its files in ``data_dir``) or from the user's files."""
        from cramkit.tasks.resolve import resolve_task

        choices = None if self.choices is None else words(self.choices, "--choices", "choice1,choice2")
        given = {k: getattr(self, k) for k in FILE_TASK}
        return resolve_task(self.task, choices=choices, skip_bad_rows=self.skip_bad_rows, **given)


@dataclass
class ContrastiveRequest(TaskData, Embedding, Training):
    """The contrastive stage: an encoder trained to embed, on pairs (``train``'s columns ``text_a``, ``text_b``,
    hard negatives in ``negative``) or a pair ``task``'s; ``objective="simcse"``: single texts."""

    source: str | os.PathLike | LoadedModel = param(flags=("--from",), metavar="MODEL", help="the encoder to train")
    _: KW_ONLY
    out: str | os.PathLike | None = param(None, help="the embedding model's directory (default: OBJECTIVE-NAME)")
    config: str | os.PathLike | ContrastiveConfig | None = param(
        None, metavar="FILE.yaml", help="a ContrastiveConfig, or a settings file of its fields"
    )
    settings: dict[str, Any] = param(
        {}, command_line=False, help="ContrastiveConfig fields (batch_size=64, temperature=0.05, matryoshka=...)"
    )

    def embedding_config(self) -> ContrastiveConfig:
        """The settings: ``config``, then ``settings`` and ``--set``, then the request's own fields."""
        from cramkit.config import to_dict
        from cramkit.recipes import contrastive_config
        from cramkit.recipes.finetune_config import settings_file

        base = self.config
        over = settings_file(base) if isinstance(base, (str, os.PathLike)) else to_dict(base) if base else {}
        over = {**over, **self.settings, **set_overrides(self.overrides), **self.embedding_settings()}
        over.update(report_to(self.report_to))
        if over.get("budget"):
            from cramkit.train.config import TrainConfig

            TrainConfig.read_budget(str(over["budget"]), "--budget")
        return contrastive_config.config_from(over)

    def resolve(self, processes: int = 1) -> ContrastiveConfig:
        """The settings, checked with what ``processes`` (``--nproc``) needs."""
        if self.source is None:
            raise CramkitError(NEEDS_SOURCE)
        cfg = self.embedding_config()
        if processes > 1 and cfg.batch_size % processes:
            raise CramkitError(
                f"batch_size {cfg.batch_size} does not divide over --nproc {processes}; give a multiple of "
                f"{processes} (each process embeds an equal share of every batch)"
            )
        if processes != 1:
            one_directory(self.out)
        return cfg

    def out_dir(self, cfg: ContrastiveConfig) -> str:
        """``out``, else OBJECTIVE-NAME (NAME: the train file's stem, or the task's last part)."""
        if self.out is not None:
            return os.fspath(self.out)
        return f"{cfg.objective}-{Path(str(self.train or self.task or 'pairs')).stem.replace('/', '-')}"


def one_directory(out: str | os.PathLike | None) -> None:
    """Several processes (``--nproc``) write into one directory: it must be given."""
    if out is None:
        raise CramkitError("--nproc needs --out DIR: every process writes into the same directory")


def set_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` as settings (``--set finetune.lr=...`` taken too)."""
    from cramkit.config import parse_overrides

    over = parse_overrides(items)
    if isinstance(over.get("finetune"), dict):
        over.update(over.pop("finetune"))
    return over


def report_to(value: str | Sequence[str] | None) -> dict[str, Any]:
    """The ``report_to`` keyword as the setting it stands for (empty when not given)."""
    if value is None:
        return {}
    from cramkit.train.report import report_to_setting

    return {"report_to": report_to_setting(value)}


def words(value: str | Sequence[str], flag: str, example: str) -> list[str]:
    """``"A,B,C"`` (or a list) as ["A", "B", "C"]; nothing named is one line."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    out = [v.strip() for v in items if v.strip()]
    if not out:
        raise CramkitError(f"{flag} {value!r}: name them, e.g. {flag} {example}")
    return out

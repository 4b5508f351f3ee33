"""What ``cramkit embed`` and ``cramkit.embed`` take, declared once (:mod:`cramkit.request`)."""

from __future__ import annotations

import os
from dataclasses import KW_ONLY, dataclass

from cramkit.embeddings import BLOCK
from cramkit.errors import CramkitError
from cramkit.infer.options import Offload, Passes
from cramkit.model.pooling import POOLINGS
from cramkit.request import param
from cramkit.text.reading import GROUP, Reading


@dataclass
class EmbedRequest(Reading, Passes, Offload):
    """The rows of a file, or the sequences (or chunks) of a token store, embedded into a folder."""

    source: str | os.PathLike = param(
        positional=True,
        nargs="?",
        metavar="FILE_OR_STORE",
        help=".txt (one per line), .csv/.tsv/.jsonl (a text column), or a token store",
    )
    model: str | os.PathLike = param(flags=("--from",), metavar="MODEL", help="a run, model directory or hf:DIR")
    out: str | os.PathLike = param(metavar="DIR", help="directory for embeddings.npy, ids.npy, embed.json")
    _: KW_ONLY
    format: str = param(
        "npy",
        choices=("npy", "parquet"),
        help="npy (default): one memory-mapped array; parquet: one Parquet file per part (shard or process)",
    )
    shard: str | tuple[int, int] | None = param(
        None,
        metavar="I/N",
        help="embed shard I of N (counted from 0) of the rows, with --format parquet; run every shard with the "
        "same --out (a Slurm array: --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)",
    )
    # Reading's, defaulting to None: the first of the usual text columns (and a pair's second text), as `predict`
    # reads rows
    text_field: str | None = param(  # type: ignore[assignment]
        None, group=GROUP, help="the text column of a .csv/.tsv/.jsonl/.json file"
    )
    pooling: str | None = param(None, choices=POOLINGS, help="default: the model's")
    normalize: bool | None = param(None, help="L2-normalise (None: as the model does)")
    dimensions: int | None = param(
        None,
        metavar="N",
        help="cut each vector to its first N dimensions, renormalised: one of a Matryoshka model's (finetune "
        "--objective contrastive --set matryoshka=256,128); default: the whole vector",
    )
    prompt_name: str | None = param(
        None,
        metavar="NAME",
        help="one of the model's named prompts (e.g. query, passage) put before each text; default: the model's "
        "default prompt, if it has one. The prompt's tokens count toward the length limit",
    )
    chunk_tokens: int | None = param(
        None, help="token store: embed chunks of this many tokens instead of whole sequences"
    )
    store_tokenizer: str | None = param(None, help="the token store's tokenizer, when not the model's")
    overwrite: bool = param(False, help="replace finished embeddings of other inputs in DIR")
    block: int = param(BLOCK, help="rows embedded between progress commits")

    def check(self) -> tuple[int, int]:
        """One line for what is missing, a model that cannot be had or flags that do not go together, before any
        work; the shard (i, N) this process embeds ((0, 1) for a memory map)."""
        from cramkit.infer.offload import check_expert_cache
        from cramkit.loading import check_source
        from cramkit.runtime import parse_shard

        if self.source is None or self.model is None or self.out is None:
            raise CramkitError("cramkit embed needs FILE_OR_STORE, --from MODEL and --out DIR (or --join DIR)")
        check_source(str(self.model))
        check_expert_cache(self.expert_cache, self.offload_experts)
        if self.format not in ("npy", "parquet"):
            raise CramkitError(f"--format {self.format!r}: use npy or parquet")
        if self.shard is not None and self.format != "parquet":
            raise CramkitError("--shard needs --format parquet (each shard writes its own Parquet files)")
        if self.format != "parquet":
            return (0, 1)
        return parse_shard(self.shard if not isinstance(self.shard, tuple) else f"{self.shard[0]}/{self.shard[1]}")

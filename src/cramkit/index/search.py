"""An opened index: its manifest and files checked, its vectors and chunks memory-mapped, its encoder loaded at
the first query; search by text or by vector."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.embeddings.encoder import encoder_fingerprint, load_encoder
from cramkit.errors import CramkitError
from cramkit.index import ann
from cramkit.index.checks import MappedFiles
from cramkit.index.chunking import ChunkTable
from cramkit.index.manifest import DATA_FILES, MANIFEST, inside_index, read_manifest
from cramkit.index.request import InfoRequest, QueryRequest
from cramkit.request import verb


class Index:
    """An opened index. ``search(texts, k)`` -> per query a list of ``{score, text, doc, source, chunk}``
    (RETRO indexes add ``continuation``). The encoder is loaded at the first search."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        encoder: str | None = None,
        device: str = "cpu",
        mmap: bool = True,
        max_batch_tokens: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.manifest = m = read_manifest(self.path)
        self.data_dir = inside_index(self.path, m["data"], "'data'")
        self.encoder_dir = inside_index(self.path, m["encoder"].get("dir"), "'encoder.dir'")
        # every file opened below, listed or not, must be recorded and stay inside the index (a symlinked
        # texts.bin left out of 'files' would otherwise serve an outside file's text as search hits)
        on_disk = bool(m["plan"].get("on_disk"))
        ivfdata = m["plan"].get("ivfdata") if on_disk else None
        if on_disk and (not isinstance(ivfdata, str) or "/" in ivfdata or ivfdata in ("", ".", "..")):
            raise CramkitError(
                f"{self.path / MANIFEST}: plan.ivfdata {ivfdata!r} is not a file name beside faiss.index; refusing to "
                "read it (damaged or crafted): rebuild the index"
            )
        opened = [*DATA_FILES, *(["faiss.index"] if m["plan"]["kind"] != "flat" else [])]
        opened += [str(ivfdata)] if on_disk else []
        for name in dict.fromkeys([*m["files"], *opened]):
            f = inside_index(self.data_dir, name, "file")
            size = m["files"].get(name)
            if not f.is_file() or not isinstance(size, int):
                raise CramkitError(
                    f"{f} is missing (or not recorded in {MANIFEST}); the index is incomplete, rebuild it"
                )
            if f.stat().st_size != size:
                raise CramkitError(
                    f"{f} is {'truncated' if f.stat().st_size < size else 'longer than recorded'} "
                    f"({f.stat().st_size} bytes, the manifest says {size}); the index is damaged, rebuild it"
                )
        self.chunks = ChunkTable(self.data_dir)
        try:
            # read with pread, never mapped; indexed like the [n, dim] array it stands for (rows, slices, arrays)
            self.vectors: Any = ann.open_rows(self.data_dir / "vectors.npy")
        except OSError as exc:
            raise CramkitError(f"{self.data_dir / 'vectors.npy'} is damaged ({exc}); rebuild the index") from None
        if self.vectors.shape != (m["count"], m["dim"]) or len(self.chunks) != m["count"]:
            raise CramkitError(f"{self.path}: the data files do not match the manifest's count; rebuild the index")
        self.plan = m["plan"]
        self.params = ann.check_params(self.plan, m.get("params") or {}, self.path / MANIFEST)
        self.index = None
        self.mmapped = False
        shape = {"rows": m["count"], "dim": m["dim"]}
        if on_disk:  # the lists memory-mapped from the checked file, whatever name faiss.index holds
            self.index = ann.read_on_disk(
                self.data_dir / "faiss.index", inside_index(self.data_dir, ivfdata, "ivfdata"), **shape
            )
            self.mmapped = True
        elif self.plan["kind"] != "flat":
            self.index, self.mmapped = ann.read(self.data_dir / "faiss.index", mmap=mmap, **shape)
        # the files memory-mapped (the chunk table's; Faiss's lists), and the vectors: checked before each search,
        # so that one cut short under a running server is a refused request (500), not SIGBUS
        mapped = ["vectors.npy", "chunks.npy", "text_offsets.npy", "doc_hash.npy", "texts.bin"]
        mapped += [str(ivfdata)] if on_disk else ["faiss.index"] if self.mmapped else []
        self._mapped = MappedFiles({self.data_dir / f: int(m["files"][f]) for f in mapped})
        self._encoder_arg = encoder
        self.device, self.max_batch_tokens = device, max_batch_tokens
        self._engine: Any = None
        self._lock = threading.Lock()  # search from several threads (a server): one at a time

    # ------------------------------------------------------------------ metadata

    @property
    def encoder_source(self) -> str:
        """The encoder the index was built with (as given at build time; a copy lives in IDX/encoder)."""
        return str(self.manifest["encoder"].get("source"))

    def __len__(self) -> int:
        return int(self.manifest["count"])

    def close(self) -> None:
        """Release the index's files (the vectors, the memory-mapped lists and chunk table) and its encoder; a
        search afterwards is refused. ``with cramkit.index.open(...) as idx:`` closes it on leaving."""
        with self._lock:
            closer = getattr(self.vectors, "close", None)
            if closer is not None:
                closer()
            self._mapped.close()
            self.index, self._engine = None, None

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "path": str(self.path),
            "mode": m["mode"],
            "count": m["count"],
            "dim": m["dim"],
            "dimensions_cut": m["encoder"].get("dimensions"),
            "documents": m.get("documents"),
            "kind": self.plan["kind"],
            "factory": self.plan.get("factory", "exact (memory-mapped vectors)"),
            "why": self.plan.get("why"),
            "params": self.params,
            "recall": m.get("recall"),
            "encoder": self.encoder_source,
            "pooling": m["encoder"].get("pooling"),
            "prompts": m.get("prompts"),
            "chunking": m.get("chunking"),
            "sources": m.get("sources"),
            "bytes_on_disk": int(sum(m["files"].values())),
            "faiss_memory_mapped": self.mmapped,
            "on_disk": bool(self.plan.get("on_disk")),
            "build": m.get("build"),
            "created": m.get("created"),
        }

    # ------------------------------------------------------------------ search

    def engine(self) -> Any:
        if self._engine is None:
            want = self.manifest["encoder"].get("fingerprint")
            if self._encoder_arg is not None:
                loaded = load_encoder(self._encoder_arg)
                if encoder_fingerprint(loaded) != want:
                    raise CramkitError(
                        f"{self._encoder_arg} is not the encoder index {self.path} was built with "
                        f"({self.encoder_source}); query with that encoder (or none: the index keeps a copy)"
                    )
            else:
                from cramkit.loading import describe

                if describe(self.encoder_dir).kind is None:
                    raise CramkitError(f"{self.encoder_dir}: the index's encoder copy is missing; rebuild the index")
                loaded = load_encoder(str(self.encoder_dir))
                if encoder_fingerprint(loaded) != want:
                    raise CramkitError(
                        f"{self.encoder_dir} differs from the encoder the index was built with; rebuild the index"
                    )
            from cramkit.infer import Engine

            self._engine = Engine(loaded, device=self.device, max_batch_tokens=self.max_batch_tokens)
        return self._engine

    @property
    def dimensions(self) -> int | None:
        """The leading dimensions the index's vectors were cut to (None: the whole vectors)."""
        value = self.manifest["encoder"].get("dimensions")
        return int(value) if value else None

    def prompt(self, side: str) -> str:
        """The prompt text the index's ``side`` ("documents" or "queries") gets ('' for none, and for an index
        built before prompts were recorded)."""
        return str(((self.manifest.get("prompts") or {}).get(side) or {}).get("text") or "")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """The queries' vectors, as the index's documents were embedded (its pooling, prompt, dimensions)."""
        return self.embed_truncated(texts)[0]

    def embed_truncated(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`embed`'s vectors, which queries were cut to the encoder's limit)."""
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise CramkitError("queries must be a list of strings")
        if not texts:
            raise CramkitError("no queries given")
        if any(not t.strip() for t in texts):
            raise CramkitError("a query is empty; give some text")
        eng = self.engine()
        vec, cut = eng.embed_truncated(
            list(texts),
            pooling=self.manifest["encoder"]["pooling"],
            normalize=True,
            prompt=self.prompt("queries"),
            dimensions=self.dimensions,
        )
        return vec, cut

    def _check_k(self, k: int) -> int:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise CramkitError(f"k must be a positive integer, got {k!r}")
        if k > len(self):
            raise CramkitError(f"k={k} is larger than the index ({len(self)} chunks); use k <= {len(self)}")
        return int(k)

    def search_vectors(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, chunk ids) [nq, k] for normalised query vectors."""
        k = self._check_k(k)
        self._mapped.check()  # a file Faiss maps cut short since it was opened: refused, not SIGBUS
        where = self.data_dir / "faiss.index"
        return ann.search(self.index, self.vectors, self.plan, self.params, queries, k, where=where)

    def search(self, texts: Sequence[str], k: int = 10) -> list[list[dict[str, Any]]]:
        """The ``k`` best chunks per query text, best first. Queries longer than the encoder's limit are
        truncated to it (:meth:`search_truncated` says which). Safe to call from several threads."""
        return self.search_truncated(texts, k)[0]

    def search_truncated(self, texts: Sequence[str], k: int = 10) -> tuple[list[list[dict[str, Any]]], list[bool]]:
        """(:meth:`search`'s hits, which queries were cut to the encoder's limit)."""
        k = self._check_k(k)
        with self._lock:
            vectors, cut = self.embed_truncated(texts)
            scores, ids = self.search_vectors(vectors, k)
            self._mapped.check()  # the chunk table read below: still whole
            hits = [
                [self.hit(int(i), float(s)) for s, i in zip(sr, ir, strict=True) if i >= 0]
                for sr, ir in zip(scores, ids, strict=True)
            ]
        return hits, [bool(x) for x in cut]

    def hit(self, i: int, score: float) -> dict[str, Any]:
        row = self.chunks.row(i)
        sources = self.manifest.get("sources") or []
        src = sources[row["source"]] if 0 <= row["source"] < len(sources) else str(row["source"])
        out = {
            "score": score,
            "text": self.chunks.text(i),
            "doc": row["doc"],
            "source": src,
            "chunk": i,
            "span": [row["tok_start"], row["tok_end"]],
        }
        if self.manifest["mode"] == "retro":
            nxt = i + 1
            same = (
                nxt < len(self)
                and self.chunks.row(nxt)["seq"] == row["seq"]
                and (self.chunks.row(nxt)["source"] == row["source"])
            )
            out["continuation"] = self.chunks.text(nxt) if same else ""
        return out


def open(path: str | os.PathLike, *, encoder: str | None = None, device: str = "cpu") -> Index:
    """Open the index at ``path`` (memory-mapped); ``encoder``, when given, must be the one it was built with."""
    return Index(path, encoder=encoder, device=device)


@verb(QueryRequest)
def query(request: QueryRequest) -> list[dict[str, Any]]:
    """``cramkit index query``: per text ``{query, truncated, hits}`` (``hits``: :meth:`Index.search`'s, best
    first); a text cut to the encoder's limit is said on stderr. Takes a
    :class:`~cramkit.index.request.QueryRequest` or its fields."""
    with Index(request.path, encoder=request.encoder, device=request.device) as idx:
        hits, cut = idx.search_truncated(request.texts, request.k)
        for _ in filter(None, cut):
            print(
                f"note: the query was cut to the encoder's limit of {idx.engine().max_length} tokens", file=sys.stderr
            )
    return [{"query": t, "truncated": c, "hits": h} for t, c, h in zip(request.texts, cut, hits, strict=True)]


@verb(InfoRequest)
def info(request: InfoRequest) -> dict[str, Any]:
    """``cramkit index info``: what the index holds and how it was built (:meth:`Index.info`)."""
    with Index(request.path) as idx:
        return idx.info()

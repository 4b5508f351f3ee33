"""Build, open, search and grow a retrieval index; RETRO neighbours of a token store.

An index directory::

    IDX/index.json        the manifest, written last (its presence means the index is complete)
    IDX/encoder/          a copy of the encoder (a model directory): queries are embedded with exactly it
    IDX/data-NNN/         vectors.npy (float32 [n, dim], L2-normalised), faiss.index (none for exact
                          search), chunks.npy, text_offsets.npy, texts.bin, doc_hash.npy
    IDX/.build/, .add/    work in progress (embeddings being written, resumable); never read by ``open``

``index add`` writes a new ``data-NNN`` next to the old one and switches the manifest to it in one atomic
rename, so a crash at any point leaves the previous, complete index. Paths in the manifest must stay inside
IDX; every file opened must be recorded there and is checked against the size recorded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.data.tokenstore import is_store
from cramkit.embed.encoder import encoder_fingerprint, load_encoder, retrieval_prompts
from cramkit.embed.memmap import dist_info, embed_to_memmap, texts_key
from cramkit.embed.parquet import is_parquet_embeddings
from cramkit.embed.store_text import decode_spans, store_chunk_spans, store_documents, store_tokenizer
from cramkit.errors import CramkitError
from cramkit.index import ann
from cramkit.index.chunking import (
    RETRO_CHUNK,
    Chunks,
    ChunkTable,
    append_chunks,
    chunk_store,
    chunk_text_sources,
    chunks_from_parquet,
    document_hashes,
    write_chunks,
)
from cramkit.index.ondisk import peak_rss_mb
from cramkit.io import (
    BadJson,
    atomic_path,
    check_out,
    dir_lock,
    inside,
    json_loads,
    open_memmap,
    read_json_object,
    write_json_atomic,
)

MANIFEST = "index.json"
FORMAT = "cramkit-index-1"
MODES = ("passages", "retro")
DATA_FILES = ("vectors.npy", "chunks.npy", "text_offsets.npy", "texts.bin", "doc_hash.npy")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def make_chunks(
    source: str | None,
    loaded: Any,
    *,
    mode: str,
    chunk_tokens: int | None,
    overlap: int | None,
    reading: dict[str, Any] | None = None,
    tokenizer: str | None = None,
    reserve: int = 0,
) -> tuple[Chunks, dict[str, Any]]:
    """The chunks of ``source`` (text files or a token store) and the parameters used; ``reading``: how
    text files are read (keyword arguments of ``cramkit.text.iter_documents``: doc_split, encoding, ...);
    ``reserve``: tokens of the length limit kept for a prompt put before each chunk."""
    if mode not in MODES:
        raise CramkitError(f"unknown --mode {mode!r}; use passages or retro")
    limit = int(loaded.max_length) - 2 - reserve
    if source is not None and is_store(source):
        from cramkit.data.tokenstore import TokenStore

        if overlap:
            raise CramkitError("--overlap applies to text sources; a token store is cut without overlap")
        store = TokenStore(source)
        size = chunk_tokens or RETRO_CHUNK
        chunks = chunk_store(store, store_tokenizer(store, loaded.tokenizer, tokenizer), chunk_tokens=size)
        params = {"chunk_tokens": size, "overlap": 0, "store": True}
    else:
        if mode == "retro":
            raise CramkitError(
                f"--mode retro needs a token store (cramkit data build), not text files: {source or 'builtin'}"
            )
        size = chunk_tokens or min(128, limit)
        ov = 16 if overlap is None else overlap
        ov = min(ov, size - 1) if overlap is None else ov
        chunks = chunk_text_sources(
            [source] if source else None,
            loaded.tokenizer,
            chunk_tokens=size,
            overlap=ov,
            max_tokens=limit,
            **(reading or {}),
        )
        doc_split = (reading or {}).get("doc_split", "auto")
        params = {"chunk_tokens": size, "overlap": ov, "doc_split": doc_split, "store": False}
    if len(chunks) == 0:
        raise CramkitError(f"{source or 'the built-in corpus'}: no text to index (0 chunks); check the source")
    return chunks, params


def _engine(loaded: Any, device: str, max_batch_tokens: int | None) -> Any:
    from cramkit.infer import Engine

    return Engine(loaded, device=device, max_batch_tokens=max_batch_tokens)


def prompt_tokens(tokenizer: Any, prompt: str) -> int:
    """How many tokens ``prompt`` takes before a text (the room a chunk leaves it under the length limit)."""
    return len(tokenizer.encode(prompt, add_special_tokens=False).ids) if prompt else 0


def _file_sizes(d: Path) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in sorted(d.iterdir()) if f.is_file()}


# ---------------------------------------------------------------------------------------------- build


def build_index(
    source: str | None,
    encoder: str,
    out: str | os.PathLike,
    *,
    mode: str = "passages",
    chunk_tokens: int | None = None,
    overlap: int | None = None,
    reading: dict[str, Any] | None = None,
    memory: str | int = "4GB",
    target_recall: float = 0.95,
    kind: str = "auto",
    pooling: str | None = None,
    store_tokenizer: str | None = None,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    block: int = 1024,
    overwrite: bool = False,
    progress: bool | str = "auto",
    prompt_name: str | None = None,
    dimensions: int | None = None,
    on_disk: bool | None = None,
    workers: int = 1,
    shard: str | None = None,
) -> dict[str, Any] | None:
    """Chunk ``source``, embed the chunks with ``encoder`` (resuming an interrupted build), build and tune
    the Faiss index, write ``out``; the manifest (None on torchrun ranks other than 0, and for a ``shard``
    whose parts are done while others are not).

    prompt_name: the encoder's named prompt the chunks get (default: its prompt named document, passage or
    corpus, else its default prompt, else none); queries get its prompt named query (else its default). The
    manifest records both (``prompts``).

    dimensions: the index holds each vector's first ``dimensions``, renormalised (one of a Matryoshka
    encoder's, as ``Engine.embed``); its queries are cut the same way. The manifest records it.

    on_disk: True keeps the IVF lists on disk (:mod:`cramkit.index.ondisk`); None: when the in-RAM index
    would not fit ``memory``. An on-disk build fills its parts with ``workers`` processes; ``shard`` "i/N"
    fills only shard i's parts (several machines sharing ``out``), and the run that finds every part done
    merges them."""
    from cramkit.index import ondisk
    from cramkit.runtime import parse_shard

    if not 0.0 < target_recall <= 1.0:
        raise CramkitError(f"--target-recall must be in (0, 1], got {target_recall}")
    budget = ann.parse_memory(memory)
    if kind not in ann.KINDS:
        raise CramkitError(f"unknown --kind {kind!r}; use one of {', '.join(ann.KINDS)}")
    if not isinstance(workers, int) or workers < 1:
        raise CramkitError(f"--workers must be a positive integer, got {workers!r}")
    shard_i, shard_n = parse_shard(shard)
    if on_disk and kind in ("flat", "hnsw"):
        ann.plan_index(1, 1, budget, kind, on_disk=True)  # its one-line refusal, before any work
    if on_disk is not None and not on_disk and (shard is not None or workers > 1):
        raise CramkitError("--shard and --workers fill the parts of an on-disk index; drop them or build --on-disk")
    out = Path(out)
    rank, _ = dist_info()
    if (out / MANIFEST).is_file() and not overwrite:
        raise CramkitError(
            f"{out} already holds an index; grow it with `cramkit index add`, pick another --out or pass --overwrite"
        )
    check_out(out, inputs=[source, encoder], own=[MANIFEST, ".build"])
    work = out / ".build"
    odw = work / "ondisk"
    settings = {
        "source": str(source),
        "encoder": str(encoder),
        "mode": mode,
        "chunk_tokens": chunk_tokens,
        "overlap": overlap,
        "reading": reading or {},
        "memory": budget,
        "kind": kind,
        "on_disk": on_disk,
        "target_recall": target_recall,
        "pooling": pooling,
        "prompt_name": prompt_name,
        "dimensions": dimensions,
    }
    if shard is not None:  # several shard runs share --out: each waits its turn for the shared steps
        lock: contextlib.AbstractContextManager[None] = ondisk.waiting_lock(out / ".lock", f"--out {out}")
    else:
        lock = dir_lock(out, "--out") if rank == 0 else contextlib.nullcontext()
    with lock:  # a second process on the same --out would truncate this one's memory map (SIGBUS)
        prep = ondisk.read_prepared(odw, settings, overwrite=overwrite) if rank == 0 else None
        if prep is None and shard is not None and (out / MANIFEST).is_file():
            _log(f"{out}: the index is finished already (another shard merged it)")
            return None
        if prep is None:
            t_start = time.perf_counter()
            loaded = load_encoder(encoder)
            pooling = pooling or loaded.pooling
            if pooling not in ("mean", "cls"):
                raise CramkitError(f"--pooling must be mean or cls, got {pooling!r}")
            fp = encoder_fingerprint(loaded)
            engine = _engine(loaded, device, max_batch_tokens)
            prompts = retrieval_prompts(engine, prompt_name)
            dims = engine.check_dimensions(dimensions)  # None: the whole vector
            doc_prompt = str(prompts["documents"]["text"] or "")
            if is_parquet_embeddings(source):  # embedded already (cramkit embed --format parquet): index those
                if rank != 0:
                    return None
                if mode != "passages" or chunk_tokens is not None or overlap is not None:
                    raise CramkitError(
                        f"{source} holds finished Parquet embeddings: they are indexed as they are (--mode passages, "
                        "no --chunk-tokens or --overlap)"
                    )
                chunks, emb = chunks_from_parquet(str(source), fp, work / "embed" / "embeddings.npy")
                if int(emb["dim"]) != (dims or engine.hidden_size):
                    raise CramkitError(
                        f"{source} holds vectors of {emb['dim']} dimensions, not {dims or engine.hidden_size}; embed "
                        "it again with --dimensions, or give its size to --dimensions here"
                    )
                if emb.get("prompt", "") != doc_prompt:
                    raise CramkitError(
                        f"{source} was embedded with the prompt {emb.get('prompt', '')!r}, not {doc_prompt!r} (the "
                        "documents' prompt); embed it again with --prompt-name, or give the same --prompt-name here"
                    )
                pooling = emb.get("pooling") or pooling
                cparams = {"embeddings": str(source), "parts": len(emb["parts"])}
                rec = {"dim": emb["dim"], "seconds": 0.0, "resumed_rows": 0}
                t_chunk = time.perf_counter() - t_start
                _log(f"{len(chunks)} embedded rows from {source} ({t_chunk:.1f}s)")
            else:
                chunks, cparams = make_chunks(
                    source,
                    loaded,
                    mode=mode,
                    chunk_tokens=chunk_tokens,
                    overlap=overlap,
                    reading=reading,
                    tokenizer=store_tokenizer,
                    reserve=prompt_tokens(loaded.tokenizer, doc_prompt),
                )
                t_chunk = time.perf_counter() - t_start
                if rank == 0:
                    _log(f"{len(chunks)} chunks from {chunks.num_docs} documents ({t_chunk:.1f}s)")
                key = texts_key(
                    chunks.texts,
                    fp,
                    pooling,
                    "normalized",
                    *([f"prompt:{doc_prompt}"] if doc_prompt else []),
                    *([f"dimensions:{dims}"] if dims else []),
                )
                rec = embed_to_memmap(
                    chunks.texts,
                    engine,
                    work / "embed",
                    key=key,
                    pooling=pooling,
                    normalize=True,
                    block=block,
                    progress=progress,
                    desc="embedding chunks",
                    prompt=doc_prompt,
                    dimensions=dims,
                )
                if rank != 0:
                    return None
            t_embed = time.perf_counter()
            data = work / "data"
            shutil.rmtree(data, ignore_errors=True)
            data.mkdir(parents=True)
            write_chunks(data, chunks)
            vectors_path = work / "embed" / "embeddings.npy"
            vectors = np.load(vectors_path, mmap_mode="r", allow_pickle=False)
            plan = ann.plan_index(len(vectors), vectors.shape[1], budget, kind, on_disk)
            _log(f"index: {plan['kind']}{' on disk' if plan.get('on_disk') else ''} ({plan['why']})")
            base = {
                "format": FORMAT,
                "mode": mode,
                "count": len(chunks),
                "dim": int(rec["dim"]),
                "documents": chunks.num_docs,
                "sources": chunks.sources,
                "chunking": cparams,
                "encoder": {
                    "dir": "encoder",
                    "source": str(encoder),
                    "fingerprint": fp,
                    "pooling": pooling,
                    "normalize": True,
                    "max_length": int(loaded.max_length),
                    "dimensions": dims,  # the vectors cut to their leading dimensions (None: whole)
                },
                "prompts": prompts,
                "plan": plan,
            }
            timing = {
                "chunk_seconds": round(t_chunk, 2),
                "embed_seconds": rec["seconds"],
                "resumed_rows": rec.get("resumed_rows", 0),
                "memory_budget": budget,
            }
            _copy_encoder(out, loaded, fp)
            if not plan.get("on_disk"):
                if shard is not None or workers > 1:
                    raise CramkitError(
                        "--shard and --workers fill the parts of an on-disk index, and this one fits --memory in "
                        "RAM; add --on-disk, or drop them"
                    )
                index, params, recall = ann.build_and_tune(vectors, plan, target=target_recall, log=_log)
                if index is not None:
                    ann.write(index, data / "faiss.index")
                del index, vectors
                t_index = time.perf_counter() - t_embed
                os.replace(vectors_path, data / "vectors.npy")
                seconds = time.perf_counter() - t_start
                build = {"seconds": round(seconds, 2), **timing, "index_seconds": round(t_index, 2)}
                build["chunks_per_s"] = round(len(chunks) / seconds, 2)
                build["peak_rss_mb"] = peak_rss_mb()
                return _publish(out, data, {**base, "params": params, "recall": recall, "build": build})
            parts = ondisk.part_count(len(vectors), workers, shard_n)
            del vectors
            ondisk.prepare(vectors_path, plan, odw, parts=parts, log=_log)
            timing["prepare_seconds"] = round(time.perf_counter() - t_start, 2)
            prep = {"settings": settings, "parts": parts, "manifest": base, "build": timing}
            write_json_atomic(odw / ondisk.PREPARED, prep)
        if shard is None:
            parts = int(prep["parts"])
            ondisk.fill_parts(
                odw, work / "embed" / "embeddings.npy", list(range(parts)), parts, workers=workers, log=_log
            )
            return _finish_on_disk(out, prep, target_recall)
    parts = int(prep["parts"])
    mine = [p for p in range(parts) if p % shard_n == shard_i]
    ondisk.fill_parts(odw, work / "embed" / "embeddings.npy", mine, parts, workers=workers, log=_log)
    left = ondisk.missing_parts(odw, parts)
    if left:
        who = sorted({p % shard_n for p in left})
        _log(
            f"shard {shard_i}/{shard_n}: its parts are built; {len(left)} part(s) of other shards are not yet "
            f"({', '.join(f'--shard {i}/{shard_n}' for i in who)}); the last shard to finish merges them"
        )
        return None
    with ondisk.waiting_lock(out / ".lock", f"--out {out}"):
        if not (odw / ondisk.PREPARED).is_file():
            _log(f"{out}: the index is finished already (another shard merged it)")
            return None
        return _finish_on_disk(out, prep, target_recall)


def _copy_encoder(out: Path, loaded: Any, fp: str) -> None:
    if not ((out / "encoder").is_dir() and _dir_fingerprint(out / "encoder") == fp):
        with atomic_path(out / "encoder") as tmp:
            loaded.save(tmp)


def _finish_on_disk(out: Path, prep: dict[str, Any], target: float) -> dict[str, Any]:
    """Merge the parts of an on-disk build, tune it, publish the index."""
    from cramkit.index import ondisk

    work = out / ".build"
    data, vectors_path = work / "data", work / "embed" / "embeddings.npy"
    t0 = time.perf_counter()
    base = prep["manifest"]
    if not vectors_path.is_file() and (data / "vectors.npy").is_file():  # killed after the move below
        os.replace(data / "vectors.npy", vectors_path)
    params, recall, obuild = ondisk.merge(
        work / "ondisk", vectors_path, base["plan"], data, target=target, parts=int(prep["parts"]), log=_log
    )
    os.replace(vectors_path, data / "vectors.npy")
    build = {**prep["build"], **obuild}
    fill_seconds = sum(s or 0 for s in obuild["part_seconds"])  # summed over parts: the work, not the wall time
    prepare_seconds = float(prep["build"].get("prepare_seconds", 0))
    build["seconds"] = round(prepare_seconds + fill_seconds + time.perf_counter() - t0, 2)
    build["chunks_per_s"] = round(base["count"] / max(build["seconds"], 1e-9), 2)
    build["peak_rss_mb"] = max(x for x in [peak_rss_mb() or 0.0, *(r or 0.0 for r in obuild["part_peak_rss_mb"])])
    return _publish(out, data, {**base, "params": params, "recall": recall, "build": build})


def _publish(out: Path, data: Path, fields: dict[str, Any]) -> dict[str, Any]:
    """Move the finished ``data`` folder in as ``data-000`` and write the manifest (last); remove the work."""
    (out / MANIFEST).unlink(missing_ok=True)
    old = [p for p in out.glob("data-*") if p.is_dir()]
    gen = out / "data-000"
    shutil.rmtree(gen, ignore_errors=True)
    os.replace(data, gen)
    manifest = {
        **{k: v for k, v in fields.items() if k not in ("params", "recall", "build")},
        "data": gen.name,
        "params": fields["params"],
        "recall": fields["recall"],
        "files": _file_sizes(gen),
        "build": fields["build"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    write_json_atomic(out / MANIFEST, manifest)
    for p in old:
        if p != gen:
            shutil.rmtree(p, ignore_errors=True)
    shutil.rmtree(out / ".build", ignore_errors=True)
    return manifest


def _dir_fingerprint(d: Path) -> str | None:
    try:
        return encoder_fingerprint(load_encoder(str(d)))
    except CramkitError:
        return None


# ----------------------------------------------------------------------------------------------- open


def _read_manifest(root: Path) -> dict[str, Any]:
    file = root / MANIFEST
    if not root.is_dir():
        raise CramkitError(f"{root}: no such index directory; build one with `cramkit index build`")
    if not file.is_file():
        hint = " (an interrupted build: rerun it to resume)" if (root / ".build").exists() else ""
        raise CramkitError(f"{root} is not a finished index: {MANIFEST} is missing{hint}")
    try:
        m = json_loads(file.read_text(encoding="utf-8"))
    except BadJson as exc:
        raise CramkitError(f"{file} is {exc}; the index is damaged, rebuild it") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CramkitError(f"{file} is not valid JSON ({exc}); the index is damaged, rebuild it") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CramkitError(f"{file}: not a cramkit index manifest (format {FORMAT} expected)")
    for name, typ in (
        ("data", str),
        ("count", int),
        ("dim", int),
        ("mode", str),
        ("plan", dict),
        ("encoder", dict),
        ("files", dict),
    ):
        if not isinstance(m.get(name), typ):
            raise CramkitError(f"{file}: field {name!r} is missing or not a {typ.__name__}; rebuild the index")
    if m["mode"] not in MODES or m["plan"].get("kind") not in ann.KINDS[1:]:
        raise CramkitError(f"{file}: unknown mode or index kind; rebuild the index")
    cut = m["encoder"].get("dimensions")
    if cut is not None and (not isinstance(cut, int) or isinstance(cut, bool) or cut != m["dim"]):
        raise CramkitError(f"{file}: encoder.dimensions {cut!r} is not the vectors' size {m['dim']}; rebuild the index")
    prompts = m.get("prompts")
    if prompts is not None and not (
        isinstance(prompts, dict)
        and all(isinstance(prompts.get(s), dict) and isinstance(prompts[s].get("text"), str) for s in prompts)
    ):
        raise CramkitError(f"{file}: field 'prompts' is malformed; rebuild the index")
    return m


def _inside(root: Path, name: Any, what: str) -> Path:
    if not isinstance(name, str) or not name:
        raise CramkitError(f"{root / MANIFEST}: {what} is not a path name; rebuild the index")
    try:
        return inside(root, name)
    except ValueError:
        raise CramkitError(
            f"{root / MANIFEST}: {what} {name!r} points outside the index directory; refusing to read it"
        ) from None


class Index:
    """An opened index. ``search(texts, k)`` -> per query a list of ``{score, text, doc, source, chunk}``
    (RETRO indexes add ``continuation``). The encoder is loaded at the first search."""

    def __init__(
        self, path: str | os.PathLike, *, encoder: str | None = None, device: str = "cpu", mmap: bool = True
    ) -> None:
        self.path = Path(path)
        self.manifest = m = _read_manifest(self.path)
        self.data_dir = _inside(self.path, m["data"], "'data'")
        self.encoder_dir = _inside(self.path, m["encoder"].get("dir"), "'encoder.dir'")
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
            f = _inside(self.data_dir, name, "file")
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
            self.vectors = ann.open_rows(self.data_dir / "vectors.npy")
        except (OSError, ValueError) as exc:
            raise CramkitError(f"{self.data_dir / 'vectors.npy'} is damaged ({exc}); rebuild the index") from None
        if self.vectors.shape != (m["count"], m["dim"]) or len(self.chunks) != m["count"]:
            raise CramkitError(f"{self.path}: the data files do not match the manifest's count; rebuild the index")
        self.plan = m["plan"]
        self.params = m.get("params") or {}
        self.index = None
        self.mmapped = False
        if on_disk:  # the lists memory-mapped from the checked file, whatever name faiss.index holds
            self.index = ann.read_on_disk(self.data_dir / "faiss.index", _inside(self.data_dir, ivfdata, "ivfdata"))
            self.mmapped = True
        elif self.plan["kind"] != "flat":
            self.index, self.mmapped = ann.read(self.data_dir / "faiss.index", mmap=mmap)
            if self.index.ntotal != m["count"] or self.index.d != m["dim"]:
                raise CramkitError(f"{self.data_dir / 'faiss.index'} does not match the manifest; rebuild the index")
        self._encoder_arg = encoder
        self.device = device
        self._engine: Any = None
        self.last_truncated: list[bool] = []
        self._lock = threading.Lock()  # search from several threads (a server): one at a time

    # ------------------------------------------------------------------ metadata

    @property
    def encoder_source(self) -> str:
        """The encoder the index was built with (as given at build time; a copy lives in IDX/encoder)."""
        return str(self.manifest["encoder"].get("source"))

    def __len__(self) -> int:
        return int(self.manifest["count"])

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
                from cramkit.load import directory_kind

                if directory_kind(self.encoder_dir) is None:
                    raise CramkitError(f"{self.encoder_dir}: the index's encoder copy is missing; rebuild the index")
                loaded = load_encoder(str(self.encoder_dir))
                if encoder_fingerprint(loaded) != want:
                    raise CramkitError(
                        f"{self.encoder_dir} differs from the encoder the index was built with; rebuild the index"
                    )
            self._engine = _engine(loaded, self.device, None)
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
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise CramkitError("queries must be a list of strings")
        if not texts:
            raise CramkitError("no queries given")
        if any(not t.strip() for t in texts):
            raise CramkitError("a query is empty; give some text")
        eng = self.engine()
        vec = eng.embed(
            list(texts),
            pooling=self.manifest["encoder"]["pooling"],
            normalize=True,
            prompt=self.prompt("queries"),
            dimensions=self.dimensions,
        )
        self.last_truncated = [bool(x) for x in eng.truncated]
        return vec

    def _check_k(self, k: int) -> int:
        if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
            raise CramkitError(f"k must be a positive integer, got {k!r}")
        if k > len(self):
            raise CramkitError(f"k={k} is larger than the index ({len(self)} chunks); use k <= {len(self)}")
        return int(k)

    def search_vectors(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, chunk ids) [nq, k] for normalised query vectors."""
        k = self._check_k(k)
        return ann.search(self.index, self.vectors, self.plan, self.params, queries, k)

    def search(self, texts: Sequence[str], k: int = 10) -> list[list[dict[str, Any]]]:
        """The ``k`` best chunks per query text, best first. Queries longer than the encoder's limit are
        truncated to it (``last_truncated`` says which). Safe to call from several threads."""
        k = self._check_k(k)
        with self._lock:
            scores, ids = self.search_vectors(self.embed(texts), k)
        return [
            [self.hit(int(i), float(s)) for s, i in zip(sr, ir, strict=True) if i >= 0]
            for sr, ir in zip(scores, ids, strict=True)
        ]

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


def open(path: str | os.PathLike, *, encoder: str | None = None, device: str = "cpu") -> Index:  # noqa: A001
    """Open the index at ``path`` (memory-mapped); ``encoder``, when given, must be the one it was built with."""
    return Index(path, encoder=encoder, device=device)


# ------------------------------------------------------------------------------------------------ add


def add_to_index(
    path: str | os.PathLike,
    source: str | None,
    *,
    store_tokenizer: str | None = None,
    reading: dict[str, Any] | None = None,
    device: str = "auto",
    max_batch_tokens: int | None = None,
    block: int = 1024,
    progress: bool | str = "auto",
) -> dict[str, Any]:
    """Chunk and embed ``source`` like the index's build (its document split; ``reading``: the encoding
    and other options of ``cramkit.text.iter_documents`` for these files), add it, re-measure recall; the
    new manifest."""
    root = Path(path)
    with dir_lock(root, "index"):  # one writer at a time: a second would truncate the first one's memory map
        idx = Index(root, mmap=False)
        m = idx.manifest
        if m["plan"].get("on_disk"):
            raise CramkitError(
                f"{root} keeps its lists on disk (read-only, memory-mapped); `index add` does not grow it: rebuild "
                "it with `cramkit index build` over all the text"
            )
        loaded = idx.engine().loaded
        cp = m.get("chunking") or {}
        chunks, _ = make_chunks(
            source,
            loaded,
            mode=m["mode"],
            chunk_tokens=cp.get("chunk_tokens"),
            overlap=cp.get("overlap") if not cp.get("store") and source and not is_store(source) else None,
            reading={**(reading or {}), "doc_split": cp.get("doc_split", "auto")},
            tokenizer=store_tokenizer,
            reserve=prompt_tokens(loaded.tokenizer, idx.prompt("documents")),
        )
        if bool(cp.get("store")) != (source is not None and is_store(source)):
            raise CramkitError(
                f"{source}: the index was built from {'a token store' if cp.get('store') else 'text files'}; "
                "add the same kind of source"
            )
        work = root / ".add"
        pooling = m["encoder"]["pooling"]
        doc_prompt = idx.prompt("documents")
        key = texts_key(
            chunks.texts, m["encoder"]["fingerprint"], pooling, "normalized", m["data"], doc_prompt, str(idx.dimensions)
        )
        rec = embed_to_memmap(
            chunks.texts,
            idx.engine(),
            work / "embed",
            key=key,
            pooling=pooling,
            normalize=True,
            block=block,
            progress=progress,
            desc="embedding new chunks",
            prompt=doc_prompt,
            dimensions=idx.dimensions,
        )
        new_vec = np.load(work / "embed" / "embeddings.npy", mmap_mode="r", allow_pickle=False)
        n_old, d = idx.vectors.shape
        data = work / "data"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        vec = open_memmap(data / "vectors.npy", np.float32, (n_old + len(chunks), d))
        for a in range(0, n_old, 65536):
            b = min(a + 65536, n_old)
            vec[a:b] = idx.vectors[a:b]
        vec[n_old:] = new_vec
        vec.flush()
        append_chunks(data, idx.chunks, chunks, int(m.get("documents") or 0), len(m.get("sources") or []))
        params, recall = idx.params, m.get("recall")
        if idx.index is not None:
            target = float((recall or {}).get("target", 0.95))
            _, params, recall = ann.build_and_tune(
                vec, idx.plan, target=target, index=idx.index, start=n_old, log=_log, seed=n_old
            )
            ann.write(idx.index, data / "faiss.index")
        del vec, new_vec
        gen_no = int(m["data"].rsplit("-", 1)[-1]) + 1 if m["data"].rsplit("-", 1)[-1].isdigit() else 1
        gen = root / f"data-{gen_no:03d}"
        shutil.rmtree(gen, ignore_errors=True)
        os.replace(data, gen)
        manifest = dict(m)
        manifest.update(
            data=gen.name,
            count=n_old + len(chunks),
            documents=int(m.get("documents") or 0) + chunks.num_docs,
            sources=list(m.get("sources") or []) + chunks.sources,
            params=params,
            recall=recall,
            files=_file_sizes(gen),
            added=list(m.get("added") or [])
            + [{"source": source, "chunks": len(chunks), "embed_seconds": rec["seconds"]}],
        )
        old = idx.data_dir
        del idx
        write_json_atomic(root / MANIFEST, manifest)
        if old != gen:
            shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
        return manifest


# ----------------------------------------------------------------------------------------- neighbours


def retro_neighbours(
    path: str | os.PathLike,
    store: str,
    out: str | os.PathLike,
    *,
    k: int = 2,
    store_tokenizer: str | None = None,
    device: str = "auto",
    block: int = 1024,
    progress: bool | str = "auto",
) -> dict[str, Any]:
    """For every ``chunk_tokens`` chunk of ``store``: its ``k`` nearest index chunks from other documents.

    Writes ``OUT/neighbours.npy`` (int32 [n_chunks, k], index chunk ids, -1 where none), ``OUT/chunks.npy``
    (int64 [n_chunks, 3]: sequence, token start, token end in the store) and ``OUT/neighbours.json`` (last).
    A neighbour is from the same document when its document's token hash equals the query chunk's."""
    from cramkit.data.tokenstore import TokenStore

    idx = Index(path)
    m = idx.manifest
    if m["mode"] != "retro":
        raise CramkitError(f"{path} is a {m['mode']} index; RETRO neighbours need one built with --mode retro")
    k = idx._check_k(k)
    ts = TokenStore(store)
    size = int((m.get("chunking") or {}).get("chunk_tokens") or RETRO_CHUNK)
    spans = store_chunk_spans(ts, size)
    if len(spans) == 0:
        raise CramkitError(f"token store {store} is empty; nothing to find neighbours for")
    seq_doc = store_documents(ts)
    q_hash = document_hashes(ts, seq_doc)[seq_doc[spans[:, 0]]]
    idx_hash = np.asarray(idx.chunks.doc_hash)
    if len(idx_hash) == 0:
        raise CramkitError(f"{path}: the index has no document hashes; rebuild it from a token store")
    chunk_doc = np.asarray(idx.chunks.table[:, 0])
    cand_hash = idx_hash[chunk_doc]
    out = Path(out)
    check_out(
        out, inputs=[path, store], own=["neighbours.json", "neighbours.npy", ".embed", ".neighbours.progress.json"]
    )
    with dir_lock(out, "--out"):
        out.mkdir(parents=True, exist_ok=True)
        (out / "neighbours.json").unlink(missing_ok=True)
        pooling = m["encoder"]["pooling"]
        same_store = (
            len(idx) == len(spans)
            and np.array_equal(np.asarray(idx.chunks.table[:, 1:4]), spans)
            and np.array_equal(cand_hash, q_hash)
        )
        if same_store:  # the index was built from this very store: its vectors are the queries
            q = idx.vectors
        else:
            tok = store_tokenizer_for(ts, idx.engine().loaded, store_tokenizer)
            texts = list(decode_spans(ts, tok, spans))
            doc_prompt = idx.prompt("documents")  # store chunks are read as the index's chunks were
            key = texts_key(texts, m["encoder"]["fingerprint"], pooling, "normalized", doc_prompt, str(idx.dimensions))
            embed_to_memmap(
                texts,
                idx.engine(),
                out / ".embed",
                key=key,
                pooling=pooling,
                normalize=True,
                block=block,
                progress=progress,
                desc="embedding store chunks",
                prompt=doc_prompt,
                dimensions=idx.dimensions,
            )
            q = np.load(out / ".embed" / "embeddings.npy", mmap_mode="r", allow_pickle=False)
        # resumable: rows are committed block by block (the memory map flushed, then the count recorded), so a
        # rerun after a kill continues after the last committed block of the same job
        job = {
            "index": str(Path(path).resolve()),
            "data": m["data"],
            "created": m.get("created"),
            "store": str(ts.prefix),
            "chunks": int(len(spans)),
            "k": k,
        }
        progress_file = out / ".neighbours.progress.json"
        before = read_json_object(progress_file, "") if progress_file.is_file() else {}
        start = 0
        if before.get("job") == job and (out / ".neighbours.npy").is_file():
            try:
                result = np.load(out / ".neighbours.npy", mmap_mode="r+", allow_pickle=False)
                if result.shape == (len(spans), k) and result.dtype == np.int32:
                    start = int(before.get("done", 0))
            except (OSError, ValueError):
                start = 0
        if start == 0:
            progress_file.unlink(missing_ok=True)
            result = open_memmap(out / ".neighbours.npy", np.int32, (len(spans), k))
        else:
            _log(f"resumed after {start} of {len(spans)} chunks")
        bounds = _store_shard_bounds(ts, spans)
        t0 = time.perf_counter()
        leaks_avoided = int(before.get("dropped", 0)) if start else 0
        step = max(1, int(block))
        starts = sorted({*range(start, len(spans), step), *(b for b in bounds if start < b < len(spans))})
        last_log = 0.0
        for a, stop in zip(starts, [*starts[1:], len(spans)], strict=True):
            qa = np.ascontiguousarray(q[a:stop])
            want = min(len(idx), k * 4 + 8)
            pending = np.arange(len(qa))
            rows = np.full((len(qa), k), -1, dtype=np.int32)
            while len(pending):
                _, ids = idx.search_vectors(qa[pending], want)
                retry = []
                for r, row in zip(pending, ids, strict=True):
                    ok = row[(row >= 0)]
                    same = cand_hash[ok] == q_hash[a + r]
                    leaks_avoided += int(same.sum())
                    keep = ok[~same][:k]
                    if len(keep) < k and want < len(idx):
                        retry.append(r)
                    rows[r, : len(keep)] = keep
                pending = np.asarray(retry, dtype=np.int64)
                want = min(len(idx), want * 4)
            result[a:stop] = rows
            result.flush()
            write_json_atomic(progress_file, {"job": job, "done": stop, "dropped": leaks_avoided})
            now = time.perf_counter()
            if now - last_log >= 2.0 or stop == len(spans):
                last_log = now
                rate = (stop - start) / max(now - t0, 1e-9)
                shard_no = int(np.searchsorted(bounds, stop - 1, side="right"))
                where = f" (store shard {shard_no + 1}/{len(bounds) + 1})" if bounds else ""
                _log(
                    f"neighbours: {stop}/{len(spans)} chunks{where}, {rate:,.0f} chunks/s, "
                    f"ETA {(len(spans) - stop) / max(rate, 1e-9):.0f}s"
                )
        result.flush()
        del result
        np.save(out / "chunks.npy", spans)
        os.replace(out / ".neighbours.npy", out / "neighbours.npy")
        info = {
            "index": str(path),
            "store": str(ts.prefix),
            "chunks": int(len(spans)),
            "k": k,
            "chunk_tokens": size,
            "missing": int((np.load(out / "neighbours.npy", mmap_mode="r") < 0).sum()),
            "same_document_candidates_dropped": leaks_avoided,
            "search_seconds": round(time.perf_counter() - t0, 2),
            "chunks_per_s": round((len(spans) - start) / max(time.perf_counter() - t0, 1e-9), 1),
            "resumed_after": start,
            "store_shards": len(bounds) + 1,
            "peak_rss_mb": peak_rss_mb(),
            "index_on_disk": bool(m["plan"].get("on_disk")),
            "reused_index_vectors": bool(same_store),
        }
        write_json_atomic(out / "neighbours.json", info)
        progress_file.unlink(missing_ok=True)
        shutil.rmtree(out / ".embed", ignore_errors=True)
        return info


def _store_shard_bounds(ts: Any, spans: np.ndarray) -> list[int]:
    """The first chunk row of each shard of a sharded store after the first (its shards in order); [] for one."""
    starts = getattr(ts.tokens, "starts", None)
    if starts is None or len(starts) <= 2:
        return []
    seq_shard = np.searchsorted(starts, np.asarray(ts.pointers) // ts.dtype.itemsize, side="right") - 1
    chunk_shard = seq_shard[spans[:, 0]]
    return [int(x) for x in np.flatnonzero(np.diff(chunk_shard)) + 1]


def store_tokenizer_for(ts: Any, loaded: Any, given: str | None) -> Any:
    return store_tokenizer(ts, loaded.tokenizer, given)

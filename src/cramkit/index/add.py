"""Grow an index: chunk and embed more text (or another token store) as the index's build did, add it, re-measure
recall, and switch the manifest to the new data folder in one atomic rename."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np

from cramkit.data.tokenstore import is_store
from cramkit.embeddings.memmap import embed_to_memmap, texts_key
from cramkit.errors import CramkitError
from cramkit.index import ann
from cramkit.index.chunking import append_chunks, make_chunks, prompt_tokens
from cramkit.index.manifest import MANIFEST, file_sizes
from cramkit.index.request import AddRequest
from cramkit.index.search import Index
from cramkit.io import dir_lock, disk_errors, open_memmap, write_json_atomic
from cramkit.request import verb


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@verb(AddRequest)
def add_to_index(request: AddRequest) -> dict[str, Any]:
    """Chunk and embed ``source`` like the index's build (its document split; encoding, errors, text_field: how
    these files are read), add it, re-measure recall; the new manifest. Takes an
    :class:`~cramkit.index.request.AddRequest` or its fields."""
    r = request
    root = Path(r.path)
    source = None if r.source is None else os.fspath(r.source)
    # one writer at a time: a second would truncate the first one's memory map; a full disk is one line
    with disk_errors(root), dir_lock(root, "index"):
        idx = Index(root, mmap=False, device=r.device, max_batch_tokens=r.max_batch_tokens)
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
            reading={**r.reading_options(), "doc_split": cp.get("doc_split", "auto")},
            tokenizer=r.store_tokenizer,
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
            block=r.block,
            progress=r.progress,
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
            files=file_sizes(gen),
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

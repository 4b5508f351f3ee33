"""Fine-tuning scores its dev and test sets with the passes `cramkit.infer.Engine` runs (cramkit.model.forward)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cramkit.infer import Engine
from cramkit.loading import load
from cramkit.model.forward import MAX_BATCH_ROWS
from cramkit.recipes.finetune_config import FinetuneConfig
from cramkit.recipes.finetune_model import predict


def test_finetune_logits_are_the_engines_bit_for_bit(ft_model: Path, glue_dir: Path) -> None:
    from infer.models import sst2

    engine = Engine(str(ft_model), device="cpu")
    enc = engine.tokenize([s for s, _ in sst2(glue_dir, "dev")[:300]])
    want = engine.logits_encoded(enc)
    # with the Engine's row cap, fine-tuning cuts the very same passes (a row count alone would not)
    cfg = FinetuneConfig(eval_batch_size=MAX_BATCH_ROWS)
    got = predict(load(ft_model).model, enc, cfg, torch.device("cpu"), engine.pad_id, engine.with_types)
    assert got.shape == want.shape == (300, 2)
    assert np.array_equal(got, want)

"""Loading: the one door every later stage comes through (the verb ``cramkit.load`` is :func:`load`).

    m = cramkit.load("runs/tiny")            # a pretraining run: its latest checkpoint (any world size)
    m = cramkit.load("runs/tiny/checkpoints/step-000300")
    m = cramkit.load("out/sst2")             # a fine-tuned model (cramkit finetune --out), a student, ...
    m = cramkit.load("hf:path/to/bert")      # a Hugging Face BERT directory (safetensors only)
    m = cramkit.load("exported/onnx")        # an export (ONNX, CTranslate2, any registered format)

The result carries the model (eval mode, on the CPU), its tokenizer, config and head: masked-LM,
classification (label names in logit order), multi-label, regression, multiple choice (a score per
(context, choice) pair), or a bare encoder. An export directory is opened by its format's backend
(``cramkit.backends``) into an :class:`~cramkit.backends.ExportedModel` with the same
description (kind, labels, tokenizer, limits, pooling) and ``runner()``: inference runs either the same way.
What needs the torch model (fine-tuning, distillation, export) calls :func:`load_torch`, which names the
model an export was made from instead.

A *model directory* is what :meth:`LoadedModel.save` writes and what fine-tuning and distillation
produce: ``cramkit-model.json`` (what to build, labels, task, limits; written last, so its presence means
the directory is complete; with the weights' SHA-256), ``model.safetensors`` and ``tokenizer/``.
Nothing here executes code found in a directory: weights are safetensors, metadata JSON, and the model
class comes from a fixed table, never from the file.

The package, one reader per kind of directory: ``door.py`` (:func:`load`, :func:`load_torch`,
:func:`check_source`), ``kinds.py`` (:func:`describe`: what a directory is), ``exports.py``,
``model_dir.py`` (also :func:`for_task`, :func:`task_heads`), ``run.py``, ``hf.py``, and ``common.py``
(what the readers share: :func:`load_weights`, the size and vocabulary checks).
"""

from __future__ import annotations

from cramkit.backends.base import KINDS as KINDS
from cramkit.backends.base import LOGIT_KINDS as LOGIT_KINDS
from cramkit.backends.base import ExportedModel as ExportedModel
from cramkit.loading.common import load_weights as load_weights
from cramkit.loading.door import check_source as check_source
from cramkit.loading.door import load as load
from cramkit.loading.door import load_torch as load_torch
from cramkit.loading.hf import ST_CONFIG_FILES as ST_CONFIG_FILES
from cramkit.loading.kinds import DIRECTORY_KINDS as DIRECTORY_KINDS
from cramkit.loading.kinds import Description as Description
from cramkit.loading.kinds import describe as describe
from cramkit.loading.kinds import directory_kind as directory_kind
from cramkit.loading.kinds import is_export as is_export
from cramkit.loading.kinds import load_directory_architecture as load_directory_architecture
from cramkit.loading.model_dir import ARCHITECTURES as ARCHITECTURES
from cramkit.loading.model_dir import META_FIELDS as META_FIELDS
from cramkit.loading.model_dir import OWN_ARCHITECTURES as OWN_ARCHITECTURES
from cramkit.loading.model_dir import for_task as for_task
from cramkit.loading.model_dir import remove_model_files as remove_model_files
from cramkit.loading.model_dir import task_heads as task_heads
from cramkit.loading.run import POOLER_FILE as POOLER_FILE
from cramkit.loading.run import load_pooler as load_pooler
from cramkit.loading.run import resolve_run_checkpoint as resolve_run_checkpoint
from cramkit.model.loaded import MODEL_FILE as MODEL_FILE
from cramkit.model.loaded import MODEL_FORMAT as MODEL_FORMAT
from cramkit.model.loaded import LoadedModel as LoadedModel

"""The export formats' former home: they live in :mod:`cramkit.backends` (below ``cramkit.load``, which opens
exports through them). The names a format's module imports are kept here so that a plugin written against
``cramkit.infer.backends`` still registers; new code imports ``cramkit.backends``."""

from __future__ import annotations

from cramkit.backends import ENTRY_POINT_GROUP as ENTRY_POINT_GROUP
from cramkit.backends import KINDS as KINDS
from cramkit.backends import LOGIT_KINDS as LOGIT_KINDS
from cramkit.backends import Backend as Backend
from cramkit.backends import ExportedModel as ExportedModel
from cramkit.backends import ExportJob as ExportJob
from cramkit.backends import Runner as Runner
from cramkit.backends import backends as backends
from cramkit.backends import check_architecture as check_architecture
from cramkit.backends import check_texts as check_texts
from cramkit.backends import get as get
from cramkit.backends import kind_of as kind_of
from cramkit.backends import markers as markers
from cramkit.backends import names as names
from cramkit.backends import open_export as open_export
from cramkit.backends import register as register
from cramkit.backends import write_export as write_export

"""The one exception type users see.

Every failure caused by the user's input (a path, a file's content, a config value, a checkpoint)
raises :class:`CramkitError` with a message that names the input, says what is wrong and what to do.
The command line prints that message alone (no traceback) and exits with status 2.
"""

from __future__ import annotations


class CramkitError(Exception):
    """A user-facing error: the message names the input, the problem and the fix."""

    exit_code = 2


# Set by the command line (cli.entry): an abort (Ctrl-C; a second one during training, runtime.StopFlag)
# ends the process at once; called as a library, KeyboardInterrupt is raised instead.
ABORT_AT_ONCE = False

# Set by the command line's SIGINT handler (cli.Interrupt): a failure that follows a Ctrl-C is the Ctrl-C's doing
# (a KeyboardInterrupt raised inside a library's import or a broad ``except`` there surfaces as another error)
INTERRUPTED = False

# optional dependencies -> the extra of pyproject.toml that installs them
EXTRAS = {
    "fastapi": "serve",
    "starlette": "serve",
    "uvicorn": "serve",
    "prometheus_client": "serve",
    "orjson": "serve",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "onnxscript": "onnx",
    "faiss": "index",
    "nltk": "distill",
    "transformers": "hf",
    "datasets": "hf",
    "zstandard": "compress",
    "pyarrow": "parquet",
    "ctranslate2": "ct2",
    "openvino": "openvino",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
}


def missing_extra(exc: ImportError) -> CramkitError | None:
    """The one-line error for an optional dependency that is not installed; None when ``exc`` is not that."""
    name = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(name)
    if extra is None:
        return None
    return CramkitError(f"{name} is not installed; install cramkit's [{extra}] extra: pip install 'cramkit[{extra}]'")

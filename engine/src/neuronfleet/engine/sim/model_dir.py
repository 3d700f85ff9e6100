"""The small local model directory a simulated engine serves: ``config.json`` and a tokenizer.

vLLM needs a model directory to read the architecture and the tokenizer from; the
simulated device needs no weights. The directory is written once per shape and
length under the user cache, atomically, so concurrent engines share it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from neuronfleet.contract.model_shapes import get_shape
from neuronfleet.engine.paths import user_cache
from neuronfleet.engine.sim.tokenizer import write_tokenizer

#: Bumped when the files written change, so stale cached directories are not reused.
LAYOUT_VERSION = 1
#: The file written last: its presence means the directory is complete.
COMPLETE_MARKER = "config.json"


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/neuronfleet/models`` (``~/.cache`` by default)."""
    return user_cache("models")


def model_dir(shape_name: str, max_model_len: int, root: Path | None = None) -> Path:
    """The model directory for ``shape_name`` at ``max_model_len``, written if missing."""
    shape = get_shape(shape_name)
    config = shape.config(max_model_len)
    root = root or default_cache_root()
    path = root / f"{shape.name}-{max_model_len}-v{LAYOUT_VERSION}"
    if (path / COMPLETE_MARKER).exists():
        return path
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=root))
    try:
        write_tokenizer(staging, shape.vocab_size)
        (staging / COMPLETE_MARKER).write_text(json.dumps(config, indent=2))
        try:
            staging.rename(path)
        except OSError:
            # Another process finished first: its directory is the same.
            if not (path / COMPLETE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path

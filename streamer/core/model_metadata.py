"""`--model-metadata FILE`: the per-model metadata file (TOML, or JSON by its `.json` name),
read once at startup and checked by `core/model_catalog.py`."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from streamer.core.model_catalog import ModelCatalog, parse_catalog

MAX_METADATA_BYTES = 1024 * 1024  # Codex reads at most 1 MiB of catalog, too


def load_model_catalog(path: str | None) -> ModelCatalog:
    """The checked file, or an empty catalog without one; `ValueError` naming the file."""
    if not path:
        return ModelCatalog()
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"--model-metadata {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_METADATA_BYTES:
        raise ValueError(f"--model-metadata {path}: larger than {MAX_METADATA_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
        data = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"--model-metadata {path}: {exc}") from None
    return parse_catalog(data, f"--model-metadata {path}")

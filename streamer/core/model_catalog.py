"""Model metadata for Codex: what `GET /v1/models` tells a Codex client about each model.

Codex (0.169) reads a provider's catalog from `model_catalog_url` when the provider has a key:
`{"models": [ModelInfo, ...]}`, one entry per slug, which replaces its bundled catalog. A slug
it does not find there gets fallback metadata and the warning "Model metadata for `…` not
found". The gateway answers both shapes in one body: OpenAI's list (`object`, `data`, for
the SDKs' `models.list()`) and Codex's `models`.

Pure: plain data in and out. The metadata file (`--model-metadata`, TOML or JSON) is
`{"defaults": {...}, "models": {"<slug>": {...}}}`; a model's entry overrides the defaults,
which override the gateway's. Known keys are checked (a `ValueError` naming the key);
any other key passes through into the model's entry as Codex spells it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamer.core.json_bounds import MAX_DEPTH, loads_within

DEFAULT_CONTEXT_WINDOW = 128_000
# What backends report in their /v1/models entries as the context length (vLLM, OpenRouter,
# LM Studio): data, tried in order.
BACKEND_CONTEXT_KEYS = ("max_model_len", "context_length", "max_context_length", "context_window")
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max", "ultra")
INPUT_MODALITIES = ("text", "image")
# Codex 0.169 knows only `freeform` (a custom tool with a grammar); one value it does not know
# in one entry makes it drop the whole catalog, silently, so every checked key is Codex's enum.
APPLY_PATCH_TOOL_TYPES = ("freeform",)

DEFAULT_BASE_INSTRUCTIONS = """\
You are a coding agent working in the user's workspace through the tools you are given.

- Read before you change: look at the relevant files and run commands to learn how the
  project is built and tested.
- Make focused changes that do what was asked and nothing more; edit files with the
  apply_patch tool when you have it.
- Check your work: run the tests or the program when you can, and say plainly what you
  could not verify.
- Prefer doing to asking. Ask the user only when a choice is theirs to make or an action
  cannot be undone.
- Keep the user informed with short updates while you work, and finish with a brief
  summary of what changed and where.
"""

_EFFORT_TEXT = {
    "none": "No reasoning",
    "minimal": "Minimal reasoning",
    "low": "Fast responses with lighter reasoning",
    "medium": "Balanced speed and reasoning depth",
    "high": "Deeper reasoning for complex problems",
    "xhigh": "Extra high reasoning depth",
    "max": "Maximum reasoning depth",
    "ultra": "Maximum reasoning depth",
}


@dataclass(frozen=True, slots=True)
class ModelCatalog:
    """The checked metadata file: defaults for every model, entries by slug (file order)."""

    defaults: dict[str, Any] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)


def _positive_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{where}: must be a positive integer")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}: must be a non-empty string")
    return value


def _one_of(value: Any, choices: Iterable[str], where: str) -> str:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{where}: must be one of {', '.join(choices)}")
    return str(value)


def _levels(value: Any, where: str) -> list[dict[str, str]]:
    """`["low", "high"]` or Codex's `[{"effort": …, "description": …}]`."""
    if not isinstance(value, list):
        raise ValueError(f"{where}: must be a list of reasoning efforts")
    levels = []
    for i, level in enumerate(value):
        if isinstance(level, dict):
            effort = _one_of(level.get("effort"), REASONING_EFFORTS, f"{where}[{i}].effort")
            text = level.get("description", _EFFORT_TEXT[effort])
            levels.append({"effort": effort, "description": _string(text, f"{where}[{i}]")})
        else:
            effort = _one_of(level, REASONING_EFFORTS, f"{where}[{i}]")
            levels.append({"effort": effort, "description": _EFFORT_TEXT[effort]})
    return levels


def _modalities(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where}: must be a non-empty list of {', '.join(INPUT_MODALITIES)}")
    return [_one_of(v, INPUT_MODALITIES, f"{where}[{i}]") for i, v in enumerate(value)]


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: must be true or false")
    return value


def _patch_type(value: Any, where: str) -> str | None:
    """`freeform` (a custom tool with a grammar) or `none` (no apply_patch tool)."""
    if value in (None, "none"):
        return None
    return _one_of(value, (*APPLY_PATCH_TOOL_TYPES, "none"), where)


def _optional_limit(value: Any, where: str) -> int | None:
    return None if value is None else _positive_int(value, where)


_CHECKS = {
    "context_window": _positive_int,
    "max_output_tokens": _positive_int,
    "auto_compact_token_limit": _optional_limit,
    "reasoning_levels": _levels,
    "default_reasoning_level": lambda v, w: _one_of(v, REASONING_EFFORTS, w),
    "input_modalities": _modalities,
    "apply_patch_tool_type": _patch_type,
    "supports_parallel_tool_calls": _bool,
    "supports_search_tool": _bool,
    "base_instructions": _string,
    "display_name": _string,
    "description": _string,
}


def _entry(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: must be a table (an object)")
    checked = dict(value)  # unknown keys pass through, as Codex spells them
    for key, check in _CHECKS.items():
        if key in value:
            checked[key] = check(value[key], f"{where}.{key}")
    return checked


def parse_catalog(data: Any, source: str = "model metadata") -> ModelCatalog:
    """Check a loaded metadata file; `ValueError("<source>: models.x.key: …")` if wrong."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: must be a table with `defaults` and `models`")
    unknown = sorted(set(data) - {"defaults", "models"})
    if unknown:
        raise ValueError(f"{source}: unknown key {unknown[0]!r} (expected defaults, models)")
    try:
        defaults = _entry(data.get("defaults", {}), "defaults")
        models = data.get("models", {})
        if not isinstance(models, dict):
            raise ValueError("models: must be a table keyed by model name")
        entries = {
            _string(slug, "models"): _entry(v, f"models.{slug}") for slug, v in models.items()
        }
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return ModelCatalog(defaults, entries)


def backend_context_window(entry: Mapping[str, Any] | None) -> int | None:
    """The context length a backend reports for a model (vLLM's `max_model_len`, …)."""
    for key in BACKEND_CONTEXT_KEYS:
        value = (entry or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def output_limits(catalog: ModelCatalog) -> tuple[int | None, dict[str, int]]:
    """`max_output_tokens` of the file's defaults, and of each model that sets its own."""
    limits = {slug: e.get("max_output_tokens") for slug, e in catalog.models.items()}
    own = {slug: limit for slug, limit in limits.items() if isinstance(limit, int)}
    return catalog.defaults.get("max_output_tokens"), own


def codex_model_info(
    slug: str, catalog: ModelCatalog, backend: Mapping[str, Any] | None, priority: int
) -> dict[str, Any]:
    """One Codex `ModelInfo`: the gateway's defaults <- the file's defaults <- its entry.

    The context window: the model's entry, else what the backend reports for it, else the
    file's defaults, else `DEFAULT_CONTEXT_WINDOW`."""
    entry = catalog.models.get(slug, {})
    meta = {**catalog.defaults, **entry}
    window = (
        entry.get("context_window")
        or backend_context_window(backend)
        or catalog.defaults.get("context_window")
        or DEFAULT_CONTEXT_WINDOW
    )
    meta.pop("context_window", None)
    meta.pop("max_output_tokens", None)  # the gateway's (a kind that requires one), not Codex's
    levels = meta.pop("reasoning_levels", None)
    if levels is None:
        levels = _levels(["low", "medium", "high"], "reasoning_levels")
    default_level = meta.pop("default_reasoning_level", None)
    if default_level is None and levels:
        efforts = [level["effort"] for level in levels]
        default_level = "medium" if "medium" in efforts else efforts[0]
    info: dict[str, Any] = {
        "slug": slug,
        "display_name": slug,
        "description": f"{slug} through streamer",
        "default_reasoning_level": default_level,
        "supported_reasoning_levels": levels,
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": priority,
        "base_instructions": DEFAULT_BASE_INSTRUCTIONS,
        "model_messages": None,
        "supports_reasoning_summaries": False,
        "default_reasoning_summary": "none",
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "web_search_tool_type": "text",
        "truncation_policy": {"mode": "tokens", "limit": 10_000},
        "supports_parallel_tool_calls": True,
        "context_window": window,
        "max_context_window": window,
        "auto_compact_token_limit": None,
        "effective_context_window_percent": 95,
        "experimental_supported_tools": [],
        "input_modalities": list(INPUT_MODALITIES),
        "supports_search_tool": False,
    }
    info.update(meta)
    return info


def catalog_slugs(
    listed: Iterable[str], catalog: ModelCatalog, configured: str | None
) -> list[str]:
    """Every model the catalog describes, once, in order: the backend's list, the file's
    models, then `--model` (the backend model every request is sent to)."""
    slugs = [*listed, *catalog.models, *([configured] if configured else [])]
    return list(dict.fromkeys(s for s in slugs if s))


def catalog_body(
    backend: Mapping[str, Any] | None, catalog: ModelCatalog, configured: str | None
) -> dict[str, Any] | None:
    """`GET /v1/models`: the backend's OpenAI list (or one built from the file when the backend
    gave none) plus Codex's `models`. None: nothing to describe (pass the backend through)."""
    data = backend.get("data") if backend else None
    entries = [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []
    by_id = {d["id"]: d for d in entries if isinstance(d.get("id"), str)}
    slugs = catalog_slugs(by_id, catalog, configured)
    if not slugs:
        return None
    listed = entries + [
        {"id": s, "object": "model", "created": 0, "owned_by": "streamer"}
        for s in slugs
        if s not in by_id
    ]
    body: dict[str, Any] = dict(backend) if backend and entries else {"object": "list"}
    body["data"] = listed
    body["models"] = [codex_model_info(s, catalog, by_id.get(s), i) for i, s in enumerate(slugs)]
    return body


def models_answer(
    status: int, body: bytes, catalog: ModelCatalog, configured: str | None
) -> dict[str, Any] | None:
    """What `GET /v1/models` answers given the backend's (status, body): the described list,
    or None to pass the backend's answer through (nothing to describe, or an error with no
    model of our own to list)."""
    parsed: Any = None
    if status == 200:
        try:
            parsed = loads_within(body, MAX_DEPTH)  # answered again as this gateway's JSON
        except ValueError:
            parsed = None
    return catalog_body(parsed if isinstance(parsed, dict) else None, catalog, configured)


def configured_body(
    catalog: ModelCatalog, entries: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """`GET /v1/models` of a `--config` gateway: its models in the file's order, each with
    the metadata the config gives (`entries`: context window, input modalities, …) under
    what the metadata file says of it."""
    models = {name: {**meta, **catalog.models.get(name, {})} for name, meta in entries.items()}
    body = catalog_body(None, ModelCatalog(catalog.defaults, models), None)
    return body or {"object": "list", "data": [], "models": []}

"""`--config streamer.toml`: the models a gateway serves, their replicas and fallbacks.

Pure: the file's text (and the environment, for `api_key_env`) in, a checked `ModelsConfig`
out, or a `ConfigError` naming the file, the line and what is wrong. tomllib reports lines
for syntax errors only, so a wrong value's line is found in the text: the key's line inside
its `[[models]]` block. The single-backend flags are a config of one model (`single`), whose
name is None: it serves whatever model a request names.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

Knobs = Mapping[str, Callable[[Any], Any]]
"""The settings a model may set for itself, each with its check (a ValueError says why not)."""

TOOL_NAME_STYLES = ("codex", "double-underscore", "llamacpp", "dotted")
MODALITIES = ("text", "image")
TOP_KEYS = ("default_model", "models")


class ConfigError(ValueError):
    """A config file the gateway cannot serve: `file:line: what is wrong`."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One `[[models]]` entry, checked. `name` None: the single-backend catch-all."""

    name: str | None
    upstreams: tuple[str, ...]
    aliases: tuple[str, ...] = ()
    api: str = "chat"
    backend_model: str | None = None
    profile: str | None = None  # None: --backend-profile
    api_key: str | None = field(default=None, repr=False)  # read from api_key_env
    api_key_env: str | None = None
    tool_name_style: str | None = None  # None: --tool-name-style
    context_window: int | None = None
    max_output_tokens: int | None = None  # `max_tokens` when a request gives none (Anthropic)
    input_modalities: tuple[str, ...] | None = None
    supports_tools: bool = True
    supports_reasoning: bool = True
    max_concurrency: int = 0  # 0: no limit
    fallbacks: tuple[str, ...] = ()
    settings: tuple[tuple[str, Any], ...] = ()  # its own values of gateway settings (knobs)

    @property
    def label(self) -> str:
        return self.name or "default"

    @property
    def supports_images(self) -> bool:
        return self.input_modalities is None or "image" in self.input_modalities


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    models: tuple[ModelSpec, ...]
    default_model: str | None = None
    source: str | None = None  # the file, None for the single-backend flags

    def find(self, name: str) -> ModelSpec | None:
        """The model a request's `model` names (its name or an alias)."""
        for spec in self.models:
            if spec.name is None or name == spec.name or name in spec.aliases:
                return spec
        return None

    def named(self, name: str) -> ModelSpec:
        spec = self.find(name)
        assert spec is not None, name
        return spec


def single(
    upstream: str, *, api_key: str | None, model: str | None, api: str = "chat"
) -> ModelsConfig:
    """The single-backend flags as a config: one catch-all model on one upstream, of the
    kind `api` (`--upstream-api`)."""
    spec = ModelSpec(None, (upstream,), api=api, api_key=api_key, backend_model=model)
    return ModelsConfig((spec,))


def load(
    path: str,
    env: Mapping[str, str],
    profiles: tuple[str, ...],
    apis: tuple[str, ...],
    *,
    knobs: Knobs | None = None,
) -> ModelsConfig:
    """Read and check the file at `path` (a `ConfigError` if it cannot be served)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    return parse(text, path, env, profiles, apis, knobs=knobs)


def parse(
    text: str,
    source: str,
    env: Mapping[str, str],
    profiles: tuple[str, ...],
    apis: tuple[str, ...],
    *,
    knobs: Knobs | None = None,
) -> ModelsConfig:
    """Check `text` (the file at `source`); `profiles` and `apis` are the backend profiles
    and kinds there are, `knobs` the settings a model may set for itself."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r" \(at line (\d+), column \d+\)$", str(exc))
        if found is None:
            raise ConfigError(f"{source}: {exc}") from None
        raise ConfigError(
            f"{source}:{found[1]}: {str(exc)[: found.start()]} ({found[0][5:-1]})"
        ) from None
    checker = _Checker(text, source, env, profiles, apis, knobs or {})
    for key in data:
        if key not in TOP_KEYS:
            checker.fail(None, key, f"unknown key {key!r} (known: {', '.join(TOP_KEYS)})")
    models = data.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, dict) for m in models):
        checker.fail(None, "models", "expected at least one [[models]] table")
    assert isinstance(models, list)
    specs = tuple(checker.model(i, m) for i, m in enumerate(models))
    config = ModelsConfig(specs, _default(data, checker), source)
    checker.cross(config)
    return config


def _default(data: dict[str, Any], checker: _Checker) -> str | None:
    value = data.get("default_model")
    if value is not None and not isinstance(value, str):
        checker.fail(None, "default_model", "expected a string")
    return value


_KEYS: dict[str, str] = {
    "name": "a string",
    "aliases": "an array of strings",
    "upstreams": "an array of http:// or https:// URLs",
    "api": "one of {apis}",
    "backend_model": "a string",
    "profile": "a backend profile",
    "api_key_env": "the name of an environment variable",
    "tool_name_style": "one of " + ", ".join(TOOL_NAME_STYLES),
    "context_window": "a positive integer",
    "max_output_tokens": "a positive integer",
    "input_modalities": "an array of " + ", ".join(MODALITIES),
    "supports_tools": "a boolean",
    "supports_reasoning": "a boolean",
    "max_concurrency": "a positive integer",
    "fallbacks": "an array of model names",
}


class _Checker:
    """Checks values and says where they are in the text."""

    def __init__(
        self,
        text: str,
        source: str,
        env: Mapping[str, str],
        profiles: tuple[str, ...],
        apis: tuple[str, ...],
        knobs: Knobs,
    ) -> None:
        self.lines = text.splitlines()
        self.source = source
        self.env = env
        self.profiles = profiles
        self.apis = apis
        self.knobs = knobs

    def line_of(self, index: int | None, key: str) -> int | None:
        """The line of `key` in the `index`-th [[models]] block (None: the top level)."""
        block, pattern = -1, re.compile(rf'^\s*("{re.escape(key)}"|{re.escape(key)})\s*=')
        header = re.compile(r"^\s*\[")
        for number, line in enumerate(self.lines, 1):
            if header.match(line):
                block = block + 1 if re.match(r"^\s*\[\[\s*models\s*\]\]", line) else -2
                if index is not None and block == index and key == "":
                    return number
                continue
            if (block == -1 if index is None else block == index) and pattern.match(line):
                return number
        return self.line_of(index, "") if key and index is not None else None

    def fail(self, index: int | None, key: str, what: str) -> NoReturn:
        line = self.line_of(index, key)
        where = f"{self.source}:{line}" if line else self.source
        name = key if index is None else f"models[{index}].{key}"
        raise ConfigError(f"{where}: {name}: {what}")

    def model(self, index: int, entry: dict[str, Any]) -> ModelSpec:
        for key in entry:
            if key not in _KEYS and key not in self.knobs:
                self.fail(index, key, f"unknown key {key!r}")
        get = _Getter(self, index, entry)
        if "name" not in entry:
            self.fail(index, "name", "missing (every model needs a name)")
        api = get.choice("api", self.apis) or "chat"
        key_env = get.string("api_key_env")
        if key_env is not None and key_env not in self.env:
            self.fail(index, "api_key_env", f"the environment variable {key_env} is not set")
        style = get.choice("tool_name_style", TOOL_NAME_STYLES)
        modalities = get.strings("input_modalities", MODALITIES)
        return ModelSpec(
            name=get.string("name"),
            upstreams=get.urls("upstreams"),
            aliases=get.strings("aliases") or (),
            api=api,
            backend_model=get.string("backend_model"),
            profile=get.choice("profile", self.profiles),
            api_key=self.env.get(key_env) if key_env else None,
            api_key_env=key_env,
            tool_name_style=style,
            context_window=get.positive("context_window"),
            max_output_tokens=get.positive("max_output_tokens"),
            input_modalities=modalities,
            supports_tools=get.flag("supports_tools"),
            supports_reasoning=get.flag("supports_reasoning"),
            max_concurrency=get.positive("max_concurrency") or 0,
            fallbacks=get.strings("fallbacks") or (),
            settings=tuple(self.knob(index, k, v) for k, v in entry.items() if k in self.knobs),
        )

    def knob(self, index: int, key: str, value: Any) -> tuple[str, Any]:
        """A gateway setting the model sets for itself, checked as the setting is."""
        try:
            return key, self.knobs[key](value)
        except ValueError as exc:
            got = f"; got {value!r}" if len(repr(value)) < 80 else ""
            self.fail(index, key, f"{exc}{got}")

    def cross(self, config: ModelsConfig) -> None:
        """Names unique, fallbacks and the default known."""
        seen: dict[str, int] = {}
        for i, spec in enumerate(config.models):
            for name in (spec.name, *spec.aliases):
                assert name is not None
                if name in seen:
                    key = "name" if name == spec.name else "aliases"
                    self.fail(i, key, f"{name!r} is already a name of models[{seen[name]}]")
                seen[name] = i
        for i, spec in enumerate(config.models):
            for fallback in spec.fallbacks:
                if fallback not in seen:
                    self.fail(i, "fallbacks", f"{fallback!r} is no model of this file")
                if seen[fallback] == i:
                    self.fail(i, "fallbacks", f"{fallback!r} is this model itself")
        if config.default_model is not None and config.default_model not in seen:
            self.fail(None, "default_model", f"{config.default_model!r} is no model of this file")


class _Getter:
    """One model's values, each checked against what its key takes."""

    def __init__(self, checker: _Checker, index: int, entry: dict[str, Any]) -> None:
        self.checker, self.index, self.entry = checker, index, entry

    def bad(self, key: str, detail: str = "") -> Any:
        value = self.entry[key]
        got = (
            f"; got {value!r}"
            if not isinstance(value, dict | list) or len(repr(value)) < 80
            else ""
        )
        what = _KEYS[key].format(apis=", ".join(self.checker.apis))
        self.checker.fail(self.index, key, f"expected {what}{detail}{got}")

    def string(self, key: str) -> str | None:
        value = self.entry.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            self.bad(key)
        return value

    def choice(self, key: str, choices: tuple[str, ...]) -> str | None:
        value = self.string(key)
        if value is not None and value not in choices:
            self.bad(key, f" ({', '.join(choices)})")
        return value

    def strings(self, key: str, choices: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
        value = self.entry.get(key)
        if value is None:
            return None
        ok = isinstance(value, list) and all(isinstance(v, str) and v for v in value)
        if not ok or (choices is not None and not set(value) <= set(choices)):
            self.bad(key)
        return tuple(value)

    def urls(self, key: str) -> tuple[str, ...]:
        if key not in self.entry:
            self.checker.fail(self.index, key, "missing (every model needs an upstream)")
        urls = self.strings(key) or ()
        if not urls or not all(re.match(r"^https?://[^/\s]+", u) for u in urls):
            self.bad(key)
        if len(set(urls)) != len(urls):
            self.bad(key, " (each once)")
        return urls

    def positive(self, key: str) -> int | None:
        value = self.entry.get(key)
        if value is not None and (type(value) is not int or value <= 0):
            self.bad(key)
        return value

    def flag(self, key: str) -> bool:
        value = self.entry.get(key, True)
        if not isinstance(value, bool):
            self.bad(key)
        return value


def catalog_entries(config: ModelsConfig) -> dict[str, dict[str, Any]]:
    """What `/v1/models` (and Codex) are told of each model, from the config."""
    entries: dict[str, dict[str, Any]] = {}
    for spec in config.models:
        if spec.name is None:
            continue
        entry: dict[str, Any] = {}
        if spec.context_window is not None:
            entry["context_window"] = spec.context_window
        if spec.input_modalities is not None:
            entry["input_modalities"] = list(spec.input_modalities)
        if not spec.supports_reasoning:
            entry["reasoning_levels"] = []
        entries[spec.name] = entry
    return entries

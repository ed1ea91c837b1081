"""Model metadata for Codex on `GET /v1/models` (`--model-metadata`), and its file.

The pure catalog (`core/model_catalog.py`) with plain values; then the gateway on loopback in
front of a scripted backend, asked by the official SDK (`client.models.list()`, OpenAI's list
shape) and raw (Codex's `models`); then a wrong file, refused at startup by `streamer serve`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from harness import GatewayHarness
from openai import AsyncOpenAI
from scripted_backend import ScriptedBackend

from streamer.cli import main
from streamer.core.model_catalog import (
    DEFAULT_CONTEXT_WINDOW,
    ModelCatalog,
    catalog_body,
    codex_model_info,
    models_answer,
    parse_catalog,
)
from streamer.core.model_metadata import load_model_catalog

# What Codex 0.169 refuses a catalog entry without (serde: "missing field …"; and one of
# base_instructions / model_messages.instructions_template), found by feeding it entries.
CODEX_REQUIRED = {
    "slug", "display_name", "supported_reasoning_levels", "shell_type", "visibility",
    "supported_in_api", "priority", "support_verbosity", "truncation_policy",
    "experimental_supported_tools", "base_instructions",
}  # fmt: skip

METADATA_TOML = """\
[defaults]
context_window = 32768
input_modalities = ["text"]

[models."qwen3:8b"]
context_window = 40960
auto_compact_token_limit = 30000
reasoning_levels = ["low", "high"]
apply_patch_tool_type = "none"
supports_parallel_tool_calls = false
base_instructions = "Be brief."
web_search_tool_type = "text_and_image"   # not a key streamer knows: passed to Codex as is
"""


def _catalog(text: str = METADATA_TOML) -> ModelCatalog:
    import tomllib

    return parse_catalog(tomllib.loads(text))


# --- the pure catalog ------------------------------------------------------------------


def test_defaults_describe_any_model_for_codex() -> None:
    info = codex_model_info("m", ModelCatalog(), None, 0)
    assert set(info) >= CODEX_REQUIRED
    assert info["slug"] == info["display_name"] == "m"
    assert info["context_window"] == info["max_context_window"] == DEFAULT_CONTEXT_WINDOW
    assert info["auto_compact_token_limit"] is None  # Codex derives it from the window
    assert [level["effort"] for level in info["supported_reasoning_levels"]] == [
        "low", "medium", "high",
    ]  # fmt: skip
    assert info["default_reasoning_level"] == "medium"
    assert info["input_modalities"] == ["text", "image"]
    assert info["apply_patch_tool_type"] == "freeform"
    assert info["supports_parallel_tool_calls"] is True
    assert info["supports_search_tool"] is False  # MCP tools up front, as namespaces
    assert info["base_instructions"].strip()


def test_a_models_entry_overrides_the_files_defaults() -> None:
    catalog = _catalog()
    info = codex_model_info("qwen3:8b", catalog, None, 3)
    assert info["context_window"] == info["max_context_window"] == 40960
    assert info["auto_compact_token_limit"] == 30000
    assert info["supported_reasoning_levels"] == [
        {"effort": "low", "description": "Fast responses with lighter reasoning"},
        {"effort": "high", "description": "Deeper reasoning for complex problems"},
    ]
    assert info["default_reasoning_level"] == "low"  # no medium: the first level
    assert info["apply_patch_tool_type"] is None  # "none": no apply_patch tool
    assert info["supports_parallel_tool_calls"] is False
    assert info["base_instructions"] == "Be brief."
    assert info["input_modalities"] == ["text"]  # from [defaults]
    assert info["web_search_tool_type"] == "text_and_image"  # passed through
    assert info["priority"] == 3
    other = codex_model_info("other", catalog, None, 0)
    assert other["context_window"] == 32768 and other["input_modalities"] == ["text"]


def test_the_backends_context_length_beats_the_files_defaults_not_its_entry() -> None:
    catalog = _catalog()
    assert codex_model_info("other", catalog, {"max_model_len": 8192}, 0)["context_window"] == 8192
    assert codex_model_info("qwen3:8b", catalog, {"max_model_len": 8192}, 0)["context_window"] == (
        40960
    )
    assert codex_model_info("x", ModelCatalog(), {"context_length": 4096}, 0)["context_window"] == (
        4096
    )


def test_no_reasoning_levels_and_no_apply_patch() -> None:
    catalog = _catalog('[models.m]\nreasoning_levels = []\napply_patch_tool_type = "none"\n')
    info = codex_model_info("m", catalog, None, 0)
    assert info["supported_reasoning_levels"] == []
    assert info["default_reasoning_level"] is None
    assert info["apply_patch_tool_type"] is None


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[models.m]\ncontext_window = 0\n", "models.m.context_window: must be a positive"),
        ('[models.m]\ncontext_window = "big"\n', "models.m.context_window: must be a positive"),
        ("[models.m]\ncontext_window = true\n", "models.m.context_window"),
        ('[models.m]\nreasoning_levels = ["huge"]\n', "models.m.reasoning_levels[0]: must be"),
        ('[models.m]\nreasoning_levels = "low"\n', "models.m.reasoning_levels: must be a list"),
        ('[defaults]\ninput_modalities = ["video"]\n', "defaults.input_modalities[0]"),
        ("[defaults]\ninput_modalities = []\n", "defaults.input_modalities: must be a non-empty"),
        ('[models.m]\napply_patch_tool_type = "diff"\n', "models.m.apply_patch_tool_type"),
        # Codex 0.169 drops the whole catalog for it
        ('[models.m]\napply_patch_tool_type = "function"\n', "must be one of freeform, none"),
        ('[models.m]\nsupports_parallel_tool_calls = "yes"\n', "supports_parallel_tool_calls"),
        ("[models.m]\nauto_compact_token_limit = -5\n", "models.m.auto_compact_token_limit"),
        ('[models.m]\nbase_instructions = ""\n', "models.m.base_instructions: must be a non-"),
        ("[model.m]\ncontext_window = 1\n", "unknown key 'model'"),
        ('models = ["m"]\n', "models: must be a table keyed by model name"),
        ("models = { m = 5 }\n", "models.m: must be a table"),
    ],
)
def test_a_wrong_entry_is_named(text: str, where: str) -> None:
    with pytest.raises(ValueError, match=r"^meta\.toml: ") as caught:
        import tomllib

        parse_catalog(tomllib.loads(text), "meta.toml")
    assert where in str(caught.value)


def test_the_list_keeps_openais_shape_and_adds_codexs() -> None:
    backend = {"object": "list", "data": [{"id": "a", "object": "model", "max_model_len": 1000}]}
    body = catalog_body(backend, _catalog(), configured="forced")
    assert body is not None
    assert [d["id"] for d in body["data"]] == ["a", "qwen3:8b", "forced"]
    assert body["data"][0] == backend["data"][0]  # the backend's entry untouched
    assert [m["slug"] for m in body["models"]] == ["a", "qwen3:8b", "forced"]
    assert [m["priority"] for m in body["models"]] == [0, 1, 2]
    assert body["models"][0]["context_window"] == 1000


def test_a_backend_without_a_list() -> None:
    # a failed backend list: the file's models still are described...
    answer = models_answer(500, b"oops", _catalog(), None)
    assert answer is not None and [m["slug"] for m in answer["models"]] == ["qwen3:8b"]
    # ...and with nothing to describe, the backend's answer passes through
    assert models_answer(500, b"oops", ModelCatalog(), None) is None
    assert models_answer(200, b"not json", ModelCatalog(), None) is None
    assert models_answer(200, b'{"object":"list","data":[]}', ModelCatalog(), None) is None


def test_the_file_as_toml_or_json(tmp_path: Path) -> None:
    toml_file = tmp_path / "meta.toml"
    toml_file.write_text(METADATA_TOML)
    json_file = tmp_path / "meta.json"
    json_file.write_text(json.dumps({"models": {"qwen3:8b": {"context_window": 40960}}}))
    assert load_model_catalog(str(toml_file)).models["qwen3:8b"]["context_window"] == 40960
    assert load_model_catalog(str(json_file)).models["qwen3:8b"]["context_window"] == 40960
    assert load_model_catalog(None) == ModelCatalog()
    json_file.write_text("{")
    with pytest.raises(ValueError, match=r"meta\.json: "):
        load_model_catalog(str(json_file))
    with pytest.raises(ValueError, match=r"missing\.toml: No such file"):
        load_model_catalog(str(tmp_path / "missing.toml"))


def test_a_file_over_the_bound_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1024 * 1024) + "\n")
    with pytest.raises(ValueError, match="larger than 1048576 bytes"):
        load_model_catalog(str(big))


# --- the gateway on loopback -----------------------------------------------------------


async def _get(url: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(url) as reply:
        return reply.status, await reply.json(content_type=None)


async def test_sdk_lists_models_and_codex_finds_their_metadata(tmp_path: Path) -> None:
    meta = tmp_path / "meta.toml"
    meta.write_text(METADATA_TOML)
    backend = ScriptedBackend(models=["small", "qwen3:8b"], model_fields={"max_model_len": 8192})
    async with GatewayHarness(backend=backend, model_metadata=str(meta)) as gw:
        async with AsyncOpenAI(base_url=gw.url, api_key="k", max_retries=0) as sdk:
            page = await sdk.models.list()
            ids = [m.id for m in page.data]
        status, body = await _get(gw.url + "/models?client_version=0.169.0")  # as Codex asks
    assert ids == ["small", "qwen3:8b"]
    assert status == 200 and body["object"] == "list"
    models = {m["slug"]: m for m in body["models"]}
    assert list(models) == ["small", "qwen3:8b"]
    assert models["small"]["context_window"] == 8192  # what the backend reports
    assert models["qwen3:8b"]["context_window"] == 40960  # the file's entry wins
    assert models["qwen3:8b"]["auto_compact_token_limit"] == 30000
    assert models["small"]["input_modalities"] == ["text"]


async def _failing_models_backend() -> tuple[web.AppRunner, str]:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "down"}}, status=503)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"


async def test_a_failed_backend_list(tmp_path: Path) -> None:
    runner, upstream = await _failing_models_backend()
    meta = tmp_path / "meta.toml"
    meta.write_text(METADATA_TOML)
    try:
        async with GatewayHarness(upstream=upstream) as gw:
            plain = await _get(gw.url + "/models")
        async with GatewayHarness(upstream=upstream, model_metadata=str(meta)) as gw:
            described = await _get(gw.url + "/models")
    finally:
        await runner.cleanup()
    assert plain == (503, {"error": {"message": "down"}})  # nothing to describe: as it was
    status, body = described  # the file's models are still described
    assert status == 200 and [m["slug"] for m in body["models"]] == ["qwen3:8b"]
    assert [d["id"] for d in body["data"]] == ["qwen3:8b"]


def test_serve_refuses_a_wrong_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    meta = tmp_path / "meta.toml"
    meta.write_text('[models."qwen3:8b"]\ncontext_window = "big"\n')
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model-metadata", str(meta)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--model-metadata {meta}: models.qwen3:8b.context_window: must be a positive" in err


def test_the_docs_example_file_is_a_valid_one() -> None:
    import tomllib

    page = (Path(__file__).resolve().parents[1] / "docs" / "clients.md").read_text()
    start = page.index("[defaults]                      # every model")
    example = page[start : page.index("```", start)]
    catalog = parse_catalog(tomllib.loads(example))
    info = codex_model_info("qwen3:8b", catalog, None, 0)
    assert info["context_window"] == 40960 and info["input_modalities"] == ["text"]
    assert info["apply_patch_tool_type"] is None

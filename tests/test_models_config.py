"""`--config streamer.toml`: the issue's example as written, and every error case with its
message (the file, the line, what is wrong), at startup through the CLI too."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from streamer import cli
from streamer.core.models_config import ConfigError, catalog_entries, load, parse
from streamer.upstream.chat.profiles import PROFILES
from streamer.upstream.kinds import NAMES as KIND_NAMES

PROFILE_NAMES = tuple(PROFILES)
ENV = {"LOCAL_KEY": "sk-local", "DEEPSEEK_API_KEY": "sk-deep"}

EXAMPLE = """\
default_model = "local"            # used when a request names no model

[[models]]
name = "local"                     # what clients send as `model`; also listed by /v1/models
aliases = ["qwen3-coder"]
upstreams = ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"]  # replicas
api = "chat"
backend_model = "Qwen/Qwen3-Coder-30B-A3B"   # sent to the backend (default: name)
profile = "vllm"                   # backend profile
api_key_env = "LOCAL_KEY"          # the environment variable holding the key; never the key
tool_name_style = "codex"
context_window = 131072            # model metadata (also what Codex is told)
input_modalities = ["text"]
supports_tools = true              # what a fallback must offer (also: supports_reasoning)
max_concurrency = 64               # per model, across its replicas
fallbacks = ["api"]                # tried in order when every replica fails before a first byte

[[models]]
name = "api"
upstreams = ["https://api.deepseek.com/v1"]
profile = "deepseek"
api_key_env = "DEEPSEEK_API_KEY"
"""


def test_the_issues_example_as_written() -> None:
    config = parse(EXAMPLE, "streamer.toml", ENV, PROFILE_NAMES, KIND_NAMES)
    local, api = config.models
    assert config.default_model == "local"
    assert local.name == "local" and local.aliases == ("qwen3-coder",)
    assert local.upstreams == ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1")
    assert local.backend_model == "Qwen/Qwen3-Coder-30B-A3B" and local.profile == "vllm"
    assert local.api_key == "sk-local" and "sk-local" not in repr(local)  # never shown
    assert local.context_window == 131072 and local.input_modalities == ("text",)
    assert local.max_concurrency == 64 and local.fallbacks == ("api",)
    assert not local.supports_images and local.supports_tools and local.supports_reasoning
    assert api.api_key == "sk-deep" and api.backend_model is None and api.max_concurrency == 0
    assert config.find("qwen3-coder") is local and config.find("api") is api
    assert config.find("gpt-5") is None
    assert catalog_entries(config) == {
        "local": {"context_window": 131072, "input_modalities": ["text"]},
        "api": {},
    }


def _model(body: str, top: str = "") -> str:
    return top + '[[models]]\nname = "m"\nupstreams = ["http://127.0.0.1:1/v1"]\n' + body


# (the file's text, the message: file, line and what is wrong)
CASES = [
    ("x = 1\n" + _model(""), "f.toml:1: x: unknown key 'x' (known: default_model, models)"),
    ('default_model = "m"\n', "f.toml: models: expected at least one [[models]] table"),
    ("models = 3\n", "f.toml:1: models: expected at least one [[models]] table"),
    (
        '[[models]]\nupstreams = ["http://a/v1"]\n',
        "f.toml:1: models[0].name: missing (every model needs a name)",
    ),
    ('[[models]]\nname = "m"\n', "f.toml:1: models[0].upstreams: missing"),
    (_model("colour = 'red'\n"), "f.toml:4: models[0].colour: unknown key 'colour'"),
    (
        '[[models]]\nname = "m"\nupstreams = []\n',
        "f.toml:3: models[0].upstreams: expected an array of http:// or https:// URLs; got []",
    ),
    (
        '[[models]]\nname = "m"\nupstreams = ["ftp://x"]\n',
        "f.toml:3: models[0].upstreams: expected an array of http:// or https:// URLs",
    ),
    (
        '[[models]]\nname = "m"\nupstreams = ["http://a/v1", "http://a/v1"]\n',
        "f.toml:3: models[0].upstreams: expected an array of http:// or https:// URLs (each once)",
    ),
    (
        '[[models]]\nname = 7\nupstreams = ["http://a/v1"]\n',
        "f.toml:2: models[0].name: expected a string; got 7",
    ),
    (_model('api = "grpc"\n'), "f.toml:4: models[0].api: expected one of chat, responses"),
    (_model('profile = "nope"\n'), "f.toml:4: models[0].profile: expected a backend profile"),
    (
        _model('tool_name_style = "camel"\n'),
        "f.toml:4: models[0].tool_name_style: expected one of codex, double-underscore",
    ),
    (
        _model('api_key_env = "NOT_SET_ANYWHERE"\n'),
        "f.toml:4: models[0].api_key_env: the environment variable NOT_SET_ANYWHERE is not set",
    ),
    (
        _model("context_window = 0\n"),
        "f.toml:4: models[0].context_window: expected a positive integer; got 0",
    ),
    (
        _model("context_window = 1.5\n"),
        "f.toml:4: models[0].context_window: expected a positive integer",
    ),
    (
        _model("max_concurrency = -1\n"),
        "f.toml:4: models[0].max_concurrency: expected a positive integer; got -1",
    ),
    (
        _model("max_concurrency = true\n"),
        "f.toml:4: models[0].max_concurrency: expected a positive integer",
    ),
    (
        _model('input_modalities = ["audio"]\n'),
        "f.toml:4: models[0].input_modalities: expected an array of text, image",
    ),
    (
        _model('supports_tools = "yes"\n'),
        "f.toml:4: models[0].supports_tools: expected a boolean; got 'yes'",
    ),
    (
        _model("supports_reasoning = 1\n"),
        "f.toml:4: models[0].supports_reasoning: expected a boolean",
    ),
    (
        _model('aliases = "x"\n'),
        "f.toml:4: models[0].aliases: expected an array of strings; got 'x'",
    ),
    (
        _model('fallbacks = ["other"]\n'),
        "f.toml:4: models[0].fallbacks: 'other' is no model of this file",
    ),
    (_model('fallbacks = ["m"]\n'), "f.toml:4: models[0].fallbacks: 'm' is this model itself"),
    (
        _model("", 'default_model = "zz"\n'),
        "f.toml:1: default_model: 'zz' is no model of this file",
    ),
    (_model("", "default_model = 3\n"), "f.toml:1: default_model: expected a string"),
    (
        _model("") + '\n[[models]]\nname = "n"\naliases = ["m"]\nupstreams = ["http://b/v1"]\n',
        "f.toml:7: models[1].aliases: 'm' is already a name of models[0]",
    ),
    (
        _model("") + '\n[[models]]\nname = "m"\nupstreams = ["http://b/v1"]\n',
        "f.toml:6: models[1].name: 'm' is already a name of models[0]",
    ),
    (
        "[[models]\n",
        "f.toml:1: Expected ']]' at the end of an array declaration (line 1, column 9)",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), CASES, ids=[m.split(": ", 1)[1][:40] for _, m in CASES]
)
def test_every_config_error_names_the_file_the_line_and_what_is_wrong(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(text, "f.toml", ENV, PROFILE_NAMES, KIND_NAMES)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_model_sets_its_profile_settings_by_their_names_checked_as_the_flags() -> None:
    from streamer.turns.options import model_knobs

    text = _model(
        'reasoning_efforts = "low,high"\ndrop_params = "stream_options"\nfile_parts = false\n'
    )
    (spec,) = parse(text, "f.toml", ENV, PROFILE_NAMES, KIND_NAMES, knobs=model_knobs()).models
    assert dict(spec.settings) == {
        "reasoning_efforts": "low,high",
        "drop_params": "stream_options",
        "file_parts": False,
    }
    for line, message in (
        ('system_messages = "first"\n', "--system-messages must be merge, keep or user"),
        ('backend_accepts = "seed"\n', "--backend-accepts: unknown parameter(s) seed"),
        ('file_parts = "no"\n', "expected a boolean; got 'no'"),
        ("reasoning_efforts = 3\n", "expected a string; got 3"),
    ):
        key = line.split(" ", 1)[0]
        with pytest.raises(ConfigError) as caught:
            parse(_model(line), "f.toml", ENV, PROFILE_NAMES, KIND_NAMES, knobs=model_knobs())
        assert str(caught.value).startswith(f"f.toml:4: models[0].{key}: {message}")
    with pytest.raises(ConfigError, match="unknown key 'port'"):  # not a model's to set
        parse(_model("port = 1\n"), "f.toml", ENV, PROFILE_NAMES, KIND_NAMES, knobs=model_knobs())


def test_a_missing_or_unreadable_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nowhere\.toml: No such file or directory"):
        load(str(tmp_path / "nowhere.toml"), ENV, PROFILE_NAMES, KIND_NAMES)
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load(str(binary), ENV, PROFILE_NAMES, KIND_NAMES)


def test_a_bad_config_stops_streamer_serve_with_its_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "streamer.toml"
    path.write_text(textwrap.dedent(_model("max_concurrency = 0\n")))
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--config", str(path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{path}:4: models[0].max_concurrency: expected a positive integer; got 0" in err


def test_config_and_upstream_are_exclusive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "streamer.toml"
    path.write_text(_model(""))
    with pytest.raises(SystemExit):
        cli.main(["serve", "--config", str(path), "--upstream", "http://127.0.0.1:1/v1"])
    assert "--config and --upstream are exclusive" in capsys.readouterr().err


def test_the_readme_example_parses() -> None:
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme.split("## Several models", 1)[1]
    text = section.split("```toml\n", 1)[1].split("```", 1)[0]
    from streamer.turns.options import model_knobs

    config = parse(text, "README.md", ENV, PROFILE_NAMES, KIND_NAMES, knobs=model_knobs())
    assert [m.name for m in config.models] == ["local", "api"]


def test_each_worker_holds_its_share_of_a_models_concurrency() -> None:
    from streamer.core.models_config import ModelsConfig, ModelSpec
    from streamer.turns.model_routes import per_worker

    config = ModelsConfig(
        (
            ModelSpec("a", ("http://a/v1",), max_concurrency=64),
            ModelSpec("b", ("http://b/v1",), max_concurrency=1),
            ModelSpec("c", ("http://c/v1",)),
        )
    )
    shares = [m.max_concurrency for m in per_worker(config, 3).models]
    assert shares == [21, 1, 0]  # 0: no limit
    assert per_worker(config, 1) is config


def test_the_startup_line_names_the_configured_models_not_the_embedded_one(
    tmp_path: Path,
) -> None:
    from streamer.config import Settings
    from streamer.turns.model_routes import serving_target

    path = tmp_path / "streamer.toml"
    path.write_text(
        '[[models]]\nname = "local"\nupstreams = ["http://a:8000/v1", "http://b:8000/v1"]\n'
        '[[models]]\nname = "api"\napi = "responses"\nupstreams = ["https://api.example/v1"]\n'
    )
    target = serving_target(Settings(config=str(path)))
    assert target == (
        f"{path}: local (chat) -> http://a:8000/v1, http://b:8000/v1; "
        "api (responses) -> https://api.example/v1"
    )
    assert serving_target(Settings(upstream="http://h:1/v1")) == "http://h:1/v1"
    assert serving_target(Settings()) == "embedded scripted model"
    path.write_text("[[models]]\n")  # changed under a worker: the file and its problem
    assert serving_target(Settings(config=str(path))).startswith(f"{path} ({path}:")

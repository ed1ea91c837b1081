"""Unit tests for the naming core (streamer/core/tools.py): one section per rule of issue 2."""

from __future__ import annotations

import ast
import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamer.core.errors import RequestError
from streamer.core.tools import (
    FlatTool,
    NamingConfig,
    ResolvedChoice,
    ResponsesToolNames,
    ToolIdentity,
)

LEGAL = re.compile(r"[A-Za-z0-9_-]{1,64}")
CUSTOM_PARAMS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}


def fn(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object"}, **extra}


def custom(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "custom", "name": name, **extra}


def ns(name: str, *members: dict[str, Any]) -> dict[str, Any]:
    return {"type": "namespace", "name": name, "description": "", "tools": list(members)}


def convert(tools: Any, input_items: Any = (), **config: Any) -> ResponsesToolNames:
    return ResponsesToolNames.convert(tools, input_items, config=NamingConfig(**config))


def flat_of(names: ResponsesToolNames, namespace: str | None, name: str, kind: str = "function"):
    ident = ToolIdentity(namespace, name, kind)  # type: ignore[arg-type]
    found = [t.name for t in names.tools if t.identity == ident]
    assert len(found) == 1, (ident, names.tools)
    return found[0]


def error(fn_, *args: Any, **kwargs: Any) -> RequestError:
    with pytest.raises(RequestError) as info:
        fn_(*args, **kwargs)
    err = info.value
    assert err.status == 400
    assert err.type == "invalid_request_error"
    return err


def assert_consistent(names: ResponsesToolNames, limit: int = 64) -> None:
    flats = [t.name for t in names.tools]
    assert len(set(flats)) == len(flats)
    for t in names.tools:
        assert re.fullmatch(rf"[A-Za-z0-9_-]{{1,{limit}}}", t.name), t.name
        assert names.decode(t.name) == t.identity
        assert names.encode(t.identity.namespace, t.identity.name, t.identity.kind) == t.name


# -- rule 1: flat name style ---------------------------------------------------------------


def test_codex_style_joins_with_double_underscore() -> None:
    names = convert([ns("mcp__docs", fn("search"), fn("fetch"))])
    assert [t.name for t in names.tools] == ["mcp__docs__search", "mcp__docs__fetch"]
    assert names.decode("mcp__docs__search") == ToolIdentity("mcp__docs", "search", "function")


def test_codex_style_joins_directly_on_existing_underscore() -> None:
    names = convert(
        [
            ns("mcp__codex_apps__calendar", fn("_create_event")),
            ns("clock_", fn("now")),
            ns("mcp__", fn("search"), fn("_raw")),
        ]
    )
    assert [t.name for t in names.tools] == [
        "mcp__codex_apps__calendar_create_event",
        "clock_now",
        "mcp__search",
        "mcp___raw",
    ]
    assert_consistent(names)


def test_functions_namespace_keeps_bare_names_in_codex_style() -> None:
    names = convert([ns("functions", fn("exec_command"), custom("exec"))])
    assert [t.name for t in names.tools] == ["exec_command", "exec"]
    assert names.decode("exec") == ToolIdentity("functions", "exec", "custom")


@pytest.mark.parametrize(
    ("style", "expected"),
    [
        ("double-underscore", ["functions__exec", "mcp__docs__search", "a___b"]),
        ("llamacpp", ["ns_functions___exec", "ns_mcp__docs___search", "ns_a____b"]),
        ("dotted", ["functions.exec", "mcp__docs.search", "a_.b"]),
    ],
)
def test_other_styles(style: str, expected: list[str]) -> None:
    tools = [ns("functions", fn("exec")), ns("mcp__docs", fn("search")), ns("a_", fn("b"))]
    names = convert(tools, style=style)
    assert [t.name for t in names.tools] == expected
    for t in names.tools:
        assert names.decode(t.name) == t.identity


def test_dotted_style_allows_dots_in_top_level_names() -> None:
    names = convert([fn("a.b"), ns("a", fn("b"))], style="dotted")
    assert flat_of(names, None, "a.b") == "a.b"
    member = flat_of(names, "a", "b")
    assert member != "a.b" and re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", member)
    assert names.decode(member) == ToolIdentity("a", "b")


def test_top_level_names_are_kept_exactly() -> None:
    names = convert([fn("exec_command"), fn("write-stdin"), custom("apply_patch")])
    assert [t.name for t in names.tools] == ["exec_command", "write-stdin", "apply_patch"]


# -- rule 2: backend-legal -----------------------------------------------------------------


def test_seventy_character_flat_name_is_shortened_with_a_hash() -> None:
    namespace, member = "mcp__" + "s" * 30, "m" * 33  # 30 + 5 + 2 + 33 = 70 characters
    names = convert([ns(namespace, fn(member))])
    flat = names.tools[0].name
    assert len(namespace + "__" + member) == 70
    assert len(flat) == 64 and LEGAL.fullmatch(flat)
    assert flat.startswith((namespace + "__" + member)[:55] + "_")
    assert re.fullmatch(r"[0-9a-f]{8}", flat[-8:])
    assert names.decode(flat) == ToolIdentity(namespace, member)


def test_long_names_sharing_sixty_characters_stay_distinct() -> None:
    shared = "x" * 60
    names = convert([ns("n", fn(shared + "_alpha"), fn(shared + "_beta"))])
    first, second = (t.name for t in names.tools)
    assert first != second and first[:55] == second[:55]
    assert_consistent(names)


def test_names_that_sanitise_to_the_same_string() -> None:
    names = convert([ns("ns", fn("a.b"), fn("a b"), fn("a/b")), fn("ns__a_b")])
    flats = [t.name for t in names.tools]
    assert flat_of(names, None, "ns__a_b") == "ns__a_b"  # legal top-level: kept
    assert all(f.startswith("ns__a_b_") for f in flats[:3])
    assert_consistent(names)


def test_illegal_and_too_long_top_level_names_are_sanitised() -> None:
    long_name = "t" * 70
    names = convert([fn("my tool"), fn(long_name), fn("naïve")])
    my_tool, long_flat, naive = (t.name for t in names.tools)
    assert my_tool.startswith("my_tool_") and naive.startswith("na_ve_")
    assert len(long_flat) == 64 and long_flat.startswith("t" * 55 + "_")
    assert names.decode(my_tool) == ToolIdentity(None, "my tool")
    assert_consistent(names)


def test_configurable_name_length() -> None:
    names = convert([ns("mcp__docs", fn("search_everything"))], max_name_length=20)
    flat = names.tools[0].name
    assert len(flat) == 20 and flat.startswith("mcp__docs___")
    assert_consistent(names, limit=20)


def test_same_identity_same_alias_on_every_request() -> None:
    member = ns("mcp__docs", fn("read.file"))
    a = convert([member])
    b = convert([fn("other"), ns("zzz", fn("q")), member])
    assert flat_of(a, "mcp__docs", "read.file") == flat_of(b, "mcp__docs", "read.file")


def test_alias_hash_is_stable_across_processes() -> None:
    """The hash must not depend on PYTHONHASHSEED: replayed history must match."""
    code = (
        "from streamer.core.tools import ResponsesToolNames as R;"
        "print(R.convert([{'type':'namespace','name':'a b','tools':"
        "[{'type':'function','name':'c.d'}]}]).tools[0].name)"
    )
    root = Path(__file__).resolve().parents[1]
    seen = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(root)}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        seen.add(out.stdout.strip())
    here = convert([ns("a b", fn("c.d"))]).tools[0].name
    assert seen == {here}


# -- rule 3: injective ---------------------------------------------------------------------


def test_two_namespaces_with_the_same_member_name() -> None:
    names = convert([ns("mcp__a", fn("search")), ns("mcp__b", fn("search"))])
    assert [t.name for t in names.tools] == ["mcp__a__search", "mcp__b__search"]
    assert names.decode("mcp__b__search") == ToolIdentity("mcp__b", "search")


@pytest.mark.parametrize("top_first", [True, False])
def test_top_level_name_wins_over_member_with_same_flat_name(top_first: bool) -> None:
    tools = [fn("other__add"), ns("other", fn("add"))]
    names = convert(tools if top_first else tools[::-1])
    assert flat_of(names, None, "other__add") == "other__add"
    member = flat_of(names, "other", "add")
    assert member.startswith("other__add_") and len(member) == len("other__add_") + 8
    assert names.decode("other__add") == ToolIdentity(None, "other__add")
    assert names.decode(member) == ToolIdentity("other", "add")


def test_top_level_name_from_a_later_input_item_still_wins() -> None:
    items = [{"type": "additional_tools", "role": "developer", "tools": [fn("other__add")]}]
    names = convert([ns("other", fn("add"))], items)
    assert flat_of(names, None, "other__add") == "other__add"
    assert flat_of(names, "other", "add") != "other__add"
    assert [t.identity.namespace for t in names.tools] == ["other", None]  # request order


def test_members_colliding_with_each_other() -> None:
    names = convert(
        [ns("a__b", fn("c")), ns("a", fn("b__c")), ns("a_", fn("x")), ns("a", fn("_x"))]
    )
    assert flat_of(names, "a__b", "c") == "a__b__c"  # first in request order keeps it
    assert flat_of(names, "a", "b__c").startswith("a__b__c_")
    assert flat_of(names, "a_", "x") == "a_x"
    assert flat_of(names, "a", "_x").startswith("a_x_")
    assert_consistent(names)


def test_alias_that_is_itself_taken_is_salted() -> None:
    alias = flat_of(convert([fn("other__add"), ns("other", fn("add"))]), "other", "add")
    names = convert([fn("other__add"), fn(alias), ns("other", fn("add"))])
    salted = flat_of(names, "other", "add")
    assert salted not in ("other__add", alias) and salted.startswith("other__add_")
    assert flat_of(names, None, alias) == alias
    assert_consistent(names)


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([fn("a"), fn("b"), fn("a")], "tools[2].name"),
        ([fn("a"), custom("a")], "tools[1].name"),
        ([ns("n", fn("x"), custom("x"))], "tools[0].tools[1].name"),
        ([ns("n", fn("x")), ns("n", fn("y"), fn("x"))], "tools[1].tools[1].name"),
        (
            [{"type": "tool_search", "execution": "client"}] * 2,
            "tools[1]",
        ),
    ],
)
def test_duplicate_identity_in_one_list_is_400(tools: list[Any], param: str) -> None:
    err = error(convert, tools)
    assert err.param == param
    assert "Duplicate" in err.message


def test_duplicate_within_an_input_item_is_400() -> None:
    items = [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "additional_tools", "tools": [ns("m", fn("a"), fn("a"))]},
    ]
    assert error(convert, [], items).param == "input[1].tools[0].tools[1].name"


def test_redeclaration_in_a_later_source_is_not_duplicated() -> None:
    items = [
        {"type": "additional_tools", "tools": [fn("a", description="second"), ns("m", fn("b"))]},
        {"type": "tool_search_output", "tools": [ns("m", fn("b"), fn("c"))]},
    ]
    names = convert([fn("a", description="first")], items)
    assert [t.name for t in names.tools] == ["a", "m__b", "m__c"]
    assert names.tools[0].description == "first"


def test_same_name_different_kind_across_sources_are_two_identities() -> None:
    items = [{"type": "additional_tools", "tools": [custom("a")]}]
    names = convert([fn("a")], items)
    assert flat_of(names, None, "a") == "a"
    assert flat_of(names, None, "a", "custom").startswith("a_")
    assert_consistent(names)


# -- rule 4: validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ("nope", "tools"),
        ([fn("a"), "x"], "tools[1]"),
        ([{"name": "a"}], "tools[0].type"),
        ([{"type": 3, "name": "a"}], "tools[0].type"),
        ([{"type": "function"}], "tools[0].name"),
        ([{"type": "custom", "name": ""}], "tools[0].name"),
        ([{"type": "namespace", "tools": [fn("a")]}], "tools[0].name"),
        ([{"type": "namespace", "name": "", "tools": [fn("a")]}], "tools[0].name"),
        ([{"type": "namespace", "name": 7, "tools": [fn("a")]}], "tools[0].name"),
        ([fn("z"), {"type": "namespace", "name": "n"}], "tools[1].tools"),
        ([{"type": "namespace", "name": "n", "tools": []}], "tools[0].tools"),
        ([{"type": "namespace", "name": "n", "tools": {"a": 1}}], "tools[0].tools"),
        ([ns("n", fn("a"), ns("inner", fn("b")))], "tools[0].tools[1].type"),
        ([ns("n", {"type": "web_search"})], "tools[0].tools[0].type"),
        ([ns("n", {"name": "x"})], "tools[0].tools[0].type"),
        ([ns("n", "x")], "tools[0].tools[0]"),
        ([fn("a"), fn("b"), ns("n", {"type": "function"})], "tools[2].tools[0].name"),
        ([ns("n", {"type": "custom", "name": None})], "tools[0].tools[0].name"),
        ([fn("a", description=5)], "tools[0].description"),
        ([fn("a", parameters=[1])], "tools[0].parameters"),
        ([fn("a", strict="yes")], "tools[0].strict"),
        ([custom("a", format="lark")], "tools[0].format"),
        ([custom("a", format={})], "tools[0].format.type"),
        ([custom("a", format={"type": "grammar", "syntax": "lark"})], "tools[0].format.definition"),
    ],
)
def test_validation_errors_point_at_the_field(tools: Any, param: str) -> None:
    err = error(convert, tools)
    assert err.param == param
    assert err.body() == {
        "error": {
            "message": err.message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


@pytest.mark.parametrize(
    ("items", "param"),
    [
        ([{"type": "message"}, {"type": "additional_tools", "tools": "x"}], "input[1].tools"),
        (
            [{}, {}, {"type": "tool_search_output", "tools": [{"type": "function"}]}],
            "input[2].tools[0].name",
        ),
        (
            [{"type": "tool_search_output", "tools": [ns("n", ns("m", fn("a")))]}],
            "input[0].tools[0].tools[0].type",
        ),
    ],
)
def test_validation_errors_in_input_items(items: list[Any], param: str) -> None:
    assert error(convert, None, items).param == param


HOSTED = [
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "mcp", "server_label": "docs", "server_url": "https://example.invalid"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "code_interpreter", "container": {"type": "auto"}},
    {"type": "computer_use_preview", "display_width": 1, "display_height": 1},
    {"type": "image_generation"},
    {"type": "shell", "environment": {"type": "container_auto"}},  # OpenAI's container
    {"type": "shell", "environment": {"type": "container_reference", "container_id": "c"}},
    {"type": "tool_search"},
    {"type": "tool_search", "execution": "server"},
    {"type": "some_future_tool", "name": "x"},
]


def test_hosted_tools_are_not_flattened_and_not_errors() -> None:
    tools = [*HOSTED, fn("exec_command")]
    before = copy.deepcopy(tools)
    names = convert(tools)
    assert [t.name for t in names.tools] == ["exec_command"]
    assert tools == before  # the echo is the client's own list, untouched


@pytest.mark.parametrize(
    ("tool", "required"),
    [
        ({"type": "shell"}, ["commands"]),
        ({"type": "shell", "environment": {"type": "local"}}, ["commands"]),  # the Agents SDK
        ({"type": "apply_patch"}, ["type", "path"]),
    ],
)
def test_shell_and_apply_patch_are_functions_named_by_their_type(
    tool: dict[str, Any], required: list[str]
) -> None:
    kind = tool["type"]
    names = convert([tool, fn("exec_command")])
    flat = names.tools[0]
    assert (flat.name, flat.identity) == (kind, ToolIdentity(None, kind, kind))  # type: ignore[arg-type]
    assert flat.parameters is not None and flat.parameters["required"] == required
    assert flat.description and flat.strict is None
    assert names.decode(kind).kind == kind
    assert names.encode(None, kind, kind) == kind  # type: ignore[arg-type]
    assert names.resolve_choice({"type": kind}) == ResolvedChoice("required", (kind,))
    assert error(convert, [tool, dict(tool)]).param == "tools[1]"


def test_a_function_named_shell_keeps_its_name() -> None:
    names = convert([fn("shell"), {"type": "shell"}])
    function, shell = names.tools
    assert function.name == "shell" and shell.name.startswith("shell_")
    assert names.decode(shell.name).kind == "shell" and names.decode("shell").kind == "function"
    assert names.resolve_choice({"type": "shell"}).allowed == (shell.name,)
    assert names.resolve_choice({"type": "function", "name": "shell"}).allowed == ("shell",)


@pytest.mark.parametrize(
    ("environment", "param"),
    [("local", "tools[0].environment"), ({"type": 3}, "tools[0].environment.type")],
)
def test_a_malformed_shell_environment_is_a_400(environment: Any, param: str) -> None:
    assert error(convert, [{"type": "shell", "environment": environment}]).param == param
    assert error(convert, [{"type": ["shell"]}]).param == "tools[0].type"  # unhashable: no 500


def test_local_shell_is_a_function_whose_arguments_are_the_action() -> None:
    names = convert([{"type": "local_shell"}, fn("exec_command")])
    shell = names.tools[0]
    assert (shell.name, shell.identity) == (
        "local_shell",
        ToolIdentity(None, "local_shell", "local_shell"),
    )
    assert shell.parameters is not None and shell.parameters["required"] == ["command"]
    assert names.decode("local_shell").kind == "local_shell"
    assert names.encode(None, "local_shell", "local_shell") == "local_shell"
    assert names.resolve_choice({"type": "local_shell"}).allowed == ("local_shell",)
    assert error(convert, [{"type": "local_shell"}, {"type": "local_shell"}]).param == "tools[1]"


# -- rule 5: custom tools and tool search ---------------------------------------------------


def test_custom_tool_becomes_a_function_with_one_string_input() -> None:
    grammar = {"type": "grammar", "syntax": "lark", "definition": "start: /[a-z]+/"}
    names = convert([custom("apply_patch", description="Edit files.", format=grammar)])
    (tool,) = names.tools
    assert tool.parameters == CUSTOM_PARAMS
    assert tool.description is not None
    assert tool.description.startswith("Edit files.") and "start: /[a-z]+/" in tool.description
    assert "lark" in tool.description
    assert names.decode("apply_patch") == ToolIdentity(None, "apply_patch", "custom")


def test_custom_tool_inside_a_namespace() -> None:
    names = convert([ns("functions", fn("exec_command"), custom("exec", description="Run."))])
    assert names.decode("exec") == ToolIdentity("functions", "exec", "custom")
    tool = names.tools[1]
    assert tool.parameters == CUSTOM_PARAMS and tool.description == "Run."
    names = convert([ns("editor", custom("patch", format={"type": "text"}))])
    assert names.decode("editor__patch").kind == "custom"
    assert names.tools[0].description is None


def test_custom_formats_without_description() -> None:
    regex = {"type": "grammar", "syntax": "regex", "definition": "^[0-9]+$"}
    names = convert([custom("num", format=regex), custom("other", format={"type": "json"})])
    assert names.tools[0].description is not None and "^[0-9]+$" in names.tools[0].description
    assert names.tools[1].description is not None and '"json"' in names.tools[1].description


def test_client_tool_search_becomes_a_function() -> None:
    params = {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "number"}},
    }
    tools = [
        {
            "type": "tool_search",
            "execution": "client",
            "description": "Find tools.",
            "parameters": params,
        }
    ]
    names = convert(tools)
    assert names.tools == [
        FlatTool(
            "tool_search",
            ToolIdentity(None, "tool_search", "tool_search"),
            "Find tools.",
            params,
            None,
        )
    ]
    assert names.decode("tool_search").kind == "tool_search"


def test_client_tool_search_beside_a_function_named_tool_search() -> None:
    names = convert([{"type": "tool_search", "execution": "client"}, fn("tool_search")])
    assert flat_of(names, None, "tool_search") == "tool_search"
    search = flat_of(names, None, "tool_search", "tool_search")
    assert search.startswith("tool_search_")
    assert_consistent(names)


def test_deferred_functions_are_exposed() -> None:
    member = fn("_create_event", defer_loading=True, strict=False, description="Create.")
    items = [
        {
            "type": "tool_search_output",
            "execution": "client",
            "call_id": "c1",
            "tools": [ns("mcp__codex_apps__calendar", member)],
        }
    ]
    names = convert([fn("lookup", defer_loading=True)], items)
    assert [t.name for t in names.tools] == ["lookup", "mcp__codex_apps__calendar_create_event"]
    tool = names.tools[1]
    assert (tool.description, tool.strict, tool.parameters) == (
        "Create.",
        False,
        {"type": "object"},
    )


def test_codex_lite_puts_everything_in_additional_tools() -> None:
    lite = ns("functions", fn("exec_command"), fn("write_stdin"), custom("apply_patch"))
    items = [
        {"type": "message", "role": "developer", "content": "base prompt"},
        {
            "type": "additional_tools",
            "role": "developer",
            "tools": [lite, ns("mcp__docs", fn("search"))],
        },
    ]
    names = convert(None, items)
    assert [t.name for t in names.tools] == [
        "exec_command",
        "write_stdin",
        "apply_patch",
        "mcp__docs__search",
    ]
    assert names.decode("write_stdin") == ToolIdentity("functions", "write_stdin")


@pytest.mark.parametrize(
    "input_items", ["just text", None, b"x", {"type": "additional_tools"}, [1, None, "s"]]
)
def test_inputs_without_tool_items(input_items: Any) -> None:
    assert [t.name for t in convert([fn("a")], input_items).tools] == ["a"]


# -- namespace descriptions ----------------------------------------------------------------


def described(name: str, description: Any, *members: dict[str, Any]) -> dict[str, Any]:
    return {**ns(name, *members), "description": description}


@pytest.mark.parametrize(
    "description",
    [
        "Tools in the mcp__docs namespace.",
        "  Tools in the mcp__docs namespace.\n",
        "",
        "  ",
        None,
        7,
    ],
)
def test_boilerplate_and_empty_namespace_descriptions_are_ignored(description: Any) -> None:
    names = convert(
        [described("mcp__docs", description, fn("search", description="Find."), fn("x"))]
    )
    assert [t.description for t in names.tools] == ["Find.", None]


def test_real_namespace_description_prefixes_each_member() -> None:
    grammar = {"type": "grammar", "syntax": "regex", "definition": "^[0-9]+$"}
    members = (fn("search", description="Find."), fn("fetch"), custom("patch", format=grammar))
    names = convert([described("mcp__docs", "  Company wiki.\n", *members), fn("top")])
    search, fetch, patch, top = names.tools
    assert search.description == "Company wiki.\n\nFind."
    assert fetch.description == "Company wiki."
    assert patch.description is not None
    assert patch.description.startswith("Company wiki.\n\nThe `input` string must match")
    assert top.description is None
    # The description changes what the model reads, never the names or the routing.
    plain = convert([ns("mcp__docs", *members), fn("top")])
    assert [t.name for t in names.tools] == [t.name for t in plain.tools]
    assert [t.identity for t in names.tools] == [t.identity for t in plain.tools]


def test_another_namespaces_boilerplate_is_a_real_description() -> None:
    names = convert([described("mcp__a", "Tools in the mcp__b namespace.", fn("x"))])
    assert names.tools[0].description == "Tools in the mcp__b namespace."


def test_namespace_description_from_input_items_and_first_declaration_wins() -> None:
    cal = described("mcp__cal", "Plan events.", fn("_create", description="Create."))
    again = described("mcp__cal", "Other words.", fn("_create", description="Create."))
    items = [
        {"type": "tool_search_output", "tools": [cal]},
        {"type": "additional_tools", "tools": [again]},
    ]
    names = convert(None, items)
    assert [t.description for t in names.tools] == ["Plan events.\n\nCreate."]


# -- rule 6: tool_choice -------------------------------------------------------------------

CHOICE_TOOLS = [
    fn("exec_command"),
    fn("search"),
    ns("mcp__a", fn("search"), fn("fetch"), custom("raw")),
    ns("mcp__b", fn("search"), fn("fetch")),
    ns("mcp__c", fn("only_here")),
    custom("apply_patch"),
]


@pytest.fixture
def choices() -> ResponsesToolNames:
    return convert(CHOICE_TOOLS)


@pytest.mark.parametrize("mode", ["auto", "none", "required"])
def test_string_choices_pass_through(choices: ResponsesToolNames, mode: str) -> None:
    assert choices.resolve_choice(mode) == ResolvedChoice(mode)  # type: ignore[arg-type]


def test_missing_choice_is_auto(choices: ResponsesToolNames) -> None:
    assert choices.resolve_choice(None) == ResolvedChoice("auto")


def test_required_without_callable_tools_is_400() -> None:
    assert error(convert([]).resolve_choice, "required").param == "tool_choice"
    assert error(convert(HOSTED).resolve_choice, "required").param == "tool_choice"


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        ("sometimes", "tool_choice"),
        (["auto"], "tool_choice"),
        ({"name": "search"}, "tool_choice.type"),
        ({"type": "function"}, "tool_choice.name"),
        ({"type": "function", "name": ""}, "tool_choice.name"),
        ({"type": "function", "name": "nope"}, "tool_choice.name"),
        ({"type": "function", "name": "fetch"}, "tool_choice.name"),
        ({"type": "function", "name": "x", "namespace": 5}, "tool_choice.namespace"),
        ({"type": "function", "name": "search", "namespace": "mcp__zz"}, "tool_choice.namespace"),
        ({"type": "function", "name": "nope", "namespace": "mcp__a"}, "tool_choice.name"),
        ({"type": "namespace", "name": "mcp__zz"}, "tool_choice.name"),
    ],
)
def test_bad_choices_are_400(choices: ResponsesToolNames, choice: Any, param: str) -> None:
    assert error(choices.resolve_choice, choice).param == param


def test_ambiguous_bare_name_names_the_namespaces(choices: ResponsesToolNames) -> None:
    err = error(choices.resolve_choice, {"type": "function", "name": "fetch"})
    assert "mcp__a" in err.message and "mcp__b" in err.message


@pytest.mark.parametrize(
    ("choice", "flat"),
    [
        ({"type": "function", "name": "exec_command"}, "exec_command"),
        ({"type": "function", "name": "search"}, "search"),  # top-level beats bare members
        ({"type": "function", "name": "search", "namespace": "mcp__b"}, "mcp__b__search"),
        ({"type": "function", "name": "mcp__a__fetch"}, "mcp__a__fetch"),  # exact flat name
        ({"type": "function", "name": "only_here"}, "mcp__c__only_here"),  # unique bare member
        ({"type": "custom", "name": "raw"}, "mcp__a__raw"),
        ({"type": "custom", "name": "apply_patch"}, "apply_patch"),
        ({"type": "function", "name": "exec_command", "namespace": "exec_command"}, "exec_command"),
        ({"type": "function", "name": "exec_command", "namespace": "functions"}, "exec_command"),
        ({"type": "function", "name": "exec_command", "namespace": ""}, "exec_command"),
    ],
)
def test_forced_single_tool(choices: ResponsesToolNames, choice: dict[str, Any], flat: str) -> None:
    before = copy.deepcopy(choice)
    assert choices.resolve_choice(choice) == ResolvedChoice("required", (flat,))
    assert choice == before  # echoed as sent


def test_choice_resolves_to_an_aliased_member() -> None:
    names = convert([fn("other__add"), ns("other", fn("add"))])
    alias = flat_of(names, "other", "add")
    choice = {"type": "function", "name": "add", "namespace": "other"}
    assert names.resolve_choice(choice) == ResolvedChoice("required", (alias,))
    assert names.resolve_choice({"type": "function", "name": "add"}).allowed == (alias,)
    assert names.resolve_choice({"type": "function", "name": "other__add"}).allowed == (
        "other__add",
    )


def test_choice_prefers_the_named_kind() -> None:
    names = convert([fn("a")], [{"type": "additional_tools", "tools": [custom("a")]}])
    custom_flat = flat_of(names, None, "a", "custom")
    assert names.resolve_choice({"type": "custom", "name": "a"}).allowed == (custom_flat,)
    assert names.resolve_choice({"type": "function", "name": "a"}).allowed == ("a",)


def test_bare_name_in_functions_namespace_under_double_underscore() -> None:
    names = convert([ns("functions", fn("exec"))], style="double-underscore")
    assert names.resolve_choice({"type": "function", "name": "exec"}).allowed == (
        "functions__exec",
    )


@pytest.mark.parametrize(
    "choice",
    [
        {"type": "web_search_preview"},
        {"type": "web_search_preview_2025_03_11"},
        {"type": "mcp", "server_label": "docs", "name": "search"},
        {"type": "file_search"},
        {"type": "computer_use_preview"},
        {"type": "code_interpreter"},
        {"type": "image_generation"},
        {"type": "apply_patch"},  # none declared
        {"type": "shell"},
        {"type": "local_shell"},
        {"type": "programmatic_tool_calling"},
        {"type": "tool_search"},  # no client tool_search declared
    ],
)
def test_forcing_a_tool_nothing_here_can_call_is_a_400(
    choices: ResponsesToolNames, choice: dict[str, Any]
) -> None:
    """Forcing a hosted (or undeclared) tool would be silently ignored: a 400 instead."""
    err = error(choices.resolve_choice, choice)
    assert err.param == "tool_choice.type" and repr(choice["type"]) in err.message
    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [choice]}
    assert choices.resolve_choice(allowed) == ResolvedChoice("auto")  # not forced: as before


def test_a_shell_in_a_hosted_container_cannot_be_forced() -> None:
    names = convert([{"type": "shell", "environment": {"type": "container_auto"}}, fn("a")])
    assert [t.name for t in names.tools] == ["a"]
    assert error(names.resolve_choice, {"type": "shell"}).param == "tool_choice.type"


def test_tool_search_and_namespace_choices() -> None:
    names = convert([{"type": "tool_search", "execution": "client"}, ns("m", fn("a"), custom("b"))])
    assert names.resolve_choice({"type": "tool_search"}) == ResolvedChoice(
        "required", ("tool_search",)
    )
    assert names.resolve_choice({"type": "namespace", "name": "m"}) == ResolvedChoice(
        "required", ("m__a", "m__b")
    )


def test_allowed_tools(choices: ResponsesToolNames) -> None:
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [
            {"type": "function", "name": "exec_command"},
            {"type": "mcp", "server_label": "docs"},
            {"type": "function", "name": "fetch", "namespace": "mcp__b"},
            {"type": "function", "name": "only_here"},
            {"type": "function", "name": "exec_command"},
            {"type": "image_generation"},
        ],
    }
    assert choices.resolve_choice(choice) == ResolvedChoice(
        "auto", ("exec_command", "mcp__b__fetch", "mcp__c__only_here")
    )
    choice["mode"] = "required"
    assert choices.resolve_choice(choice).mode == "required"


def test_allowed_tools_with_only_hosted_entries(choices: ResponsesToolNames) -> None:
    """Auto over only hosted tools stays auto; required over them would force one: a 400."""
    choice = {
        "type": "allowed_tools",
        "mode": "auto",
        "tools": [{"type": "mcp", "server_label": "x"}],
    }
    assert choices.resolve_choice(choice) == ResolvedChoice("auto")
    assert error(choices.resolve_choice, {**choice, "mode": "required"}).param == (
        "tool_choice.tools"
    )


@pytest.mark.parametrize(
    ("choice", "param"),
    [
        (
            {
                "type": "allowed_tools",
                "mode": "always",
                "tools": [{"type": "function", "name": "search"}],
            },
            "tool_choice.mode",
        ),
        ({"type": "allowed_tools", "mode": "auto", "tools": []}, "tool_choice.tools"),
        ({"type": "allowed_tools", "mode": "auto"}, "tool_choice.tools"),
        ({"type": "allowed_tools", "mode": "auto", "tools": ["search"]}, "tool_choice.tools[0]"),
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"name": "search"}]},
            "tool_choice.tools[0].type",
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "auto",
                "tools": [
                    {"type": "function", "name": "search"},
                    {"type": "function", "name": "fetch"},
                ],
            },
            "tool_choice.tools[1].name",
        ),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [
                    {"type": "mcp", "server_label": "x"},
                    {"type": "image_generation"},
                    {"type": "function", "name": "gone"},
                ],
            },
            "tool_choice.tools[2].name",
        ),
    ],
)
def test_allowed_tools_errors(choices: ResponsesToolNames, choice: Any, param: str) -> None:
    assert error(choices.resolve_choice, choice).param == param


# -- rule 7: history ----------------------------------------------------------------------


def test_history_maps_to_the_name_the_model_was_offered() -> None:
    names = convert(
        [fn("other__add"), ns("other", fn("add")), ns("mcp__docs", fn("search"), custom("raw"))]
    )
    assert names.encode("other", "add") == flat_of(names, "other", "add")
    assert names.encode(None, "other__add") == "other__add"
    assert names.encode("", "other__add") == "other__add"
    assert names.encode("mcp__docs", "raw", "custom") == "mcp__docs__raw"
    assert names.encode("mcp__docs", "search") == "mcp__docs__search"


def test_history_namespace_equal_to_name_is_the_top_level_function() -> None:
    items = [{"type": "tool_search_output", "tools": [fn("get_shipping_eta", defer_loading=True)]}]
    names = convert([], items)
    assert names.encode("get_shipping_eta", "get_shipping_eta") == "get_shipping_eta"


def test_history_default_namespace_equivalence() -> None:
    names = convert(
        [fn("exec_command")],
        [{"type": "additional_tools", "tools": [ns("functions", fn("write_stdin"))]}],
    )
    assert names.encode("functions", "exec_command") == "exec_command"
    assert names.encode(None, "write_stdin") == "write_stdin"
    assert names.decode("write_stdin") == ToolIdentity("functions", "write_stdin")


def test_history_kind_mismatch_uses_the_declared_tool() -> None:
    names = convert([ns("editor", custom("patch"))])
    assert names.encode("editor", "patch", "function") == "editor__patch"


def test_undeclared_history_maps_deterministically_and_registers() -> None:
    a = convert([fn("exec_command")])
    b = convert([ns("mcp__other", fn("x")), fn("y")])
    for names in (a, b):
        assert names.encode("mcp__gone", "search") == "mcp__gone__search"
        assert names.decode("mcp__gone__search") == ToolIdentity("mcp__gone", "search")
        assert names.encode("mcp__gone", "search") == "mcp__gone__search"
        assert names.encode("functions", "old_tool") == "old_tool"
        assert len(names) == len(names.tools)  # registrations are not offered tools
    assert a.encode("bad ns", "x.y") == b.encode("bad ns", "x.y")


def test_undeclared_history_never_takes_a_declared_name() -> None:
    names = convert([fn("mcp__docs__search")])
    flat = names.encode("mcp__docs", "search")
    assert flat != "mcp__docs__search" and LEGAL.fullmatch(flat)
    assert names.decode(flat) == ToolIdentity("mcp__docs", "search")
    assert names.decode("mcp__docs__search") == ToolIdentity(None, "mcp__docs__search")


@pytest.mark.parametrize(
    ("namespace", "name", "kind"),
    [
        (None, "", "function"),
        ("", "", "custom"),
        (None, None, "function"),
        (7, 8, "weird"),
        ("ns", "x" * 300, "function"),
        ("名前空間", "ツール", "custom"),
        ("a\ud800b", "c\x00d", "function"),
        ("ns", "a b\n", "function"),
    ],
)
def test_odd_history_names_never_raise(namespace: Any, name: Any, kind: Any) -> None:
    names = convert([fn("a")])
    flat = names.encode(namespace, name, kind)
    assert LEGAL.fullmatch(flat)
    assert names.encode(namespace, name, kind) == flat
    assert names.decode(flat).name == (
        name if isinstance(name, str) else "" if name is None else str(name)
    )
    assert flat != "a"


# -- rule 8: bounded work -----------------------------------------------------------------


class CountingList(list):
    """A list that counts how many entries anyone iterates over."""

    visited = 0

    def __iter__(self):  # type: ignore[override]
        for item in super().__iter__():
            CountingList.visited += 1
            yield item


def test_too_many_tools_is_400_before_proportional_work() -> None:
    CountingList.visited = 0
    tools = CountingList(["not a tool"] * 200_000)  # invalid entries: validation never ran
    err = error(convert, tools, max_tools=100)
    assert err.param == "tools" and err.code == "array_above_max_length"
    assert CountingList.visited <= 101


def test_namespace_members_count_against_the_budget() -> None:
    tools = [ns("n", *(fn(f"t{i}") for i in range(5)))]
    assert error(convert, tools, max_tools=4).param == "tools"
    assert len(convert(tools, max_tools=5)) == 5


def test_budget_counts_input_items_too() -> None:
    items = [{"type": "message"}, {"type": "tool_search_output", "tools": [fn("b"), fn("c")]}]
    assert error(convert, [fn("a")], items, max_tools=2).param == "input[1].tools"
    assert len(convert([fn("a")], items, max_tools=3)) == 3


def test_too_many_bytes_is_400() -> None:
    big = fn("a", description="x" * 3 * 1024 * 1024)
    assert "too large" in error(convert, [big]).message
    items = [{"type": "additional_tools", "tools": [fn("b", description="y" * 600)]}]
    assert (
        error(convert, [fn("a", description="x" * 600)], items, max_tool_bytes=1000).param
        == "input[0].tools"
    )


def test_budget_tolerates_big_integers() -> None:
    tools = [fn("a", parameters={"type": "integer", "maximum": 2**80})]
    assert len(convert(tools)) == 1
    assert error(convert, tools, max_tool_bytes=10).param == "tools"


# -- config, snapshot, small API -----------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [{"style": "camel"}, {"max_name_length": 8}, {"max_tools": -1}, {"max_tool_bytes": -5}],
)
def test_bad_config_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        NamingConfig(**kwargs)


def test_decode_of_unknown_names_never_splits() -> None:
    names = convert([ns("mcp__docs", fn("search"))])
    assert names.decode("mcp__x__search") == ToolIdentity(None, "mcp__x__search", "function")
    assert names.decode("") == ToolIdentity(None, "")
    assert names.decode("mcp__x__search").namespace is None
    assert names.decode("mcp__docs__search").namespace is not None


def test_public_names_import_from_tools() -> None:
    from streamer.core import tools

    assert NamingConfig() == tools.DEFAULT_CONFIG
    assert tools.DEFAULT_NAMESPACE == "functions"
    for name in tools.__all__:
        assert getattr(tools, name) is not None


@pytest.mark.parametrize("module", ["tool_decls", "tool_choice"])
def test_helper_modules_do_not_import_the_naming_core(module: str) -> None:
    """No import cycle: the helpers work over plain data and never import streamer.core.tools."""
    source = Path(__file__).resolve().parents[1] / "streamer" / "core" / f"{module}.py"
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert imported and not {m for m in imported if m.startswith("streamer.core.tools")}


def test_identities_and_len() -> None:
    names = convert([fn("a"), ns("n", fn("b")), {"type": "web_search"}])
    assert [t.identity for t in names.tools] == [ToolIdentity(None, "a"), ToolIdentity("n", "b")]
    assert len(names) == 2
    assert len(convert(None)) == 0
    assert "2 tools" in repr(names)

"""argcheck (the sandbox's own small checker) and jsonschema agree on every tool's arguments, valid and broken.

For every tool the agent is offered, the arguments are built from its schema: a valid call, then each place
broken one way at a time (every JSON type, the booleans that are not numbers, integral floats, enum values and
strangers, each bound and one past it, string lengths and pattern breakers, too few and too many items, a
missing required key, an unknown key), recursing into nested objects and arrays. Both checkers judge each call;
they must accept and refuse exactly the same ones. A random search (hypothesis) looks for what the list missed.
The runner's AgentInput, the other schema argcheck checks, is compared the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from agent_support import Farm
from farmagent import argcheck, contract
from farmagent.errors import InvalidRequestError
from farmagent.tools import TOOLS, TOOLS_BY_NAME, call_tool
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

# One value of every JSON type, with the numbers JSON Schema and Python tell apart (true is not 1, 3.0 is 3).
SAMPLES: list[Any] = [None, True, False, 0, 1, -1, 3.0, -2.0, 2.5, 1e20, "", "x", [], ["x"], {}, {"k": 1}]
# Strings tried in turn for a valid value of a patterned string: one of them fits each pattern the tools use.
CANDIDATES = ("farm", "telegram:1", "sensor.x", "en", "data:image/jpeg;base64,/9j/")
# Breakers of a valid string `v`: anchors, whitespace, case, separators, path tricks.
BREAKERS = ("", " ", "{v}\n", "\n{v}", "{v} ", " {v}", "{v};x", "{v}/x", "../{v}", "{V}", "é{v}", "{v}\x00")
UNKNOWN_KEY = "zz_unknown"
# What argcheck checks: every tool's parameters, and the AgentInput a run reads.
SCHEMAS: dict[str, dict[str, Any]] = {tool.name: tool.parameters for tool in TOOLS} | {"AgentInput": contract.SCHEMA}


def jsonschema_accepts(schema: Mapping[str, Any], value: Any) -> bool:
    return bool(Draft202012Validator(schema).is_valid(value))


def argcheck_accepts(schema: Mapping[str, Any], value: Any) -> bool:
    return not argcheck.checked(schema, value, "arguments")[1]


def _kinds(schema: Mapping[str, Any]) -> list[str]:
    kinds = schema.get("type", [])
    return [kinds] if isinstance(kinds, str) else list(kinds)


def _pad(text: str, length: int) -> str:
    return (text + text[-1:] * length)[:length] if text else "a" * length


def valid(schema: Mapping[str, Any], *, full: bool = False) -> Any:
    """A value `schema` accepts (with every optional property when `full`); fails the test when none is found."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return valid(schema["anyOf"][0], full=full)
    kind = (_kinds(schema) or ["object"])[0]
    if kind == "object":
        names = schema.get("properties", {}) if full else schema.get("required", [])
        return {name: valid(schema["properties"][name], full=full) for name in names}
    if kind == "array":
        items = schema.get("items", {})
        return [valid(items, full=full)] * max(schema.get("minItems", 0), 1 if full else 0)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1)
        return int(low) if kind == "integer" else float(low)
    if kind == "string":
        low = schema.get("minLength", 0)
        for text in (_pad(c, max(low, len(c))) for c in CANDIDATES):
            if jsonschema_accepts(schema, text):
                return text
        raise AssertionError(f"no candidate string fits {schema}: add one to CANDIDATES")
    return {"boolean": True, "null": None}[kind]


def variants(schema: Mapping[str, Any]) -> Iterator[Any]:
    """Values for a place of `schema`: valid ones, and each way of breaking it, nested places included."""
    yield from SAMPLES
    yield valid(schema)
    yield valid(schema, full=True)
    for option in [*schema.get("enum", []), *([schema["const"]] if "const" in schema else [])]:
        yield option
        yield [option]
        yield str(option) + "-not-an-option"
    for branch in schema.get("anyOf", []):
        yield from variants(branch)
    yield from _number_variants(schema)
    yield from _string_variants(schema)
    yield from _array_variants(schema)
    yield from _object_variants(schema)


def _number_variants(schema: Mapping[str, Any]) -> Iterator[Any]:
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in schema:
            bound = schema[key]
            yield from (bound - 1, bound, bound + 1, bound - 0.5, bound + 0.5, float(bound), float(bound + 1))


def _string_variants(schema: Mapping[str, Any]) -> Iterator[Any]:
    if "string" not in _kinds(schema) or "anyOf" in schema:
        return
    text = valid({**schema, "type": "string"})
    for key in ("minLength", "maxLength"):
        if key in schema:
            yield from (_pad(text, max(0, schema[key] + step)) for step in (-1, 0, 1))
    for breaker in BREAKERS:
        yield breaker.format(v=text, V=text.upper())


def _array_variants(schema: Mapping[str, Any]) -> Iterator[Any]:
    if "array" not in _kinds(schema):
        return
    items = schema.get("items", {})
    item = valid(items, full=True)
    for key in ("minItems", "maxItems"):
        if key in schema:
            yield from ([item] * max(0, schema[key] + step) for step in (-1, 0, 1))
    for broken in variants(items):
        yield [broken]
        yield [item, broken]


def _object_variants(schema: Mapping[str, Any]) -> Iterator[Any]:
    if "object" not in _kinds(schema):
        return
    properties: Mapping[str, Any] = schema.get("properties", {})
    base = valid(schema, full=True)
    for name in schema.get("required", []):
        yield {key: value for key, value in base.items() if key != name}
    extra = schema.get("additionalProperties", True)
    for value in [1, "x", None] if not isinstance(extra, dict) else list(variants(extra)):
        yield {**base, UNKNOWN_KEY: value}
    for name, sub in properties.items():
        for value in variants(sub):
            yield {**base, name: value}


def _disagreements(name: str, calls: list[Any]) -> list[str]:
    found = []
    for value in calls:
        by_jsonschema = jsonschema_accepts(SCHEMAS[name], value)
        if argcheck_accepts(SCHEMAS[name], value) != by_jsonschema:
            verdict = "accepts" if by_jsonschema else "refuses"
            found.append(f"{name}: jsonschema {verdict} {value!r:.200}")
    return found


@pytest.mark.parametrize("name", SCHEMAS)
def test_argcheck_and_jsonschema_agree_on_every_variant(name: str) -> None:
    Draft202012Validator.check_schema(SCHEMAS[name])
    calls = list(variants(SCHEMAS[name]))
    verdicts = [jsonschema_accepts(SCHEMAS[name], value) for value in calls]
    assert True in verdicts and False in verdicts  # the list has both kinds, for every schema
    assert _disagreements(name, calls) == []


def _json() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False) | st.text()
    return st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3)
    )


@pytest.mark.parametrize("name", SCHEMAS)
def test_argcheck_and_jsonschema_agree_on_random_arguments(name: str) -> None:
    properties = SCHEMAS[name]["properties"]
    keys = [*properties, UNKNOWN_KEY]
    known = st.sampled_from([value for key in properties for value in variants(properties[key])])
    values = known | _json() if properties else _json()

    @settings(max_examples=150, deadline=None, derandomize=True)
    @given(st.dictionaries(st.sampled_from(keys), values, max_size=len(keys)))
    def agree(arguments: dict[str, Any]) -> None:
        assert _disagreements(name, [arguments]) == []

    agree()


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("memory_search", {"query": "tomatoes", "topK": 8.0}),
        ("memory_get", {"path": "MEMORY.md", "from": 1.0, "lines": 2000.0}),
        ("schedule_task", {"prompt": "p", "schedule_type": "interval", "schedule_value": 900000.0, "taskId": "i35"}),
    ],
)
def test_an_integral_float_is_an_integer_on_both_sides(farm: Farm, name: str, arguments: dict[str, Any]) -> None:
    """JSON Schema's 8.0 is the integer 8: the sandbox accepts it and hands the host 8, which it accepts too."""
    schema = TOOLS_BY_NAME[name].parameters
    assert jsonschema_accepts(schema, arguments)
    checked = argcheck.check(schema, arguments)
    assert checked == arguments
    floats = [key for key, value in arguments.items() if isinstance(value, float)]
    assert {type(checked[key]) for key in floats} == {int}
    outcome = call_tool(farm.context(), name, arguments)
    assert not outcome.is_error, outcome.text  # the host took the request as the int
    if name == "schedule_task":
        assert not call_tool(farm.context(), "cancel_task", {"taskId": "i35"}).is_error
    with pytest.raises(InvalidRequestError, match=rf"arguments\.{floats[0]} must be .*\(got 8\.5\)"):
        argcheck.check(schema, {**arguments, floats[0]: 8.5})  # a fraction is no integer

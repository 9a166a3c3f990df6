"""A pydantic error as the agent sees it: where, in its own field names, and what the field takes.

pydantic's `loc` mixes the agent's field names with its own names for a field's validators and union branches
(`function-after[_no_nul(), constrained-str]`, `int`, `list[str]`); a sentence an agent can act on names only
the fields, and for a field that takes several types, all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from pydantic_core import ErrorDetails

# pydantic's names of a schema step: `function-after[...]`, `list[...]`, `tagged-union[...]`, `constrained-str`.
_SCHEMA_STEP: Final = re.compile(r"[a-z]+(-[a-z]+)*\[.*\]|constrained-[a-z]+", re.DOTALL)
# The plain types pydantic names a union branch by.
_TYPE_NAMES: Final = frozenset(
    {"str", "int", "float", "bool", "bytes", "none", "decimal", "datetime", "date", "time", "timedelta", "any"}
)
# Errors whose last `loc` part is a key the agent wrote (or one it left out), never one of pydantic's names.
_NAMES_A_KEY: Final = frozenset({"extra_forbidden", "missing"})
_SHOULD_BE: Final = "Input should be "


def field_path(error: ErrorDetails, *, skip: int = 0) -> str:
    """The error's place as the agent's dotted field names (list indexes kept), after the first `skip` parts."""
    loc = list(error["loc"][skip:])
    last = [loc.pop()] if loc and error["type"] in _NAMES_A_KEY else []
    return ".".join(str(part) for part in [*(p for p in loc if not _is_schema_step(p)), *last])


def expectation(errors: Sequence[ErrorDetails], *, skip: int = 0) -> str:
    """What the first error's field takes, as pydantic says it, over all the branches of that field.

    A value of one of the field's types that breaks that type's rule gets that rule ("String should have at least
    1 character"); a value of none of its types gets every type: `1.5` where a string, an integer or an object is
    taken is "Input should be a valid string, a valid integer or an object", not only the first branch's.
    """
    where = field_path(errors[0], skip=skip)
    same = [
        error
        for error in errors
        if error is errors[0] or (error["type"] not in _NAMES_A_KEY and field_path(error, skip=skip) == where)
    ]
    broken_rule = [error for error in same if not error["type"].endswith("_type")]  # `string_type`, `int_type`, ...
    if broken_rule:
        return broken_rule[0]["msg"]
    messages = list(dict.fromkeys(error["msg"] for error in same))
    if len(messages) == 1 or not all(message.startswith(_SHOULD_BE) for message in messages):
        return messages[0]
    wanted = [message.removeprefix(_SHOULD_BE) for message in messages]
    return f"{_SHOULD_BE}{', '.join(wanted[:-1])} or {wanted[-1]}"


def _is_schema_step(part: int | str) -> bool:
    return isinstance(part, str) and (part in _TYPE_NAMES or _SCHEMA_STEP.fullmatch(part) is not None)

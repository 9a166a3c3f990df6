"""The params of every farm and memory action: one pydantic model each, the one definition of the contract's params.

Each action's row (farmhost/protocol/catalog.py) names its model; the host validates with it, it is exported as
JSON Schema (`farmhost schema`), and the sandbox's tool definitions are generated from that export. A bound, an
enum, a default or a description of an action's params exists here and nowhere else. A `null` value means "the
default" for every param, as models often send it for an argument they mean to leave out.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

from farmhost.errors import InvalidRequest
from farmhost.protocol.codes import DASHBOARD_RE, ENTITY_ID_RE, FOLDER_RE
from farmhost.protocol.field_errors import field_path

MAX_ENTITY_IDS: Final = 500
MAX_DOMAINS: Final = 100
DEFAULT_DASHBOARD: Final = "farm"
# A farm dashboard is a few kilobytes; 256 KiB is a hundred views, and keeps ruamel's parse well under a second.
MAX_DASHBOARD_BYTES: Final = 256 * 1024
MAX_OPERATIONS: Final = 100
VIEW_PATH_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
NAME_RE: Final = re.compile(r"^[a-z0-9_]+$")  # a Home Assistant domain or service
TARGET_ID_RE: Final = re.compile(r"^[A-Za-z0-9_.-]{1,255}$")
WIDTH_RANGE: Final = (320, 3840)
HEIGHT_RANGE: Final = (240, 2160)
ZOOM_RANGE: Final = (0.5, 3.0)
MAX_WAIT_MS: Final = 15_000
MAX_SELECTOR_CHARS: Final = 200
# CSS only: names, classes, ids, attributes, pseudo-classes, combinators. No backslash escapes, slashes, `@`, `{}`,
# `;` or `>>` (Playwright's selector chaining), so the string cannot reach another selector engine.
SELECTOR_RE: Final = re.compile(r"^[A-Za-z0-9 _.#:,>+~*\[\]=\"'()-]+$")
SOURCES: Final = ("memory", "sessions", "all")
DEFAULT_TOP_K: Final = 8
MAX_TOP_K: Final = 64
MAX_QUERY_CHARS: Final = 1000
DEFAULT_LINES: Final = 200
MAX_LINES: Final = 2000
# A spoken or typed command; Assist's sentence templates match a few words, and a chat message is cut to this.
MAX_ASSIST_CHARS: Final = 1000
# History is asked for a few entities at a time; 20 keeps HA's answer for a month of a busy sensor within reason.
MAX_HISTORY_ENTITIES: Final = 20
# An ISO 8601 time as an agent writes it: "2026-12-04T06:00:00+01:00", "2026-12-04 06:00" (farm time), "...Z".
MAX_TIME_CHARS: Final = 40
# A BCP 47 tag as Home Assistant takes it: "en", "nl", "pt-BR", "zh-Hant".
LANGUAGE_RE: Final = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8}){0,2}$")

# What a name of each pattern looks like, for the error that refuses one (pydantic would print the regex).
assert VIEW_PATH_RE.pattern == FOLDER_RE.pattern, "give FOLDER_RE its own hint"
_PATTERN_HINTS: Final = {
    ENTITY_ID_RE.pattern: "an entity id: lower-case letters, digits and '_' around one '.', as in switch.pump_1",
    NAME_RE.pattern: "a Home Assistant name: lower-case letters, digits and '_', as in switch or turn_on",
    TARGET_ID_RE.pattern: "an id of 1-255 letters, digits, '_', '.' or '-'",
    DASHBOARD_RE.pattern: "a dashboard name: 1-64 lower-case letters, digits, '_' or '-' (such as 'farm', never a path)",
    # One hint for both: a view path and a group folder have the same pattern (one key of this table).
    VIEW_PATH_RE.pattern: "a name of 1-64 letters, digits, '_' or '-' (a view path or a group folder, never a path or URL)",
    LANGUAGE_RE.pattern: "a language tag such as en, nl or pt-BR",
    SELECTOR_RE.pattern: "a CSS selector of letters, digits, spaces and _ . # : , > + ~ * [ ] = \" ' ( ) -",
}

EntityId = Annotated[str, StringConstraints(pattern=ENTITY_ID_RE.pattern, max_length=255)]
HaName = Annotated[str, StringConstraints(pattern=NAME_RE.pattern, min_length=1, max_length=64)]
TargetId = Annotated[str, StringConstraints(pattern=TARGET_ID_RE.pattern)]
DashboardName = Annotated[
    str,
    StringConstraints(pattern=DASHBOARD_RE.pattern),
    Field(description=f"dashboard name (default '{DEFAULT_DASHBOARD}')"),
]
ViewPath = Annotated[str, StringConstraints(pattern=VIEW_PATH_RE.pattern)]
GroupFolder = Annotated[
    str,
    StringConstraints(pattern=FOLDER_RE.pattern),
    Field(description="another group's folder (main only), or 'global'; default this group"),
]


class ActionParams(BaseModel):
    """Base of every action's params: unknown keys are refused, types are not coerced, null means the default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


# farm actions ------------------------------------------------------------------------------------


class HaGetStatusParams(ActionParams):
    """Current Home Assistant states, filtered by entity id or domain (neither given: all)."""

    entityIds: (
        Annotated[list[EntityId], Field(max_length=MAX_ENTITY_IDS, description="e.g. ['sensor.soil_moisture']")] | None
    ) = None
    domains: Annotated[list[HaName], Field(max_length=MAX_DOMAINS, description="e.g. ['switch', 'sensor']")] | None = (
        None
    )


class HaCallServiceParams(ActionParams):
    """One Home Assistant service call."""

    domain: Annotated[HaName, Field(description="e.g. switch")]
    service: Annotated[HaName, Field(description="e.g. turn_on")]
    data: Annotated[dict[str, Any], Field(description="service data, e.g. {'brightness': 120}")] | None = None
    target: (
        Annotated[
            dict[str, TargetId | list[TargetId]],
            Field(description="entity_id, device_id, area_id, floor_id or label_id, e.g. {'entity_id': 'switch.pump'}"),
        ]
        | None
    ) = None


class HaSetEntityParams(ActionParams):
    """One entity set to a value its domain understands."""

    entityId: Annotated[EntityId, Field(description="e.g. input_number.target")]
    # Each domain checks the value itself, with a sentence naming what that entity takes (its range, its options).
    value: Annotated[
        Any,
        Field(
            description="a number, on/off (true/false), or one of its options",
            json_schema_extra={"type": ["number", "string", "boolean"]},
        ),
    ]


class NoParams(ActionParams):
    """An action that takes no params."""


class HaDashboardGetParams(ActionParams):
    """The staged dashboard, or one of its views."""

    dashboard: DashboardName = DEFAULT_DASHBOARD
    viewPath: Annotated[ViewPath, Field(description="one view's path")] | None = None


class HaDashboardValidateParams(ActionParams):
    """A staged dashboard, or YAML given as text, checked."""

    dashboard: DashboardName | None = None
    content: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=MAX_DASHBOARD_BYTES),
            Field(description="YAML to check instead of a staged dashboard (not with dashboard)"),
        ]
        | None
    ) = None
    checkEntities: Annotated[bool, Field(description="also look up the entity ids in Home Assistant")] = False

    @model_validator(mode="after")
    def _one_source(self) -> HaDashboardValidateParams:
        if self.dashboard is not None and self.content is not None:
            raise ValueError("give either dashboard (a staged dashboard) or content (YAML text), not both")
        return self


class HaDashboardPatchParams(ActionParams):
    """Patch operations applied to the staged dashboard, all or nothing."""

    operations: Annotated[
        list[dict[str, Any]],
        Field(
            min_length=1,
            max_length=MAX_OPERATIONS,
            description="objects with 'op' (add_view, update_view, remove_view, move_view, add_card, update_card, "
            "remove_card, move_card, set_theme) and its fields (docs/dashboards.md)",
        ),
    ]
    dashboard: DashboardName = DEFAULT_DASHBOARD
    dryRun: Annotated[bool, Field(description="show the diff, write nothing")] = False


class HaApplyDashboardParams(ActionParams):
    """The staged dashboard pushed to Home Assistant."""

    dashboard: DashboardName = DEFAULT_DASHBOARD
    backup: Annotated[bool, Field(description="back up Home Assistant's copy first")] = True


class HaCaptureScreenshotParams(ActionParams):
    """A PNG of a dashboard view, written into the group's workspace."""

    dashboard: DashboardName = DEFAULT_DASHBOARD
    view: Annotated[ViewPath, Field(description="view path (default: the first view)")] | None = None
    width: Annotated[int, Field(ge=WIDTH_RANGE[0], le=WIDTH_RANGE[1], description="pixels")] = 1280
    height: Annotated[int, Field(ge=HEIGHT_RANGE[0], le=HEIGHT_RANGE[1], description="pixels")] = 800
    zoom: Annotated[float, Field(ge=ZOOM_RANGE[0], le=ZOOM_RANGE[1], description="page zoom")] = 1.0
    waitMs: Annotated[int, Field(ge=0, le=MAX_WAIT_MS, description="extra wait before the capture, ms")] = 0
    selector: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=MAX_SELECTOR_CHARS, pattern=SELECTOR_RE.pattern),
            Field(description="CSS selector of the element to capture, e.g. 'hui-entities-card'"),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _plain_css(self) -> HaCaptureScreenshotParams:
        if self.selector is not None and (">>" in self.selector or not self.selector.strip()):
            raise ValueError("selector must be plain CSS such as '#main .card' ('>>' chaining is not allowed)")
        return self


class HaAssistParams(ActionParams):
    """A sentence for Home Assistant's own conversation agent (Assist), which answers and acts on exposed entities."""

    text: Annotated[
        str,
        StringConstraints(min_length=1, max_length=MAX_ASSIST_CHARS),
        Field(description="what the farmer says, e.g. 'turn on the irrigation pump' or 'is the barn light on'"),
    ]
    language: (
        Annotated[
            str,
            StringConstraints(pattern=LANGUAGE_RE.pattern),
            Field(description="language tag, e.g. 'en' (default: Home Assistant's own language)"),
        ]
        | None
    ) = None

    @model_validator(mode="after")
    def _said_something(self) -> HaAssistParams:
        if not self.text.strip():
            raise ValueError("text must contain words for Assist to understand")
        return self


class HaHistoryParams(ActionParams):
    """What entities did over a period, from Home Assistant's recorder (at most 31 days; default the last 24 h)."""

    entityIds: Annotated[
        list[EntityId],
        Field(min_length=1, max_length=MAX_HISTORY_ENTITIES, description="e.g. ['switch.irrigation_pump']"),
    ]
    start: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=MAX_TIME_CHARS),
            Field(description="ISO 8601 time, e.g. '2026-12-04T18:00'; without an offset: farm time (default end-24h)"),
        ]
        | None
    ) = None
    end: (
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=MAX_TIME_CHARS),
            Field(description="ISO 8601 time; without an offset: farm time (default now)"),
        ]
        | None
    ) = None


# memory actions ----------------------------------------------------------------------------------


class MemorySearchParams(ActionParams):
    """A BM25 search over memory files and chat history."""

    query: Annotated[
        str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS), Field(description="words to look for")
    ]
    topK: Annotated[int, Field(ge=1, le=MAX_TOP_K, description="hits to return")] = DEFAULT_TOP_K
    sources: Annotated[
        Literal["memory", "sessions", "all"], Field(description="memory files, chat history, or both")
    ] = "all"
    groupFolder: GroupFolder | None = None

    @model_validator(mode="after")
    def _not_blank(self) -> MemorySearchParams:
        if not self.query.strip():
            raise ValueError("query must contain a word to look for")
        return self


class MemoryGetParams(ActionParams):
    """A window of lines of one memory file."""

    path: Annotated[
        str, StringConstraints(min_length=1, max_length=1024), Field(description="MEMORY.md or memory/<name>.md")
    ]
    groupFolder: GroupFolder | None = None
    from_: Annotated[int, Field(alias="from", ge=1, le=10_000_000, description="first line, 1-based")] = 1
    lines: Annotated[int, Field(ge=1, le=MAX_LINES, description="how many lines")] = DEFAULT_LINES


P = TypeVar("P", bound=ActionParams)


def parse_params(model: type[P], params: dict[str, Any], action: str) -> P:
    """Validate an action's params with its model.

    Raises:
        InvalidRequest: one sentence naming the action, the param and what it must be.
    """
    try:
        return model.model_validate(params)
    except ValidationError as err:
        raise InvalidRequest(_sentence(err, model, action)) from None


def _sentence(err: ValidationError, model: type[ActionParams], action: str) -> str:
    first = err.errors(include_url=False)[0]
    kind, ctx = first["type"], first.get("ctx", {})
    where = field_path(first)
    takes = ", ".join(field.alias or name for name, field in model.model_fields.items()) or "no params"
    if kind == "extra_forbidden":
        return f"{action}: unknown param {where!r} ({action} takes {takes})"
    if kind == "missing":
        return f"{action}: missing param {where!r} ({action} takes {takes})"
    got = f" (got {repr(first.get('input'))[:60]})" if kind not in ("value_error", "model_type") else ""
    if kind == "string_pattern_mismatch":
        message = f"must be {_PATTERN_HINTS.get(str(ctx.get('pattern')), 'a valid name')}"
    elif kind in ("greater_than_equal", "less_than_equal") or kind.endswith(("too_long", "too_short")):
        message = _bound(kind, ctx)
    elif kind == "value_error":
        message = str(ctx.get("error", first["msg"]))
    elif kind in _TYPE_WORDS:
        message = f"must be {_TYPE_WORDS[kind]}"
    else:
        message = str(first["msg"]).replace("Input should be", "must be")
    return f"{action}: param {where!r} {message}{got}" if where else f"{action}: {message}{got}"


_TYPE_WORDS: Final = {
    "string_type": "text",
    "int_type": "a whole number",
    "float_type": "a number",
    "bool_type": "true or false",
    "list_type": "a list",
    "dict_type": "an object",
}


def _bound(kind: str, ctx: dict[str, Any]) -> str:
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    unit = "characters" if kind.startswith("string") else "items"
    if kind.endswith("too_short"):
        if ctx.get("min_length") == 1:
            return "must be non-empty text" if unit == "characters" else "must be a non-empty list"
        return f"must have at least {ctx.get('min_length')} {unit}"
    return f"must have at most {ctx.get('max_length')} {unit}"

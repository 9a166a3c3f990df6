"""Lovelace dashboards as staged YAML: names, round-trip load/dump, structural validation and entity references.

Pure: YAML text in, YAML text out, no files and no network. The patch operations live in
`farmhost.farm.dashboards.patch`; the actions that read and write the staged copies in `dashboard_actions`.
"""

from __future__ import annotations

import io
import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Final

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq, TaggedScalar
from ruamel.yaml.error import MarkedYAMLError, YAMLError

from farmhost.errors import InvalidRequest
from farmhost.protocol.codes import DASHBOARD_RE, ENTITY_ID_RE
from farmhost.protocol.params import MAX_DASHBOARD_BYTES, VIEW_PATH_RE

# HA requires a hyphen in a dashboard's url path. A fixed prefix is injective (no two names give one path),
# always has a hyphen, and cannot collide with HA's built-in panels (config, map, developer-tools, ...).
URL_PATH_PREFIX: Final = "farmhost-"
# Anchors and aliases are kept as references by the round-trip loader; expanding them for HA must stay bounded.
MAX_NODES: Final = 50_000
MAX_DEPTH: Final = 32
CARD_ID_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
# Keys whose values name entities anywhere in a dashboard (cards, rows, badges, conditions, action targets).
_ENTITY_KEYS: Final = frozenset({"entity", "entity_id", "entities", "badges"})


def check_name(value: object) -> str:
    """Return `value` if it is a valid dashboard name, else raise InvalidRequest.

    Raises:
        InvalidRequest: not a string matching `^[a-z0-9][a-z0-9_-]{0,63}$` (a name, never a path).
    """
    if isinstance(value, str) and DASHBOARD_RE.fullmatch(value):
        return value
    shown = repr(value)[:80]
    raise InvalidRequest(
        f"dashboard {shown} is not a valid name: use 1-64 lower-case letters, digits, '_' or '-', "
        "starting with a letter or digit (a name such as 'farm', never a path)"
    )


def url_path(name: str) -> str:
    """The url path of the storage-mode Lovelace dashboard in HA for the staged dashboard `name`."""
    return URL_PATH_PREFIX + check_name(name)


# ------------------------------------------------------------------------------------------------ YAML


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.indent(mapping=2, sequence=4, offset=2)  # the layout of HA's docs and of dashboards/*.yaml
    yaml.width = 4096  # never re-wrap long strings
    yaml.preserve_quotes = True
    return yaml


def load(text: str) -> Any:
    """Parse YAML text with comments, key order and quoting kept (ruamel round-trip).

    Raises:
        InvalidRequest: too large, or not YAML (the message has the line and column).
    """
    if len(text.encode()) > MAX_DASHBOARD_BYTES:
        raise InvalidRequest(f"the dashboard is larger than {MAX_DASHBOARD_BYTES // 1024} KiB")
    try:
        return _yaml().load(text)
    except MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = err.problem or err.context or "invalid YAML"
        raise InvalidRequest(f"YAML error at {where}{problem}".replace(": :", ":")) from None
    except (YAMLError, RecursionError, ValueError) as err:
        raise InvalidRequest(f"YAML error: {str(err)[:300] or type(err).__name__}") from None


def dump(doc: Any) -> str:
    """Serialise a document loaded by `load` (comments, order and quoting as they were)."""
    out = io.StringIO()
    _yaml().dump(doc, out)
    return out.getvalue()


def to_plain(node: Any) -> Any:
    """The JSON data HA stores for a loaded document (aliases expanded, within limits).

    Raises:
        InvalidRequest: YAML tags, non-string keys, non-finite numbers, too big or too deep.
    """
    budget = [MAX_NODES]
    return _plain(node, "", budget, 0)


def _plain(node: Any, where: str, budget: list[int], depth: int) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise InvalidRequest(f"the dashboard has more than {MAX_NODES} values (after expanding YAML aliases)")
    if depth > MAX_DEPTH:
        raise InvalidRequest(f"{where or 'the dashboard'} is nested more than {MAX_DEPTH} levels deep")
    tag = _tag(node)
    if tag:
        raise InvalidRequest(f"{where or 'the dashboard'}: YAML tag {tag} is not supported (HA stores plain JSON)")
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if not isinstance(key, str):
                raise InvalidRequest(f"{where or 'the dashboard'}: key {key!r} is not a string")
            out[key] = _plain(value, f"{where}.{key}" if where else key, budget, depth + 1)
        return out
    if isinstance(node, list):
        return [_plain(item, f"{where}[{i}]", budget, depth + 1) for i, item in enumerate(node)]
    return _plain_scalar(node, where)


def _plain_scalar(node: Any, where: str) -> Any:
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        if not math.isfinite(node):
            raise InvalidRequest(f"{where}: {node} is not a number HA can store")
        return float(node)
    if isinstance(node, str):
        return str(node)
    if isinstance(node, datetime | date):  # YAML timestamps: HA keeps them as the text that was written
        return node.isoformat()
    raise InvalidRequest(f"{where}: a {type(node).__name__} cannot be stored in a dashboard")


def _tag(node: Any) -> str | None:
    if isinstance(node, TaggedScalar):
        return str(node.tag.value)
    if isinstance(node, CommentedMap | CommentedSeq):
        value = node.tag.value
        return str(value) if value else None
    return None


def to_yaml_node(value: Any) -> Any:
    """JSON data (from a request) as round-trip nodes, so that it dumps in the document's block style."""
    if isinstance(value, dict):
        node = CommentedMap()
        for key, item in value.items():
            node[key] = to_yaml_node(item)
        return node
    if isinstance(value, list):
        return CommentedSeq(to_yaml_node(item) for item in value)
    return value


# ------------------------------------------------------------------------------------------------ validation


@dataclass
class Validation:
    """The outcome of a structural check: errors make a dashboard invalid, warnings do not."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        """No errors."""
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        """The JSON form used in action results."""
        return {"valid": self.valid, "errors": self.errors, "warnings": self.warnings}


def validate_text(text: str) -> tuple[Any, Validation]:
    """Parse and check YAML text; returns the plain data (None when it cannot be read) and the findings."""
    try:
        plain = to_plain(load(text))
    except InvalidRequest as err:
        return None, Validation(errors=[err.message])
    return plain, validate(plain)


def validate(config: Any) -> Validation:
    """Check the structure of a dashboard (plain data, see `to_plain`).

    The rules: a mapping with a non-empty `views` list; each view a mapping with `cards` and/or
    `sections[].cards`; URL-safe, unique view paths; every card a mapping with a `type`; card ids unique.
    """
    check = Validation()
    if not isinstance(config, dict):
        check.errors.append("the dashboard must be a mapping with a `views` list")
        return check
    if "title" in config and not isinstance(config["title"], str):
        check.errors.append("`title` must be text")
    views = config.get("views")
    if not isinstance(views, list):
        check.errors.append(
            "missing `views`: a dashboard is a mapping with a `views` list"
            if views is None
            else "`views` must be a list of views"
        )
        return check
    if not views:
        check.errors.append("`views` is empty: a dashboard needs at least one view")
    paths: dict[str, str] = {}
    ids: dict[str, str] = {}
    for index, view in enumerate(views):
        _check_view(view, index, paths, ids, check)
    return check


def view_label(index: int, view: Any) -> str:
    """How messages name a view: its index, and its path when it has one."""
    path = view.get("path") if isinstance(view, dict) else None
    return f"views[{index}] ({path!r})" if isinstance(path, str) else f"views[{index}]"


def _check_view(view: Any, index: int, paths: dict[str, str], ids: dict[str, str], check: Validation) -> None:
    label = view_label(index, view)
    if not isinstance(view, dict):
        check.errors.append(f"{label}: a view must be a mapping (title, path, cards)")
        return
    _check_view_path(view.get("path"), label, paths, check)
    for key in ("title", "theme", "icon"):
        if key in view and not isinstance(view[key], str):
            check.errors.append(f"{label}: `{key}` must be text")
    cards, sections = view.get("cards"), view.get("sections")
    if cards is None and sections is None:
        check.warnings.append(f"{label} has no cards")
    if cards is not None:
        _check_cards(cards, f"{label}.cards", ids, check, depth=0)
    if sections is not None:
        if not isinstance(sections, list):
            check.errors.append(f"{label}.sections must be a list of sections")
            return
        for number, section in enumerate(sections):
            where = f"{label}.sections[{number}]"
            if not isinstance(section, dict):
                check.errors.append(f"{where}: a section must be a mapping with `cards`")
            elif "cards" in section:
                _check_cards(section["cards"], f"{where}.cards", ids, check, depth=0)
    _check_entity_list(view.get("badges"), f"{label}.badges", check)


def _check_view_path(path: Any, label: str, paths: dict[str, str], check: Validation) -> None:
    if path is None:
        check.warnings.append(f"{label} has no `path`; patch operations and screenshots cannot address it")
    elif not isinstance(path, str) or not VIEW_PATH_RE.fullmatch(path):
        check.errors.append(f"{label}: path {path!r} is not URL-safe: use 1-64 letters, digits, '_' or '-'")
    else:
        _claim(path, label, paths, check, "path")


def _claim(key: str, owner: str, seen: dict[str, str], check: Validation, what: str) -> None:
    """Record that `owner` uses `key`, or report the clash with whoever used it first."""
    if key in seen:
        check.errors.append(f"{owner}: {what} {key!r} is already used by {seen[key]}")
    else:
        seen[key] = owner


def _check_cards(cards: Any, where: str, ids: dict[str, str], check: Validation, *, depth: int) -> None:
    if not isinstance(cards, list):
        check.errors.append(f"{where} must be a list of cards")
        return
    for number, card in enumerate(cards):
        _check_card(card, f"{where}[{number}]", ids, check, depth=depth)


def _check_card(card: Any, where: str, ids: dict[str, str], check: Validation, *, depth: int) -> None:
    if depth > 8:
        check.errors.append(f"{where}: cards are nested more than 8 levels deep")
        return
    if not isinstance(card, dict):
        check.errors.append(f"{where}: a card must be a mapping with a `type`")
        return
    kind = card.get("type")
    if not isinstance(kind, str) or not kind.strip():
        check.errors.append(f"{where}: a card needs a `type` (e.g. entities, gauge, tile, markdown)")
    if "id" in card:
        card_id = card["id"]
        if not isinstance(card_id, str) or not CARD_ID_RE.fullmatch(card_id):
            check.errors.append(f"{where}: card id {card_id!r} is not valid: use letters, digits, '_', '-', '.', ':'")
        else:
            _claim(card_id, where, ids, check, "card id")
    entity = card.get("entity")
    if entity is not None and not (isinstance(entity, str) and ENTITY_ID_RE.fullmatch(entity)):
        check.errors.append(f"{where}: `entity` {entity!r} is not an entity id (domain.object_id)")
    _check_entity_list(card.get("entities"), f"{where}.entities", check)
    if "cards" in card:  # stacks and grids
        _check_cards(card["cards"], f"{where}.cards", ids, check, depth=depth + 1)
    if "card" in card:  # conditional, entity-filter
        _check_card(card["card"], f"{where}.card", ids, check, depth=depth + 1)


def _check_entity_list(items: Any, where: str, check: Validation) -> None:
    if items is None:
        return
    if not isinstance(items, list):
        check.errors.append(f"{where} must be a list")
        return
    for number, item in enumerate(items):
        entity = item.get("entity") if isinstance(item, dict) else item
        if isinstance(item, dict) and entity is None:
            continue  # a row without an entity: section, divider, button, ...
        if not isinstance(entity, str) or not ENTITY_ID_RE.fullmatch(entity):
            check.errors.append(f"{where}[{number}]: {entity!r} is not an entity id (domain.object_id)")


def entity_ids(config: Any) -> list[str]:
    """Every entity id the dashboard (plain data) mentions: card entities, rows, badges, conditions, targets."""
    found: set[str] = set()
    _collect(config, found, key=None)
    return sorted(found)


def _collect(node: Any, found: set[str], *, key: str | None) -> None:
    if isinstance(node, dict):
        for sub_key, value in node.items():
            _collect(value, found, key=sub_key if sub_key in _ENTITY_KEYS else None)
    elif isinstance(node, list):
        for item in node:
            _collect(item, found, key=key)
    elif key is not None and isinstance(node, str):
        for part in node.split(","):  # entity_id: "light.a, light.b" is a form HA accepts
            if ENTITY_ID_RE.fullmatch(part.strip()):
                found.add(part.strip())


def summary(config: Any) -> list[dict[str, Any]]:
    """One line per view: path, title and how many cards it has (top level and in sections)."""
    views = config.get("views") if isinstance(config, dict) else None
    out = []
    for view in views if isinstance(views, list) else []:
        if isinstance(view, dict):
            out.append({"path": view.get("path"), "title": view.get("title"), "cards": count_cards(view)})
    return out


def count_cards(view: dict[str, Any]) -> int:
    """Cards at the top level of a view and in its sections (not inside stacks)."""
    total = len(view["cards"]) if isinstance(view.get("cards"), list) else 0
    sections = view.get("sections")
    for section in sections if isinstance(sections, list) else []:
        if isinstance(section, dict) and isinstance(section.get("cards"), list):
            total += len(section["cards"])
    return total

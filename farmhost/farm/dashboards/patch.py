"""Patch operations on a round-trip YAML dashboard: add/update/remove/move views and cards, set_theme.

Pure and all-or-nothing by construction: `apply_operations` changes the document it is given and raises on the
first bad operation; callers pass a freshly loaded document and write it only when everything succeeded.
Comments travel with what they describe (`dashboard_comments`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from ruamel.yaml.comments import CommentedMap, CommentedSeq

from farmhost.errors import InvalidRequest
from farmhost.farm.dashboards.comments import map_delete, map_set, seq_insert, seq_pop
from farmhost.farm.dashboards.lovelace import CARD_ID_RE, to_yaml_node
from farmhost.protocol.params import MAX_OPERATIONS, VIEW_PATH_RE

# Where the `- ` of an item starts once dumped with the layout of `dashboards._yaml` (mapping 2, sequence 4,
# offset 2): comment lines that move with an item are re-indented to match.
VIEW_COLUMN: Final = 2
VIEW_CARD_COLUMN: Final = 6
SECTION_CARD_COLUMN: Final = 10

# op name -> (required fields, optional fields)
OPERATIONS: Final[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
    "add_view": (frozenset({"view"}), frozenset({"index"})),
    "update_view": (frozenset({"path", "changes"}), frozenset()),
    "remove_view": (frozenset({"path"}), frozenset()),
    "move_view": (frozenset({"path", "index"}), frozenset()),
    "add_card": (frozenset({"viewPath", "card"}), frozenset({"index", "section"})),
    "update_card": (frozenset({"id", "changes"}), frozenset()),
    "remove_card": (frozenset({"id"}), frozenset()),
    "move_card": (frozenset({"id", "toViewPath"}), frozenset({"index", "section"})),
    "set_theme": (frozenset({"theme"}), frozenset({"viewPath"})),
}


class OperationError(InvalidRequest):
    """One operation of a patch cannot be applied; the message names it (`operations[2] (add_card): ...`)."""


def apply_operations(doc: Any, operations: Any) -> list[str]:
    """Apply `operations` in order to `doc` (a loaded dashboard); return one summary line per operation.

    Raises:
        InvalidRequest: `operations` is not a non-empty list of at most MAX_OPERATIONS.
        OperationError: the first operation that is malformed or does not fit the dashboard.
    """
    if not isinstance(operations, list) or not operations:
        raise InvalidRequest("`operations` must be a non-empty list of patch operations")
    if len(operations) > MAX_OPERATIONS:
        raise InvalidRequest(f"a patch has at most {MAX_OPERATIONS} operations (got {len(operations)})")
    if not isinstance(doc, CommentedMap) or not isinstance(doc.get("views"), CommentedSeq):
        raise InvalidRequest("the staged dashboard has no `views` list to patch; fix its structure first")
    changes = []
    for index, op in enumerate(operations):
        name = op.get("op") if isinstance(op, dict) else None
        label = f"operations[{index}]" + (f" ({name})" if isinstance(name, str) else "")
        try:
            changes.append(_apply_one(doc, op))
        except _Refused as err:
            raise OperationError(f"{label}: {err}") from None
    return changes


class _Refused(Exception):
    """Raised inside an operation; `apply_operations` prefixes the operation's index and name."""


def _apply_one(doc: CommentedMap, op: Any) -> str:
    if not isinstance(op, dict):
        raise _Refused('an operation is a mapping such as {"op": "add_card", "viewPath": "...", "card": {...}}')
    name = op.get("op")
    if not isinstance(name, str) or name not in OPERATIONS:
        raise _Refused(f"unknown op {name!r}; use one of {', '.join(OPERATIONS)}")
    required, optional = OPERATIONS[name]
    missing = sorted(required - op.keys())
    if missing:
        raise _Refused(f"missing {', '.join(f'`{m}`' for m in missing)}")
    unknown = sorted(op.keys() - required - optional - {"op"})
    if unknown:
        raise _Refused(f"unknown field {', '.join(f'`{u}`' for u in unknown)}")
    return _HANDLERS[name](_Dashboard(doc), op)


# ------------------------------------------------------------------------------------------------ finding


@dataclass
class _CardSlot:
    """Where a card sits: its list, its index there, and which view/section holds the list."""

    cards: CommentedSeq
    index: int
    view_path: str
    section: int | None
    owner: CommentedMap  # the view or section mapping whose `cards` key holds the list


class _Dashboard:
    """Lookups on the document that every operation needs."""

    def __init__(self, doc: CommentedMap) -> None:
        self.doc = doc
        self.views: CommentedSeq = doc["views"]

    def view(self, path: Any, field: str = "path") -> tuple[int, CommentedMap]:
        if not isinstance(path, str):
            raise _Refused(f"`{field}` must be a view path (text)")
        for index, view in enumerate(self.views):
            if isinstance(view, CommentedMap) and view.get("path") == path:
                return index, view
        known = [v.get("path") for v in self.views if isinstance(v, CommentedMap) and isinstance(v.get("path"), str)]
        raise _Refused(f"no view with path {path!r} (views: {', '.join(known) or 'none with a path'})")

    def card_lists(self, view: CommentedMap) -> list[tuple[CommentedSeq, int | None, CommentedMap]]:
        lists: list[tuple[CommentedSeq, int | None, CommentedMap]] = []
        if isinstance(view.get("cards"), CommentedSeq):
            lists.append((view["cards"], None, view))
        sections = view.get("sections")
        for number, section in enumerate(sections if isinstance(sections, CommentedSeq) else []):
            if isinstance(section, CommentedMap) and isinstance(section.get("cards"), CommentedSeq):
                lists.append((section["cards"], number, section))
        return lists

    def find_card(self, card_id: Any) -> _CardSlot | None:
        for view in self.views:
            if not isinstance(view, CommentedMap):
                continue
            for cards, section, owner in self.card_lists(view):
                for index, card in enumerate(cards):
                    if isinstance(card, CommentedMap) and card.get("id") == card_id:
                        return _CardSlot(cards, index, str(view.get("path")), section, owner)
        return None

    def card(self, card_id: Any) -> _CardSlot:
        if not isinstance(card_id, str) or not card_id:
            raise _Refused("`id` must be a card id (text)")
        slot = self.find_card(card_id)
        if slot is None:
            raise _Refused(f"no card with id {card_id!r} (cards are found by `id` in views' cards and sections)")
        return slot

    def target(self, view: CommentedMap, path: str, section: Any) -> CommentedMap:
        """The mapping whose `cards` a card goes into: the view, or `sections[section]`; `cards` made if missing."""
        if section is None:
            if "cards" not in view and isinstance(view.get("sections"), CommentedSeq):
                raise _Refused(f"view {path!r} arranges its cards in sections: give `section` (a section index)")
            return _with_cards(view, f"view {path!r}")
        sections = view.get("sections")
        count = len(sections) if isinstance(sections, CommentedSeq) else 0
        if not _is_int(section) or not 0 <= section < count:
            raise _Refused(
                f"view {path!r} has no section {section!r} (it has {count}: 0-{count - 1})"
                if count
                else f"view {path!r} has no sections"
            )
        owner = sections[section]
        if not isinstance(owner, CommentedMap):
            raise _Refused(f"section {section} of view {path!r} is not a mapping")
        return _with_cards(owner, f"section {section} of view {path!r}")


def _with_cards(owner: CommentedMap, what: str) -> CommentedMap:
    if owner.get("cards") is None:
        map_set(owner, "cards", CommentedSeq())
    if not isinstance(owner["cards"], CommentedSeq):
        raise _Refused(f"`cards` of {what} is not a list")
    return owner


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _index(op: dict[str, Any], size: int, *, default: int) -> int:
    """`index` of an insert into a list of `size` items: 0..size, default as given."""
    value = op.get("index", default)
    if not _is_int(value):
        raise _Refused(f"`index` must be an integer, not {value!r}")
    if not 0 <= value <= size:
        raise _Refused(f"index {value} is out of range (0-{size})")
    return int(value)


def _changes(op: dict[str, Any], protected: tuple[str, ...]) -> dict[str, Any]:
    changes = op["changes"]
    if not isinstance(changes, dict) or not changes:
        raise _Refused("`changes` must be a non-empty mapping of keys to new values (null removes a key)")
    for key in protected:
        if key in changes and changes[key] is None:
            raise _Refused(f"`changes` cannot remove `{key}`")
    return changes


def _apply_changes(target: CommentedMap, changes: dict[str, Any]) -> list[str]:
    for key, value in changes.items():
        if value is None:
            if key in target:
                map_delete(target, key)
        else:
            map_set(target, key, to_yaml_node(value))
    return sorted(changes)


def _new_card(card: Any) -> CommentedMap:
    if not isinstance(card, dict) or not isinstance(card.get("type"), str) or not card["type"].strip():
        raise _Refused('`card` must be a mapping with a `type`, e.g. {"type": "tile", "entity": "..."}')
    node = to_yaml_node(card)
    assert isinstance(node, CommentedMap)
    return node


def _check_new_id(dash: _Dashboard, card_id: Any) -> None:
    if not isinstance(card_id, str) or not CARD_ID_RE.fullmatch(card_id):
        raise _Refused(f"card id {card_id!r} is not valid: use letters, digits, '_', '-', '.', ':'")
    slot = dash.find_card(card_id)
    if slot is not None:
        raise _Refused(f"card id {card_id!r} is already used (in view {slot.view_path!r})")


def _check_new_path(dash: _Dashboard, path: Any) -> None:
    if not isinstance(path, str) or not VIEW_PATH_RE.fullmatch(path):
        raise _Refused(f"view path {path!r} is not valid: use 1-64 letters, digits, '_' or '-'")
    if any(isinstance(v, CommentedMap) and v.get("path") == path for v in dash.views):
        raise _Refused(f"a view with path {path!r} already exists")


def _card_name(card: CommentedMap) -> str:
    return repr(card["id"]) if isinstance(card.get("id"), str) else f"({card.get('type')})"


def _where(path: str, section: int | None) -> str:
    return f"view {path!r}" + (f" section {section}" if section is not None else "")


# ------------------------------------------------------------------------------------------------ operations


def _add_view(dash: _Dashboard, op: dict[str, Any]) -> str:
    view = op["view"]
    if not isinstance(view, dict):
        raise _Refused('`view` must be a mapping such as {"title": "Pumps", "path": "pumps", "cards": []}')
    if "path" not in view:
        raise _Refused("`view` needs a `path` (1-64 letters, digits, '_' or '-') so it can be addressed later")
    _check_new_path(dash, view["path"])
    index = _index(op, len(dash.views), default=len(dash.views))
    seq_insert(dash.doc, "views", index, to_yaml_node(view))
    return f"added view {view['path']!r} at index {index}"


def _update_view(dash: _Dashboard, op: dict[str, Any]) -> str:
    _, view = dash.view(op["path"])
    changes = _changes(op, ("path",))
    if "path" in changes and changes["path"] != op["path"]:
        _check_new_path(dash, changes["path"])
    keys = _apply_changes(view, changes)
    return f"updated view {op['path']!r}: {', '.join(keys)}"


def _remove_view(dash: _Dashboard, op: dict[str, Any]) -> str:
    index, _ = dash.view(op["path"])
    seq_pop(dash.doc, "views", index)
    return f"removed view {op['path']!r}"


def _move_view(dash: _Dashboard, op: dict[str, Any]) -> str:
    old, _ = dash.view(op["path"])
    last = len(dash.views) - 1
    new = op["index"]
    if not _is_int(new) or not 0 <= new <= last:
        raise _Refused(f"index {new!r} is out of range (0-{last})")
    view, before = seq_pop(dash.doc, "views", old)
    seq_insert(dash.doc, "views", new, view, before, VIEW_COLUMN)
    return f"moved view {op['path']!r} from index {old} to {new}"


def _add_card(dash: _Dashboard, op: dict[str, Any]) -> str:
    _, view = dash.view(op["viewPath"], "viewPath")
    card = _new_card(op["card"])
    if "id" in card:
        _check_new_id(dash, card["id"])
    owner = dash.target(view, op["viewPath"], op.get("section"))
    size = len(owner["cards"])
    index = _index(op, size, default=size)
    seq_insert(owner, "cards", index, card)
    return f"added card {_card_name(card)} to {_where(op['viewPath'], op.get('section'))} at index {index}"


def _update_card(dash: _Dashboard, op: dict[str, Any]) -> str:
    slot = dash.card(op["id"])
    changes = _changes(op, ("id", "type"))
    if "id" in changes and changes["id"] != op["id"]:
        _check_new_id(dash, changes["id"])
    if "type" in changes and (not isinstance(changes["type"], str) or not changes["type"].strip()):
        raise _Refused("`type` must be a card type such as entities, gauge, tile or markdown")
    keys = _apply_changes(slot.cards[slot.index], changes)
    return f"updated card {op['id']!r}: {', '.join(keys)}"


def _remove_card(dash: _Dashboard, op: dict[str, Any]) -> str:
    slot = dash.card(op["id"])
    seq_pop(slot.owner, "cards", slot.index)
    return f"removed card {op['id']!r} from {_where(slot.view_path, slot.section)}"


def _move_card(dash: _Dashboard, op: dict[str, Any]) -> str:
    slot = dash.card(op["id"])
    _, view = dash.view(op["toViewPath"], "toViewPath")
    owner = dash.target(view, op["toViewPath"], op.get("section"))
    size = len(owner["cards"]) - (1 if owner is slot.owner else 0)
    index = _index(op, size, default=size)
    card, before = seq_pop(slot.owner, "cards", slot.index)
    column = VIEW_CARD_COLUMN if op.get("section") is None else SECTION_CARD_COLUMN
    seq_insert(owner, "cards", index, card, before, column)
    return (
        f"moved card {op['id']!r} from {_where(slot.view_path, slot.section)} "
        f"to {_where(op['toViewPath'], op.get('section'))} at index {index}"
    )


def _set_theme(dash: _Dashboard, op: dict[str, Any]) -> str:
    theme = op["theme"]
    if theme is not None and (not isinstance(theme, str) or not theme.strip()):
        raise _Refused("`theme` must be a theme name, or null to go back to the default theme")
    if "viewPath" in op:
        views = [dash.view(op["viewPath"], "viewPath")[1]]
    else:
        views = [v for v in dash.views if isinstance(v, CommentedMap)]
    for view in views:
        _apply_changes(view, {"theme": theme})
    paths = ", ".join(repr(v.get("path")) for v in views)
    return f"{'set theme ' + repr(theme) if theme else 'removed the theme'} on view{'s' * (len(views) != 1)} {paths}"


_HANDLERS: Final[dict[str, Callable[[_Dashboard, dict[str, Any]], str]]] = {
    "add_view": _add_view,
    "update_view": _update_view,
    "remove_view": _remove_view,
    "move_view": _move_view,
    "add_card": _add_card,
    "update_card": _update_card,
    "remove_card": _remove_card,
    "move_card": _move_card,
    "set_theme": _set_theme,
}

"""Comment-preserving edits of ruamel round-trip YAML lists and mappings (the dashboard patch's plumbing).

ruamel stores the comment lines that follow an item (and so precede the next one) in the post-comment of the
item's deepest last value, and the lines before a list's first item on the key that holds the list. These
helpers move those lines so that after an insert, removal or move they still stand in front of what they
described: a moved item takes the lines above it along; the lines above its old neighbour stay put.
"""

from __future__ import annotations

from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import CommentMark
from ruamel.yaml.tokens import CommentToken


def _anchor(node: Any) -> tuple[Any, Any, int] | None:
    """(container, key, slot) of the comment after `node`'s deepest last value."""
    if isinstance(node, CommentedMap) and node:
        key = next(reversed(node))
        value = node[key]
        if isinstance(value, CommentedMap | CommentedSeq) and value:
            return _anchor(value)
        return node, key, 2
    if isinstance(node, CommentedSeq) and node:
        value = node[-1]
        if isinstance(value, CommentedMap | CommentedSeq) and value:
            return _anchor(value)
        return node, len(node) - 1, 0
    return None


def _take_trailing(node: Any) -> str:
    """Detach and return the whole comment lines after `node` (its end-of-line comment stays)."""
    anchor = _anchor(node)
    if anchor is None:
        return ""
    container, key, slot = anchor
    items = container.ca.items.get(key)
    token = items[slot] if items and len(items) > slot else None
    if token is None or not isinstance(token.value, str):
        return ""
    head, newline, block = token.value.partition("\n")
    if not newline or not block:
        return ""
    if head:
        token.value = head + "\n"
    else:
        items[slot] = None
    return block


def _give_trailing(node: Any, block: str) -> bool:
    """Append comment lines after `node`'s deepest last value; False when `node` is empty (nowhere to put them)."""
    if not block:
        return True
    anchor = _anchor(node)
    if anchor is None:
        return False
    container, key, slot = anchor
    items = container.ca.items.setdefault(key, [None, None, None, None])
    while len(items) <= slot:
        items.append(None)
    token = items[slot]
    if token is None:
        items[slot] = CommentToken("\n" + block, CommentMark(0))
    else:
        token.value = (token.value if token.value.endswith("\n") else token.value + "\n") + block
    return True


def _take_leading(owner: CommentedMap, key: str) -> str:
    """Detach and return the comment lines between `key:` and the first item of its list."""
    items = owner.ca.items.get(key)
    tokens = items[3] if items and len(items) > 3 else None
    if not tokens:
        return ""
    items[3] = None
    value = owner[key]
    if isinstance(value, CommentedSeq) and value.ca.comment:  # the same tokens, referenced from the list too
        value.ca.comment[1] = []
    return "".join(
        " " * token.start_mark.column + token.value if token.value.strip() else token.value for token in tokens
    )


def _give_leading(owner: CommentedMap, key: str, block: str) -> None:
    """Put comment lines right after `key:` (before the first item of its list)."""
    if not block:
        return
    items = owner.ca.items.setdefault(key, [None, None, None, None])
    while len(items) < 4:
        items.append(None)
    if items[3] is None:
        items[3] = []
    for line in block.removesuffix("\n").split("\n"):
        text = line.lstrip(" ")
        items[3].append(CommentToken(text + "\n", CommentMark(len(line) - len(text))))


def _take_before(owner: CommentedMap, key: str, index: int) -> str:
    """The comment lines just before position `index` of `owner[key]` (detached)."""
    return _take_trailing(owner[key][index - 1]) if index > 0 else _take_leading(owner, key)


def _give_before(owner: CommentedMap, key: str, index: int, block: str) -> None:
    if index > 0:
        _give_trailing(owner[key][index - 1], block)
    else:
        _give_leading(owner, key, block)


def seq_pop(owner: CommentedMap, key: str, index: int) -> tuple[Any, str]:
    """Remove `owner[key][index]`; return it with the comment lines that were just before it.

    The lines after it (those before the next item) stay where they were.
    """
    seq = owner[key]
    before = _take_before(owner, key, index)
    after = _take_trailing(seq[index])
    item = seq[index]
    del seq[index]  # CommentedSeq shifts its per-item comments on del (not on list.pop)
    _give_before(owner, key, index, after)
    return item, before


def seq_insert(owner: CommentedMap, key: str, index: int, item: Any, before: str = "", column: int = 0) -> None:
    """Insert `item` at `index` of `owner[key]`, with `before` (comment lines, re-indented to `column`) before it."""
    seq = owner[key]
    existing = _take_before(owner, key, index)  # the lines before the item that was at `index`
    seq.insert(index, item)
    _give_before(owner, key, index, _indent(before, column))
    if not _give_trailing(item, existing):  # an empty item cannot hold them: keep them in front of it
        _give_before(owner, key, index, existing)


def _indent(block: str, column: int) -> str:
    return "".join(" " * column + line.lstrip(" ") if line.strip() else line for line in block.splitlines(True))


def map_set(target: CommentedMap, key: Any, value: Any) -> None:
    """Set a key (new keys go last); comment lines after the mapping stay after it."""
    block = _take_trailing(target)
    target[key] = value
    _give_trailing(target, block)


def map_delete(target: CommentedMap, key: Any) -> None:
    """Delete a key; comment lines after the mapping stay after it (unless it is now empty)."""
    block = _take_trailing(target)
    del target[key]
    _give_trailing(target, block)  # an empty mapping has nowhere to hold them: they go with it

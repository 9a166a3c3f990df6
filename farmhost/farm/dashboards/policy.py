"""The dashboard content policy: what an agent-staged Lovelace dashboard may contain, and nothing that runs script.

One check used by `ha_dashboard_validate`, `ha_dashboard_patch` (dry runs too), `ha_apply_dashboard`, the
loading of staged copies and the screenshot action (on what HA currently holds). Pure: plain dashboard data
(`dashboards.to_plain`) and the farm profile's rules in, the findings out. The rules, in docs/dashboards.md:

- a card is one of Home Assistant's built-in card types; a `custom:` type anywhere (card, row, element, badge,
  feature, view) only when the farm profile lists it (`policy.dashboards.customCards`);
- every URL-bearing value is an `http(s)` URL or a path relative to HA, whatever its spelling (case,
  whitespace, control characters, HTML entities, percent-encoding); navigation paths stay inside HA;
- iframe/webpage cards only to origins the profile lists (`policy.dashboards.iframeOrigins`, none by default);
- no text anywhere carries a script scheme or script-bearing HTML (markdown content, titles, styles);
- a button that performs an action (any `*_action`, in any card, nested) passes the same service policy as
  `ha_call_service` (denied domains, the closed service surface, the profile's narrowing), because whoever taps
  it in HA calls that service with their own rights, and may not act on an entity a profile rule holds that call
  for (matched as the gate matches a call: by entity, or by a service of the same effect, farm/control/effects.py),
  nor on one seen driving a guarded entity (`ContentRules.drives`), nor on a device/area (or `all`) that may hold
  one; `fire-dom-event` and dashboard strategies (code that builds cards in the browser) are refused.
"""

from __future__ import annotations

import dataclasses
import html
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import unquote

from farmhost.errors import NotAllowed
from farmhost.farm.control import effects, reach
from farmhost.farm.control.policy import LoadedProfile, check_service, origin_of
from farmhost.farm.control.reach import OLD_GROUP_DOMAIN
from farmhost.farm.control.rules import ControlCall, entities_under, matching
from farmhost.farm.control.safe_state import domain_of, guarded_patterns

# Home Assistant's own card types (frontend 2025.4, create-card-element.ts): nothing here loads outside code.
BUILTIN_CARDS: Final = frozenset(
    {
        "alarm-panel", "area", "button", "calendar", "conditional", "entities", "entity", "entity-button",
        "entity-filter", "gauge", "glance", "grid", "heading", "history-graph", "horizontal-stack", "humidifier",
        "iframe", "light", "logbook", "map", "markdown", "media-control", "picture", "picture-elements",
        "picture-entity", "picture-glance", "plant-status", "sensor", "shopping-list", "statistic",
        "statistics-graph", "thermostat", "tile", "todo-list", "vertical-stack", "weather-forecast",
        "clock", "energy-carbon-consumed-gauge", "energy-compare", "energy-date-selection", "energy-devices-detail-graph",
        "energy-devices-graph", "energy-distribution", "energy-gas-graph", "energy-grid-neutrality-gauge",
        "energy-sankey", "energy-self-sufficiency-gauge", "energy-solar-consumed-gauge", "energy-solar-graph",
        "energy-sources-table", "energy-usage-graph", "energy-water-graph",
    }
)  # fmt: skip
# Cards that frame another page (the "webpage" card of HA's editor is type `iframe`): their `url` must be on an
# origin the farm profile lists.
FRAME_CARDS: Final = frozenset({"iframe"})
VIEW_TYPES: Final = frozenset({"masonry", "panel", "sidebar", "sections"})
SECTION_TYPES: Final = frozenset({"grid"})
# What a tap/hold/double-tap may do. `fire-dom-event` hands the click to custom code in the browser.
ACTIONS: Final = frozenset(
    {"more-info", "toggle", "navigate", "url", "perform-action", "call-service", "assist", "none"}
)
SERVICE_ACTIONS: Final = frozenset({"perform-action", "call-service"})
# Rows and picture elements that call a service by themselves (older spellings HA still renders).
LEGACY_SERVICE_TYPES: Final = frozenset({"call-service", "service-button", "perform-action"})
# Keys whose values the frontend uses as URLs (links, frames, images, backgrounds).
URL_KEYS: Final = frozenset(
    {"url", "url_path", "image", "dark_mode_image", "background", "href", "src", "stream_url", "camera_image_url"}
)
NAVIGATION_KEYS: Final = frozenset({"navigation_path"})
# Keys whose values map states to image URLs (picture-entity, picture-glance).
URL_MAP_KEYS: Final = frozenset({"state_image"})
SAFE_SCHEMES: Final = frozenset({"http", "https"})
# A text in a dashboard is shown, never run. Script schemes are looked for with blanks and controls removed;
# tags and event-handler attributes in the decoded text (tags found one at a time, so the scan stays linear).
_SCRIPT_SCHEME: Final = re.compile(r"(?:java|vb|live)script:")
_TAG: Final = re.compile(r"<\s*/?\s*([a-z][a-z0-9:-]*)([^<>]*)")
_SCRIPT_TAGS: Final = frozenset(
    {"script", "iframe", "frame", "frameset", "object", "embed", "applet", "base", "meta", "link", "form", "svg",
     "math", "style", "template", "portal"}
)  # fmt: skip
_HANDLER_ATTR: Final = re.compile(r"(?:^|[\s/\"'])on[a-z]+\s*=")
# Link and source targets inside markdown, HTML or CSS text.
_TEXT_TARGETS: Final = re.compile(
    r"\]\(\s*<?([^)\s>]+)|\b(?:href|src|srcset|action|formaction|xlink:href|data|poster)\s*=\s*[\"']?([^\"'\s>]+)"
    r"|\burl\(\s*[\"']?([^\"')\s]+)"
)
_SCHEME: Final = re.compile(r"^([a-z][a-z0-9+.\-]*):")
_CUSTOM: Final = "custom:"
_DECODE_ROUNDS: Final = 4
_NO_PROFILE: Final = LoadedProfile(path=Path("farm-profile.json"))


@dataclass(frozen=True, kw_only=True)
class ContentRules:
    """What the farm profile opens: iframe/webpage origins and `custom:` types (none by default).

    `profile` is the farm profile as loaded, for the service policy of action buttons (None: the defaults).
    """

    iframe_origins: frozenset[str] = frozenset()
    custom_cards: frozenset[str] = frozenset()
    profile: LoadedProfile | None = field(default=None, compare=False)
    # entity -> the entities it was seen driving (LiveView.drives): a button on a helper acts on what it drives
    drives: Mapping[str, frozenset[str]] = field(default_factory=dict, compare=False)
    # An entity's attributes as the live view last saw them (None: not following HA): a button on a group acts on
    # its members (farm/control/reach.py)
    attributes: Callable[[str], Mapping[str, Any] | None] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Violation:
    """One refused value: where it is (`views[1].cards[3].url`) and the rule it breaks."""

    where: str
    rule: str

    def __str__(self) -> str:
        return f"{self.where}: {self.rule}"


def rules_for(
    loaded: LoadedProfile,
    *,
    drives: Mapping[str, frozenset[str]] | None = None,
    attributes: Callable[[str], Mapping[str, Any] | None] | None = None,
) -> ContentRules:
    """The content rules of the farm profile as loaded (the defaults when there is none or it is broken).

    `drives` is which entity drives which (LiveView.drives), so a button on a helper behind a guarded entity is
    refused as one on the entity; `attributes` reads an entity's attributes from the live view, so a button on a
    group is refused as one on its members (without it a `group.*` target is judged as an area is).
    """
    profile = loaded.profile
    seen = drives or {}
    if profile is None:
        return ContentRules(profile=loaded, drives=seen, attributes=attributes)
    return ContentRules(
        iframe_origins=profile.iframe_origins,
        custom_cards=profile.custom_cards,
        profile=loaded,
        drives=seen,
        attributes=attributes,
    )


def violations(config: Any, rules: ContentRules) -> list[Violation]:
    """Every place in `config` (plain data) the policy refuses, in document order."""
    found: list[Violation] = []
    if not isinstance(config, dict):
        return found
    walker = _Walker(rules, found)
    walker.node(config, "", role="dashboard")
    return found


def enforce(config: Any, rules: ContentRules, *, what: str) -> None:
    """Refuse `config` when anything in it breaks the policy.

    Raises:
        NotAllowed: naming `what` (e.g. "dashboard 'farm'"), the first places and their rules.
    """
    found = violations(config, rules)
    if found:
        shown = "; ".join(str(v) for v in found[:5])
        more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
        raise NotAllowed(f"{what} breaks the dashboard content policy: {shown}{more}")


# ------------------------------------------------------------------------------------------------ spellings


def normalise(text: str) -> str:
    """`text` as a browser may read it as a URL: entities and percent-escapes decoded, blanks and controls gone.

    Decoding repeats (a few rounds) so that double encodings are seen through; the result is lower case.
    """
    value = _decoded(text)
    kept = (ch for ch in value if not (ch.isspace() or unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp", "Zs"}))
    return "".join(kept).lower()


def _decoded(text: str) -> str:
    """HTML entities and percent-escapes decoded until nothing changes (a few rounds), in NFKC form."""
    value = unicodedata.normalize("NFKC", text)
    for _ in range(_DECODE_ROUNDS):
        decoded = unicodedata.normalize("NFKC", unquote(html.unescape(value)))
        if decoded == value:
            break
        value = decoded
    return value


def url_problem(value: Any, *, frame_origins: frozenset[str] | None = None) -> str | None:
    """Why `value` is not an acceptable URL, or None.

    Args:
        value: the value of a URL-bearing key.
        frame_origins: for iframe/webpage cards, the origins allowed (the URL must be absolute and on one).
    """
    if not isinstance(value, str):
        return "a URL must be text"
    if any(unicodedata.category(ch) in {"Cc", "Cf"} for ch in value):
        return "control or invisible characters are not allowed in a URL"
    flat = normalise(value)
    if "\\" in flat:
        return "backslashes are not allowed in a URL (browsers read them as '/')"
    scheme = _SCHEME.match(flat)
    if scheme is not None and scheme[1] not in SAFE_SCHEMES:
        return f"the {scheme[1]!r} scheme is not allowed: only http(s) URLs or paths relative to Home Assistant"
    if flat.startswith("//"):
        return "a URL starting with '//' names another host: write it as https://host/..."
    if frame_origins is None:
        return None
    if scheme is None:
        return "an iframe/webpage card needs an absolute http(s) URL on an origin the farm profile lists"
    origin = origin_of(value.strip())
    if origin not in frame_origins:
        listed = ", ".join(sorted(frame_origins)) or "none"
        return (
            f"iframe/webpage cards may only show origins the farm profile lists in "
            f"policy.dashboards.iframeOrigins ({origin} is not; listed: {listed})"
        )
    return None


def _navigation_problem(value: Any) -> str | None:
    problem = url_problem(value)
    if problem is not None:
        return problem
    flat = normalise(value)
    if _SCHEME.match(flat) or flat.startswith("//"):
        return "a navigation path stays inside Home Assistant: give a path such as /farmhost-farm/fields"
    return None


def _text_problem(text: str) -> str | None:
    """Why a text shown on a dashboard could run script, or None."""
    if _SCRIPT_SCHEME.search(normalise(text)):
        return "text may not carry a script URL (javascript:, vbscript:); dashboards show text, never run it"
    decoded = _decoded(text).lower()
    for tag in _TAG.finditer(decoded):
        if tag[1] in _SCRIPT_TAGS:
            return f"text may not carry a <{tag[1]}> tag; dashboards show text, never run it"
        if _HANDLER_ATTR.search(tag[2]):
            return f"text may not carry an event handler attribute in <{tag[1]}>; dashboards show text, never run it"
    for match in _TEXT_TARGETS.finditer(decoded):
        target = match[1] or match[2] or match[3]
        problem = url_problem(target)
        if problem is not None:
            return f"link or source {target[:60]!r} in the text: {problem}"
    return None


# ------------------------------------------------------------------------------------------------ the walk


class _Walker:
    """Visits a dashboard once; knows which dicts are cards, views, sections, actions by where they sit."""

    def __init__(self, rules: ContentRules, found: list[Violation]) -> None:
        self.rules = rules
        self.found = found

    def refuse(self, where: str, rule: str) -> None:
        self.found.append(Violation(where or "the dashboard", rule))

    def node(self, node: Any, where: str, *, role: str | None) -> None:
        if isinstance(node, dict):
            self.mapping(node, where, role=role)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                self.node(item, f"{where}[{index}]", role=role)
        elif isinstance(node, str):
            problem = _text_problem(node)
            if problem is not None:
                self.refuse(where, problem)

    def mapping(self, node: dict[str, Any], where: str, *, role: str | None) -> None:
        kind = node.get("type")
        self.check_type(kind, where, role)
        if "strategy" in node:
            self.refuse(f"{_at(where, 'strategy')}", "dashboard strategies build cards with code in the browser")
        if role == "card" and kind in FRAME_CARDS:
            problem = url_problem(node.get("url"), frame_origins=self.rules.iframe_origins)
            if problem is not None:
                self.refuse(_at(where, "url"), problem)
        if role is None and isinstance(node.get("action"), str):
            self.action(node, where)
        elif kind in LEGACY_SERVICE_TYPES:
            self.service(node.get("service"), node, _at(where, "service"))
        for key, value in node.items():
            self.value(node, key, value, _at(where, key), role=role)

    def value(self, node: dict[str, Any], key: str, value: Any, where: str, *, role: str | None) -> None:
        if key == "url" and role == "card" and node.get("type") in FRAME_CARDS:
            return  # checked against the frame origins above
        if key in URL_KEYS:
            self.url_value(value, where)
        elif key in NAVIGATION_KEYS:
            problem = _navigation_problem(value)
            if problem is not None:
                self.refuse(where, problem)
        elif key in URL_MAP_KEYS and isinstance(value, dict):
            for state, image in value.items():
                self.url_value(image, f"{where}.{state}")
        else:
            self.node(value, where, role=_child_role(role, key, value))

    def url_value(self, value: Any, where: str) -> None:
        if isinstance(value, dict):  # a view background given as {image: ..., ...}
            self.node(value, where, role=None)
            return
        problem = url_problem(value) or _text_problem(value)
        if problem is not None:
            self.refuse(where, problem)

    def check_type(self, kind: Any, where: str, role: str | None) -> None:
        at = _at(where, "type")
        if isinstance(kind, str) and kind.strip().lower().startswith(_CUSTOM):
            if kind not in self.rules.custom_cards:
                listed = ", ".join(sorted(self.rules.custom_cards)) or "none"
                self.refuse(
                    at,
                    f"custom type {kind!r} runs code in the browser and is not listed in the farm profile's "
                    f"policy.dashboards.customCards (listed: {listed})",
                )
            return
        allowed = {"card": BUILTIN_CARDS, "view": VIEW_TYPES, "section": SECTION_TYPES}.get(role or "")
        if allowed is None or kind is None:  # a card without a type is the structural check's finding
            return
        if kind not in allowed:
            self.refuse(at, f"{kind!r} is not one of Home Assistant's built-in {role} types")

    def action(self, node: dict[str, Any], where: str) -> None:
        action = node["action"]
        if action not in ACTIONS:
            self.refuse(
                _at(where, "action"), f"action {action!r} is not allowed (allowed: {', '.join(sorted(ACTIONS))})"
            )
            return
        if action in SERVICE_ACTIONS:
            key = "perform_action" if "perform_action" in node else "service"
            self.service(node.get(key), node, _at(where, key))

    def service(self, service: Any, node: dict[str, Any], where: str) -> None:
        """A button's service call passes the service policy: whoever taps it calls it with their own rights."""
        if not isinstance(service, str) or service.count(".") != 1:
            self.refuse(where, "a button that performs an action must name its service as domain.service")
            return
        domain, name = service.split(".")
        entities, indirect = _targets(node)
        loaded = self.rules.profile or _NO_PROFILE
        try:
            check_service(domain, name, entities, indirect=indirect, loaded=loaded)
        except NotAllowed as err:
            self.refuse(where, f"whoever taps this calls {service}: {err.message}")
            return
        # Matched as the gate matches a call: a rule naming light.turn_on holds a light.toggle button too.
        call = effects.service_call(effects.EFFECT, service, [e.strip().lower() for e in entities], indirect=indirect)
        call = self._through_groups(call, domain)
        matched = matching(loaded.rules, call)
        guards = sorted({entity for rule in matched for entity in entities_under(rule, call)})
        driving = [
            e for e in call.entities if e not in guards and effects.guarded(loaded.rules, self.rules.drives.get(e, ()))
        ]
        if driving:
            driven = effects.guarded(loaded.rules, [d for e in driving for d in self.rules.drives[e]])
            self.refuse(
                where,
                f"whoever taps this calls {service} on {', '.join(driving)}, which drives {', '.join(driven)} "
                "(seen in Home Assistant: it changes when they do), which the farm profile's rules guard; an agent "
                "may not stage a button that acts on a guarded entity: show it with a tile or entity card instead",
            )
        elif guards:
            self.refuse(
                where,
                f"whoever taps this calls {service} on {', '.join(guards)}, which the farm profile's rules guard "
                "(approval, a rate, a range or a time limit that a tap in Home Assistant would skip); an agent may "
                "not stage a button that acts on a guarded entity: show it with a tile or entity card instead",
            )
        elif call.indirect and (matched or guarded_patterns(loaded.rules)):
            self.refuse(
                where,
                f"whoever taps this calls {service} on a device, area, floor or label, which may reach an entity the "
                "farm profile's rules guard; name the entities with target.entity_id",
            )

    def _through_groups(self, call: ControlCall, domain: str) -> ControlCall:
        """The call naming what it reaches through the groups it names, as the gate judges an agent's call."""
        if not call.entities:
            return call
        if self.rules.attributes is None:  # not following HA: a group's members are unknown
            unknown = any(domain_of(e) == OLD_GROUP_DOMAIN for e in call.entities)
            return dataclasses.replace(call, indirect=True) if unknown else call
        entities, overflow = reach.reached_now(call.entities, domain, self.rules.attributes)
        return dataclasses.replace(call, entities=entities, indirect=call.indirect or overflow)


def _child_role(role: str | None, key: str, value: Any) -> str | None:
    """The role of the values under `key` of a node with `role`: cards sit under `cards`/`card`, views under..."""
    if role == "dashboard" and key == "views":
        return "view"
    if key == "cards" and role in {"view", "section", "card"}:
        return "card"
    if key == "card" and role == "card" and isinstance(value, dict):
        return "card"
    if key == "sections" and role == "view":
        return "section"
    return None


def _targets(node: dict[str, Any]) -> tuple[list[str], bool]:
    """The entity ids an action button targets, and whether it also targets devices, areas, floors or labels."""
    entities: list[str] = []
    indirect = False
    for part in (node.get("target"), node.get("data"), node.get("service_data")):
        if not isinstance(part, dict):
            continue
        value = part.get("entity_id")
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, str):
                entities.extend(e.strip() for e in item.split(",") if e.strip())
        indirect = indirect or any(key in part for key in ("device_id", "area_id", "floor_id", "label_id"))
    return entities, indirect


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key

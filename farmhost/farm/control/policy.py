"""Farm action policy: who may run an action, which services control may reach, and the production gate.

The decisions are pure functions of the request and the farm profile (`FARM_PROFILE_PATH`, default
`<data>/farm-profile.json`, format in docs/farm-actions.md). `load_profile` reads the file on every call
(it is small and the operator may edit it while farmhost runs); a file that cannot be read or parsed is a
`LoadedProfile` with a `problem`, which refuses control actions and leaves every other default in place.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from farmhost.errors import NotAllowed, Unauthorized
from farmhost.farm.control.rules import MAX_RULES, ActuatorRule, covers_entity
from farmhost.farm.control.service_surface import check_addressed, check_surface
from farmhost.protocol.catalog import CONTROL_ACTIONS, FARM_ACTIONS, FarmActionName

# Service domains no agent may call, whatever the profile says: they reach the host itself (shell_command,
# python_script, pyscript, hassio), HA's own lifecycle (homeassistant: ha_restart has its own action),
# or history and backups (recorder, system_log, backup).
DEFAULT_DENIED_DOMAINS: Final = frozenset(
    {"homeassistant", "hassio", "shell_command", "python_script", "pyscript", "recorder", "system_log", "backup"}
)
MAX_PROFILE_BYTES: Final = 256 * 1024
ALL_GROUPS: Final = "*"
ACTION_NAMES: Final = frozenset(FARM_ACTIONS)
# Targets HA resolves to entities on its own side: under an entity allow-list they cannot be checked.
INDIRECT_TARGETS: Final = ("device_id", "area_id", "floor_id", "label_id")
# Entities Assist can only read (its intents answer questions about them and call no service on them): they do not
# count against a profile's allowedDomains/allowedEntities, which narrow control.
ASSIST_READ_ONLY_DOMAINS: Final = frozenset(
    {"sensor", "binary_sensor", "weather", "calendar", "sun", "zone", "person", "device_tracker", "event"}
)

_DomainPattern = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_*]+$", max_length=64)]
_ServicePattern = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_*]+\.[a-z0-9_*]+$", max_length=128)]
_EntityPattern = Annotated[str, StringConstraints(pattern=r"^[a-z0-9_*]+\.[a-z0-9_*]+$", max_length=255)]
_GroupName = Annotated[str, StringConstraints(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_-]{0,63})$")]


class ProfileInvalid(ValueError):
    """The farm profile's text is not a valid profile; the message says what is wrong."""


_Origin = Annotated[str, StringConstraints(pattern=r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?/?$", max_length=300)]
_CustomType = Annotated[str, StringConstraints(pattern=r"^custom:[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")]


class _DashboardsSection(BaseModel):
    """`policy.dashboards`: what the content policy opens (docs/dashboards.md); nothing by default."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    iframeOrigins: list[_Origin] = Field(default_factory=list)
    customCards: list[_CustomType] = Field(default_factory=list)


class _PolicySection(BaseModel):
    """`policy` of the profile: every key optional, unknown keys refused (a typo must not open anything)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    allowedDomains: list[_DomainPattern] | None = None
    allowedServices: list[_ServicePattern] | None = None
    allowedEntities: list[_EntityPattern] | None = None
    # Services opened beyond the closed surface (farm/control/service_surface.py), as `domain.service` globs; what they
    # open is still held by the rules on effects (farm/control/effect_rules.py).
    allowServices: list[_ServicePattern] = Field(default_factory=list)
    actionGroups: dict[FarmActionName, list[_GroupName]] = Field(default_factory=dict)
    dashboards: _DashboardsSection = Field(default_factory=_DashboardsSection)
    rules: Annotated[list[ActuatorRule], Field(max_length=MAX_RULES)] = Field(default_factory=list)


class _ValidationSection(BaseModel):
    """`validation` of the profile: the operator's record that the farm was checked."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    status: str | None = None


class _ProfileFile(BaseModel):
    """The whole file: other top-level keys (farm name, notes...) are the operator's and ignored here."""

    model_config = ConfigDict(extra="allow", strict=True, frozen=True)

    policy: _PolicySection = Field(default_factory=_PolicySection)
    validation: _ValidationSection = Field(default_factory=_ValidationSection)


@dataclass(frozen=True, kw_only=True)
class FarmProfile:
    """The parts of the farm profile farmhost enforces; None means "not narrowed"."""

    allowed_domains: frozenset[str] | None = None
    allowed_services: frozenset[str] | None = None
    allowed_entities: frozenset[str] | None = None
    allow_services: frozenset[str] = frozenset()  # opened beyond the closed service surface
    action_groups: dict[str, frozenset[str]] = field(default_factory=dict)
    validation_status: str | None = None
    iframe_origins: frozenset[str] = frozenset()  # `scheme://host[:port]`, lower case, default port left out
    custom_cards: frozenset[str] = frozenset()
    rules: tuple[ActuatorRule, ...] = ()  # policy.rules, in the file's order (farm/control/rules.py)


@dataclass(frozen=True, kw_only=True)
class LoadedProfile:
    """The profile as found on disk: absent, valid, or broken (`problem` says why, naming the file)."""

    path: Path
    profile: FarmProfile | None = None
    problem: str | None = None

    @property
    def exists(self) -> bool:
        """A profile file was found (valid or not)."""
        return self.profile is not None or self.problem is not None

    @property
    def rules(self) -> tuple[ActuatorRule, ...]:
        """The actuator rules (none without a valid profile: control is refused then anyway)."""
        return self.profile.rules if self.profile is not None else ()


def parse_profile(raw: bytes | str) -> FarmProfile:
    """Parse the profile's JSON text.

    Raises:
        ProfileInvalid: a sentence saying what is wrong (invalid JSON, unknown policy key, bad pattern...).
    """
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProfileInvalid(f"not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise ProfileInvalid("the profile must be a JSON object")
    try:
        parsed = _ProfileFile.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"])
        message = (
            "unknown key" if first["type"] == "extra_forbidden" else str(first["msg"]).removeprefix("Value error, ")
        )
        raise ProfileInvalid(f"{where}: {message}") from None
    policy = parsed.policy
    return FarmProfile(
        allowed_domains=_frozen(policy.allowedDomains),
        allowed_services=_frozen(policy.allowedServices),
        allowed_entities=_frozen(policy.allowedEntities),
        allow_services=frozenset(policy.allowServices),
        action_groups={action: frozenset(groups) for action, groups in policy.actionGroups.items()},
        validation_status=parsed.validation.status,
        iframe_origins=frozenset(origin_of(url) for url in policy.dashboards.iframeOrigins),
        custom_cards=frozenset(policy.dashboards.customCards),
        rules=tuple(policy.rules),
    )


def origin_of(url: str) -> str:
    """`scheme://host[:port]` of an absolute URL, lower case, the scheme's default port left out."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # out of range: never equal to a listed origin
        return f"{scheme}://{(parts.hostname or '').lower()}:invalid"
    default = {"http": 80, "https": 443}.get(scheme)
    shown = f":{port}" if port is not None and port != default else ""
    return f"{scheme}://{(parts.hostname or '').lower()}{shown}"


def load_profile(path: Path) -> LoadedProfile:
    """Read the farm profile at `path`; a missing file is no profile, an unreadable one a `problem`."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_PROFILE_BYTES + 1)
    except FileNotFoundError:
        return LoadedProfile(path=path)
    except OSError as err:
        return LoadedProfile(path=path, problem=f"the farm profile {path} cannot be read: {err.strerror or err}")
    if len(raw) > MAX_PROFILE_BYTES:
        return LoadedProfile(path=path, problem=f"the farm profile {path} is over {MAX_PROFILE_BYTES} bytes")
    try:
        return LoadedProfile(path=path, profile=parse_profile(raw))
    except ProfileInvalid as err:
        return LoadedProfile(path=path, problem=f"the farm profile {path} is not valid: {err}")


def authorise_group(action: str, *, folder: str, is_main: bool, loaded: LoadedProfile) -> None:
    """Main only, unless the profile's `actionGroups` lists the groups (exactly) for this action.

    Raises:
        Unauthorized: the source group may not run this action.
    """
    profile = loaded.profile
    allowed = profile.action_groups.get(action) if profile is not None else None
    if allowed is None:
        if is_main:
            return
        why = " (the farm profile could not be read, so the defaults apply)" if loaded.problem else ""
        raise Unauthorized(f"{action} is only allowed from the main group{why}")
    if ALL_GROUPS in allowed or folder in allowed:
        return
    who = ", ".join(sorted(allowed)) or "no group"
    raise Unauthorized(f"the farm profile allows {action} only from: {who}")


def check_control(action: str, *, farm_mode: str, loaded: LoadedProfile) -> None:
    """The gate every control action passes: a readable profile, and in production a validated one.

    Raises:
        NotAllowed: with what the operator has to do.
    """
    if action not in CONTROL_ACTIONS:
        return
    if loaded.problem is not None:
        raise NotAllowed(
            f"{action} is refused because {loaded.problem}; the operator must fix or remove that file "
            "(`farmhost doctor` shows the problem)"
        )
    if farm_mode != "production":
        return
    status = loaded.profile.validation_status if loaded.profile is not None else None
    if status != "pass":
        found = "there is no farm profile" if loaded.profile is None else f"its validation.status is {status!r}"
        raise NotAllowed(
            f"{action} is refused: FARM_MODE=production requires the farm profile {loaded.path} to have "
            f'validation.status "pass", and {found}; the operator must validate the farm and record it there'
        )


def check_service(domain: str, service: str, entity_ids: list[str], *, indirect: bool, loaded: LoadedProfile) -> None:
    """The service policy of ha_call_service/ha_set_entity: denied domains, the closed surface, the narrowing.

    The denied domains are refused whatever the profile says; then a service outside the closed surface
    (farm/control/service_surface.py) unless the profile's `allowServices` opens it; then `allowedDomains`,
    `allowedServices` and `allowedEntities` narrow what is left.

    Args:
        domain: the service's domain.
        service: the service name.
        entity_ids: the entities the call targets by id (may be empty).
        indirect: the call also targets devices/areas/floors/labels (resolved by HA, not checkable here).
        loaded: the farm profile.

    Raises:
        NotAllowed: a sentence naming the rule that refused the call.
    """
    name = f"{domain}.{service}"
    if domain in DEFAULT_DENIED_DOMAINS:
        raise NotAllowed(f"services of the {domain!r} domain are never allowed for agents ({name})")
    profile = loaded.profile
    allow = profile.allow_services if profile is not None else frozenset()
    check_surface(domain, service, allow=allow)
    if profile is not None:
        _check_narrowing(name, domain, entity_ids, indirect=indirect, profile=profile)
    check_addressed(domain, service, targeted=bool(entity_ids) or indirect, allow=allow)


def _check_narrowing(name: str, domain: str, entity_ids: list[str], *, indirect: bool, profile: FarmProfile) -> None:
    """The profile's allowedDomains / allowedServices / allowedEntities."""
    if profile.allowed_domains is not None and not _matches(domain, profile.allowed_domains):
        raise NotAllowed(
            f"the farm profile does not allow the {domain!r} domain ({name}); allowed: {_list(profile.allowed_domains)}"
        )
    if profile.allowed_services is not None and not _matches(name, profile.allowed_services):
        raise NotAllowed(f"the farm profile does not allow {name}; allowed: {_list(profile.allowed_services)}")
    if profile.allowed_entities is None:
        return
    if indirect or not entity_ids:
        raise NotAllowed(
            f"the farm profile limits control to listed entities: target {name} by entity_id "
            "(not by device, area, floor or label, and not without a target)"
        )
    refused = [e for e in entity_ids if e == "all" or not _matches(e, profile.allowed_entities)]
    if refused:
        raise NotAllowed(f"the farm profile does not allow control of {', '.join(refused)}")


def check_assist(exposed: frozenset[str], *, loaded: LoadedProfile) -> None:
    """The service policy for ha_assist, where Assist picks the entity and the service: checked on what it can reach.

    Assist acts only on the entities exposed to it, so those are held to the rules a direct call would be: no
    entity of a denied domain, and under a profile that narrows control, every exposed entity Assist could
    control (not only read) inside `allowedDomains` / `allowedEntities`. A profile with `allowedServices` cannot be
    checked (Assist chooses the service), so ha_assist is refused under one.

    Args:
        exposed: the entity ids exposed to Assist (or that may be, by Home Assistant's defaults).
        loaded: the farm profile.

    Raises:
        NotAllowed: a sentence naming the entities and the rule, and what the operator can change.
    """
    denied = sorted(e for e in exposed if _domain(e) in DEFAULT_DENIED_DOMAINS)
    if denied:
        raise NotAllowed(
            f"ha_assist is refused: Home Assistant exposes {_few(denied)} to Assist, and agents may never act on "
            "those domains; un-expose them in Home Assistant (Settings > Voice assistants > Expose)"
        )
    profile = loaded.profile
    if profile is None:
        return
    controllable = sorted(e for e in exposed if _domain(e) not in ASSIST_READ_ONLY_DOMAINS)
    guarded = sorted({e for e in controllable for rule in profile.rules if assist_cannot_keep(rule, e)})
    if guarded:
        raise NotAllowed(
            f"ha_assist is refused: Home Assistant exposes {_few(guarded)} to Assist{_THROUGH}, and the farm profile's rules "
            "put approval, a rate or a value range on them, which Assist cannot be held to (it picks the entity "
            "itself); use ha_set_entity or ha_call_service for them, or un-expose them in Home Assistant "
            "(Settings > Voice assistants > Expose)"
        )
    if profile.allowed_services is not None:
        raise NotAllowed(
            "ha_assist is refused: the farm profile limits control to listed services (allowedServices), and "
            "Assist chooses the service itself; use ha_call_service, or remove allowedServices from the profile"
        )
    if profile.allowed_domains is not None:
        outside = [e for e in controllable if not _matches(_domain(e), profile.allowed_domains)]
        if outside:
            raise NotAllowed(
                f"ha_assist is refused: Home Assistant exposes {_few(outside)} to Assist{_THROUGH}, outside the farm profile's "
                f"allowedDomains ({_list(profile.allowed_domains)}); un-expose them or allow their domains"
            )
    if profile.allowed_entities is not None:
        outside = [e for e in controllable if not _matches(e, profile.allowed_entities)]
        if outside:
            raise NotAllowed(
                f"ha_assist is refused: Home Assistant exposes {_few(outside)} to Assist{_THROUGH}, and the farm profile "
                "allows control only of its allowedEntities; un-expose them in Home Assistant or list them there"
            )


# What check_assist is given includes what exposed scenes and groups set (farm/assist.py).
_THROUGH: Final = " (itself, or in a scene or group exposed to it)"


def assist_cannot_keep(rule: ActuatorRule, entity_id: str) -> bool:
    """A rule Assist would slip past on this entity: approval, a rate or a range (maxOnSeconds is kept by farmhost)."""
    asks = bool(rule.requireApproval) or any(
        limit is not None for limit in (rule.maxCallsPerHour, rule.minSecondsBetween, rule.valueRange)
    )
    if not asks:
        return False
    if rule.entities is not None:
        return covers_entity(rule, entity_id)
    domain = _domain(entity_id)
    return any(fnmatch.fnmatchcase(domain, service.split(".", 1)[0]) for service in rule.services or ())


def _domain(entity_id: str) -> str:
    return entity_id.split(".", 1)[0]


def _few(entity_ids: list[str], shown: int = 5) -> str:
    more = len(entity_ids) - shown
    return ", ".join(entity_ids[:shown]) + (f" and {more} more" if more > 0 else "")


def _matches(value: str, patterns: frozenset[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


def _frozen(values: list[str] | None) -> frozenset[str] | None:
    return frozenset(values) if values is not None else None


def _list(values: frozenset[str]) -> str:
    return ", ".join(sorted(values)) or "nothing"


def profile_report(loaded: LoadedProfile, *, farm_mode: str) -> tuple[str, str, str]:
    """`farmhost doctor`'s line for the farm profile: (state ok/off/broken, detail, fix)."""
    if loaded.problem is not None:
        return "broken", f"{loaded.problem}; control actions are refused", f"fix or remove {loaded.path}"
    if loaded.profile is None:
        if farm_mode == "production":
            return "broken", f"FARM_MODE=production and no profile at {loaded.path}", _GATE_FIX
        return "off", f"no profile at {loaded.path}: default policy (main only, denied domains)", ""
    status = loaded.profile.validation_status
    if farm_mode == "production" and status != "pass":
        return "broken", f"{loaded.path}: validation.status is {status!r}; control actions are refused", _GATE_FIX
    opened = loaded.profile.allow_services
    services = f"; opened beyond the closed service surface: {_list(opened)}" if opened else ""
    return "ok", f"{loaded.path} (validation.status {status!r}, FARM_MODE={farm_mode}){services}", ""


_GATE_FIX: Final = 'validate the farm, then set "validation": {"status": "pass"} in the profile'

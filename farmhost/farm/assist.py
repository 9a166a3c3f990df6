"""ha_assist: Home Assistant's own conversation agent (Assist) answers a sentence and acts, under the farm's policy.

Assist is HA's built-in intent agent (`conversation.home_assistant`, sentence templates, no model): it matches
"turn on the irrigation pump" or "is the barn light on" against the entities *exposed* to it, calls the service
itself and says what it did. Since Assist, not the agent, picks the entity and the service, the service policy is
applied to what Assist can reach before the sentence is sent (policy.check_assist): the entities exposed to it
(HA's `homeassistant/expose_entity/list`), plus entities HA would expose by default that it has not decided on yet,
plus what the scenes and groups among them set (farm/control/reach.py): activating a scene switches what it lists.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from farmhost.errors import Unavailable
from farmhost.farm.control import policy, reach
from farmhost.farm.homeassistant.client import HaRejected
from farmhost.protocol.params import HaAssistParams

if TYPE_CHECKING:
    from farmhost.farm.deps import FarmDeps
    from farmhost.farm.homeassistant.client import HAClient
    from farmhost.handling import RequestContext

logger = logging.getLogger(__name__)

# The built-in agent by id: a farm whose default conversation agent is an LLM integration still gets the
# template agent here, which needs no model and no internet.
ASSIST_AGENT: Final = "conversation.home_assistant"
ASSISTANT: Final = "conversation"  # the assistant name entities are exposed to (HA's KNOWN_ASSISTANTS)
# Home Assistant 2025.4's defaults for an entity it has not decided on yet (exposed_entities.py): only the
# controllable domains matter for the policy, since sensors and binary sensors can only be read by Assist.
DEFAULT_EXPOSED_DOMAINS: Final = frozenset(
    {
        "climate",
        "cover",
        "fan",
        "humidifier",
        "light",
        "media_player",
        "scene",
        "switch",
        "todo",
        "vacuum",
        "water_heater",
    }
)
NO_CONVERSATION: Final = (
    "Home Assistant does not load its conversation integration (Assist): add `conversation:` (or "
    "`default_config:`) to its configuration.yaml and restart it"
)


async def ha_assist(deps: FarmDeps, ctx: RequestContext, p: HaAssistParams) -> dict[str, Any]:
    """Send `text` to Assist and return what it said and did: `{text, language?}`.

    Returns:
        `{speech, responseType, understood, targets, failed, errorCode, language}`: `speech` is Assist's answer
        (also when it did not understand: then `understood` is false and `errorCode` HA's reason, such as
        `no_intent_match` or `no_valid_targets`); `responseType` is `action_done`, `query_answer` or `error`;
        `targets` the entity ids it acted on or answered about, `failed` those it could not act on.

    Raises:
        NotAllowed: an entity Assist could act on is outside the service policy (policy.check_assist).
        Unavailable: HA is not configured or unreachable. HaRejected: HA has no conversation integration.
    """
    ha = _ha(deps)
    loaded = policy.load_profile(deps.settings.profile_path)
    policy.check_assist(await exposed_entities(ha), loaded=loaded)
    payload: dict[str, Any] = {"text": p.text, "agent_id": ASSIST_AGENT}
    if p.language is not None:
        payload["language"] = p.language
    try:
        answer = await ha.ws_command("conversation/process", **payload)
    except HaRejected as err:
        if "unknown_command" in err.message:
            raise HaRejected(NO_CONVERSATION) from None
        raise
    return _result(answer)


async def exposed_entities(ha: HAClient) -> frozenset[str]:
    """The entity ids Assist may act on: those exposed to it, and those HA would expose by default (not decided yet).

    Raises:
        HaError: HA could not be asked (unreachable, or the token is not an administrator's).
    """
    listed = await ha.ws_command("homeassistant/expose_entity/list")
    exposed = {
        entity_id
        for entity_id, assistants in _dict(_dict(listed).get("exposed_entities")).items()
        if isinstance(assistants, dict) and assistants.get(ASSISTANT)
    }
    registry = await ha.ws_command("config/entity_registry/list_for_display")
    registered = {str(e.get("ei")) for e in _list(_dict(registry).get("entities")) if isinstance(e, dict)}
    states = await ha.get_states()
    present = {str(state.get("entity_id", "")) for state in states}
    # An entity without a registry entry is exposed by its domain's default the first time Assist looks at it.
    undecided = {
        entity_id
        for entity_id in present
        if entity_id not in registered and entity_id.split(".", 1)[0] in DEFAULT_EXPOSED_DOMAINS
    }
    # HA keeps the exposure of an entity that is gone (a deleted scene): Assist cannot act on what does not exist.
    reachable = (exposed & present) | undecided
    # A scene or group Assist turns on sets the entities it lists, exposed or not: Assist reaches those too.
    attributes = {str(state.get("entity_id", "")): state.get("attributes") for state in states}

    def lookup(entity_id: str) -> Mapping[str, Any] | None:
        found = attributes.get(entity_id)
        return found if isinstance(found, Mapping) else None

    members, _ = reach.reached_now(sorted(reachable), None, lookup)
    return frozenset(reachable | set(members))


def _result(answer: Any) -> dict[str, Any]:
    response = _dict(_dict(answer).get("response"))
    speech = _dict(_dict(response.get("speech")).get("plain")).get("speech")
    data = _dict(response.get("data"))
    kind = str(response.get("response_type") or "error")
    return {
        "speech": str(speech) if speech else "(Assist gave no answer)",
        "responseType": kind,
        "understood": kind != "error",
        "targets": _ids(data.get("success")),
        "failed": _ids(data.get("failed")),
        "errorCode": str(data["code"]) if kind == "error" and data.get("code") else None,
        "language": response.get("language"),
    }


def _ids(items: Any) -> list[str]:
    return [str(i.get("id")) for i in _list(items) if isinstance(i, dict) and i.get("id")]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _ha(deps: FarmDeps) -> HAClient:
    if deps.ha is None:
        raise Unavailable("Home Assistant is not configured on this host (the operator sets HA_URL and HA_TOKEN)")
    return deps.ha

"""The catalog's rows are the one declaration of every action: the sets, the handlers and the export follow them."""

from __future__ import annotations

from typing import get_args

import pytest

from farmhost.farm.actions import ACTIONS, IMPLEMENTATION_MODULES, ROUTER_MARGIN, implementation
from farmhost.farm.control.policy import ACTION_NAMES
from farmhost.handling import Effect
from farmhost.protocol.catalog import (
    ACTION_PARAMS,
    CONTROL_ACTIONS,
    FARM_ACTIONS,
    FARM_ROWS,
    FILE_WRITING_ACTIONS,
    MEMORY_ACTIONS,
    ActionEffect,
)
from farmhost.protocol.requests import FarmActionRequest, MemoryActionRequest
from farmhost.protocol.schema import contract_schema


def test_the_closed_sets_are_the_rows() -> None:
    assert get_args(FarmActionRequest.model_fields["action"].annotation) == FARM_ACTIONS
    assert (
        MEMORY_ACTIONS
        == get_args(MemoryActionRequest.model_fields["action"].annotation)
        == (
            "memory_search",
            "memory_get",
        )
    )
    assert set(ACTION_PARAMS) == {*FARM_ACTIONS, *MEMORY_ACTIONS} and set(FARM_ACTIONS) == ACTION_NAMES
    # What was hand-written before the catalog, kept: a change of effect is a change of the gate and of crash replay.
    assert {
        "ha_call_service",
        "ha_set_entity",
        "ha_restart",
        "ha_apply_dashboard",
        "ha_dashboard_patch",
        "ha_assist",
    } == CONTROL_ACTIONS
    assert {"ha_capture_screenshot", "farm_state_refresh"} == FILE_WRITING_ACTIONS
    enum = contract_schema()["$defs"]["FarmActionRequest"]["properties"]["action"]["enum"]
    assert tuple(enum) == FARM_ACTIONS


def test_every_row_is_run_by_its_function_with_its_effect_and_timeout() -> None:
    assert list(ACTIONS) == list(FARM_ACTIONS)
    for row in FARM_ROWS:
        spec = ACTIONS[row.name]
        assert spec.run.__name__ == row.name and spec.row is row
        assert spec.effect is (Effect.READ if row.effect is ActionEffect.READ else Effect.EXTERNAL), row.name
        assert spec.timeout == row.timeout
    assert ACTIONS["ha_restart"].timeout == 160.0 and ACTIONS["ha_capture_screenshot"].timeout == 35.0
    assert ROUTER_MARGIN > 0


def test_a_row_without_its_function_is_named_in_the_error() -> None:
    with pytest.raises(LookupError, match=r"ha_no_such_action needs one async function .*core_actions"):
        implementation("ha_no_such_action")
    # A name only imported into an implementation module is not its implementation: `check_calls` is a function
    # of core_actions, not an async action; `ha_assist` is found once, in assist, though others may import it.
    with pytest.raises(LookupError):
        implementation("check_calls")
    assert implementation("ha_assist").__module__ == "farmhost.farm.assist"
    assert len(IMPLEMENTATION_MODULES) == len(set(IMPLEMENTATION_MODULES))

"""The in-sandbox client's `site`: checked before anything is written, carried to the host, refused there clearly."""

from __future__ import annotations

import pytest
from agent_support import Farm, pending
from farmagent.errors import InvalidRequestError, RequestError


def test_a_bad_site_name_is_refused_before_writing_and_a_host_without_mqtt_says_so(farm: Farm) -> None:
    client = farm.client()
    with pytest.raises(InvalidRequestError, match="not a site name"):
        client.farm_action("ha_get_status", site="Green/House")
    assert pending(farm.ipc()) == []
    with pytest.raises(RequestError) as caught:
        client.farm_action("ha_get_status", site="greenhouse")
    assert caught.value.code == "upstream_unavailable"
    assert "FARMHOST_MQTT_URL is not set" in str(caught.value)

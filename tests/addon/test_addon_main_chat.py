"""The add-on registers its main chat from the options with the real `farmhost group` commands, whatever its name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from farmhost_testing import clean_env, farmhost

from farmhost.addon.options import AddonOptions
from farmhost.addon.run import register_main


@pytest.mark.parametrize("name", ["-= Farm office =-", "--main", "Office --folder x"])
def test_the_main_chat_is_registered_under_the_name_the_option_gives(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    env = clean_env(FARMHOST_DATA_DIR=str(data))
    assert farmhost("init", data_dir=data, env=env).returncode == 0
    command = [sys.executable, "-m", "farmhost", "--data-dir", str(data)]
    register_main(command, env, AddonOptions(main_chat_id=-1001234, main_chat_name=name))
    listed = farmhost("group", "list", "--json", data_dir=data, env=env)
    groups = json.loads(listed.stdout)
    assert [(g["jid"], g["name"], g["folder"], g["isMain"]) for g in groups] == [
        ("telegram:-1001234", name, "main", True)
    ], groups

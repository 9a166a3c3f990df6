"""`farmhost doctor`'s voice line: off, the embedded model loaded once, a Wyoming server asked, each failure."""

from __future__ import annotations

import json
from pathlib import Path

from farmhost_testing import clean_env, farmhost

from farmhost_dev.hf_hub import LocalHub
from farmhost_dev.voice import WyomingServer, free_port


def _voice(tmp_path: Path, **env: str) -> dict[str, str]:
    done = farmhost("doctor", "--json", data_dir=tmp_path / "data", env=clean_env(**env), timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    (check,) = [c for c in json.loads(done.stdout) if c["part"] == "voice"]
    return check


def test_the_embedded_model_is_loaded_once_to_prove_it(tmp_path: Path, whisper_base: Path) -> None:
    check = _voice(tmp_path, FARMHOST_STT_MODEL=str(whisper_base))
    assert check["state"] == "ok", check
    assert check["detail"].startswith(f"voice notes: faster-whisper ({whisper_base}), model loaded in ")


def test_a_missing_model_directory_is_broken_with_the_variable_to_fix(tmp_path: Path) -> None:
    check = _voice(tmp_path, FARMHOST_STT_MODEL=str(tmp_path / "no-model"))
    assert check["state"] == "broken", check
    assert "does not exist" in check["detail"] and "FARMHOST_STT_MODEL" in check["fix"]


def test_a_named_model_is_fetched_once_into_the_data_dir_by_the_first_doctor(
    tmp_path: Path, local_hub: LocalHub
) -> None:
    env = {"FARMHOST_STT_MODEL": "base", "HF_ENDPOINT": local_hub.url, "HF_HOME": str(tmp_path / "hf-home")}
    local_hub.clear()
    check = _voice(tmp_path, **env)
    assert check["state"] == "ok", check
    assert check["detail"].startswith("voice notes: faster-whisper (base), model loaded in ")
    assert sorted(local_hub.downloads()) == ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
    assert list((tmp_path / "data" / "models").glob("models--Systran--faster-whisper-base/snapshots/*/model.bin"))
    local_hub.clear()
    assert _voice(tmp_path, **env)["state"] == "ok"
    assert local_hub.requests == []  # the second run loads the kept copy


def test_a_named_model_the_hub_cannot_send_is_broken_with_how_to_get_it(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    check = _voice(tmp_path, FARMHOST_STT_MODEL="base", HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf-home"))
    assert check["state"] == "broken", check
    assert f"could not be downloaded from {endpoint} (it could not be reached)" in check["detail"]
    assert "internet" in check["fix"] and "HF_ENDPOINT" in check["fix"] and "FARMHOST_STT_MODEL" in check["fix"]


def test_a_wyoming_server_is_asked_what_it_serves(tmp_path: Path, wyoming_server: WyomingServer) -> None:
    check = _voice(tmp_path, FARMHOST_STT_URL=wyoming_server.url)
    assert check["state"] == "ok", check
    assert check["detail"].startswith(f"voice notes: wyoming {wyoming_server.url}, the server offers ")


def test_a_wyoming_server_that_is_down_is_broken(tmp_path: Path) -> None:
    url = f"tcp://127.0.0.1:{free_port()}"
    check = _voice(tmp_path, FARMHOST_STT_URL=url)
    assert check["state"] == "broken", check
    assert url in check["detail"] and "nothing listens there" in check["detail"]
    assert "FARMHOST_STT_URL" in check["fix"]


def test_voice_notes_off_says_how_to_turn_them_on(tmp_path: Path) -> None:
    check = _voice(tmp_path)
    assert check["state"] == "off"
    assert check["detail"] == "voice notes: off (FARMHOST_STT_MODEL and FARMHOST_STT_URL not set)"
    assert "FARMHOST_STT_MODEL" in check["fix"]

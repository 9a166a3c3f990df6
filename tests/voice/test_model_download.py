"""A model *named* in FARMHOST_STT_MODEL (`base`): fetched once by the real worker from a Hub, then kept in <data>/models.

The Hub is farmhost_dev/hf_hub.py's stand-in on 127.0.0.1, speaking the protocol the installed huggingface_hub uses
(repo info, tree, HEAD/GET /resolve/ with X-Repo-Commit and ETag) and counting requests; the product is pointed at
it as an operator points it at a mirror, with HF_ENDPOINT (and HTTP_PROXY, SSL_CERT_FILE) in the daemon's
environment, which the worker has to inherit.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
from voice_fixture import voice_settings

from farmhost.voice import EngineUnavailable, ModelNotFetched, speech_to_text
from farmhost.voice.embedded import EmbeddedEngine
from farmhost_dev.hf_hub import WHISPER_BASE_REPO, LocalHub, self_signed
from farmhost_dev.voice import IRRIGATION_WORDS, free_port

MODEL_FILES = ["config.json", "model.bin", "tokenizer.json", "vocabulary.txt"]
# Variables of the test's own machine that would send the worker's requests elsewhere than the test says.
_ROUTING = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "HF_HUB_OFFLINE", "HF_HUB_CACHE")


@pytest.fixture
def hub_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """The daemon's environment without the machine's routing, and huggingface_hub's home in the test's directory."""
    for name in _ROUTING:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return monkeypatch


def _engine(models_dir: Path, model: str = "base") -> EmbeddedEngine:
    engine = speech_to_text(voice_settings(model=model, models_dir=models_dir))
    assert isinstance(engine, EmbeddedEngine)
    return engine


def _snapshot(models_dir: Path, hub: LocalHub) -> Path:
    """Where huggingface_hub's cache layout puts the fetched model under FARMHOST_STT_MODEL's download root."""
    folder = "models--" + WHISPER_BASE_REPO.replace("/", "--")
    return models_dir / folder / "snapshots" / hub.commits[WHISPER_BASE_REPO]


@pytest.mark.slow  # the real model fetched and loaded twice
async def test_a_named_model_is_fetched_once_into_the_data_dir_and_a_later_start_asks_no_hub(
    local_hub: LocalHub, hub_env: pytest.MonkeyPatch, tmp_path: Path, whisper_base: Path, irrigation_note: bytes
) -> None:
    hub_env.setenv("HF_ENDPOINT", local_hub.url)
    models = tmp_path / "data" / "models"
    local_hub.clear()
    first = _engine(models)
    try:
        said = await first.transcribe(irrigation_note)
    finally:
        await first.aclose()
    assert all(word in said.text.lower() for word in IRRIGATION_WORDS), said
    assert said.engine == "faster-whisper (base)"
    assert sorted(local_hub.downloads()) == MODEL_FILES  # each file once
    snapshot = _snapshot(models, local_hub)
    assert sorted(p.name for p in snapshot.iterdir()) == MODEL_FILES
    assert filecmp.cmp(snapshot / "model.bin", whisper_base / "model.bin", shallow=False)

    # A new worker (the daemon restarted, or the idle one ended) uses that copy and asks the Hub nothing.
    local_hub.clear()
    second = _engine(models)
    try:
        await second.load()
        assert second.loads == 1
    finally:
        await second.aclose()
    assert local_hub.requests == []

    # Nor does it need one: with the farm's line down, the model still loads.
    hub_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    offline = _engine(models)
    try:
        await offline.load()
    finally:
        await offline.aclose()


async def test_an_unreachable_hub_is_one_sentence_with_what_to_do(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, irrigation_note: bytes
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    hub_env.setenv("HF_ENDPOINT", endpoint)
    engine = _engine(tmp_path / "models")
    try:
        with pytest.raises(ModelNotFetched) as refused:
            await engine.transcribe(irrigation_note)
        sentence = str(refused.value)
        assert sentence.startswith("The speech-to-text model base is not on the farm computer yet")
        assert f"could not be downloaded from {endpoint} (it could not be reached)" in sentence
        assert "HF_ENDPOINT" in sentence and "FARMHOST_STT_MODEL" in sentence
        assert sentence.endswith(".") and ". " not in sentence and "\n" not in sentence
        assert engine.worker_pid is not None  # the worker answered: the next note tries the Hub again
    finally:
        await engine.aclose()


async def test_offline_mode_is_named_when_the_model_is_not_there(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, local_hub: LocalHub
) -> None:
    hub_env.setenv("HF_ENDPOINT", local_hub.url)
    hub_env.setenv("HF_HUB_OFFLINE", "1")
    local_hub.clear()
    engine = _engine(tmp_path / "models")
    try:
        with pytest.raises(ModelNotFetched, match=r"\(HF_HUB_OFFLINE is set\)"):
            await engine.load()
    finally:
        await engine.aclose()
    assert local_hub.requests == []


async def test_a_name_the_hub_does_not_have_or_faster_whisper_does_not_know_says_to_fix_the_setting(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, local_hub: LocalHub
) -> None:
    hub_env.setenv("HF_ENDPOINT", local_hub.url)
    for model, expected in (
        ("Systran/faster-whisper-nope", f"is not offered by {local_hub.url}: fix FARMHOST_STT_MODEL"),
        ("basic", "FARMHOST_STT_MODEL=basic is neither a model directory nor a model name faster-whisper knows"),
    ):
        engine = _engine(tmp_path / "models", model)
        try:
            with pytest.raises(EngineUnavailable) as refused:
                await engine.load()
        finally:
            await engine.aclose()
        assert expected in str(refused.value) and not isinstance(refused.value, ModelNotFetched)


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "all_proxy"])
async def test_the_fetch_goes_through_the_proxy_in_the_environment(
    local_hub: LocalHub, hub_env: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    # The mirror's name resolves nowhere: only the proxy (the stand-in, asked as a forward proxy) can reach it.
    hub_env.setenv("HF_ENDPOINT", "http://hub-mirror.farm.invalid")
    hub_env.setenv(variable, local_hub.url)
    local_hub.clear()
    engine = _engine(tmp_path / "models")
    try:
        await engine.load()
    finally:
        await engine.aclose()
    assert sorted(local_hub.downloads()) == MODEL_FILES
    assert {r.host for r in local_hub.requests} == {"hub-mirror.farm.invalid"}


async def test_a_mirror_with_its_own_certificate_authority_is_trusted_through_ssl_cert_file(
    hub_env: pytest.MonkeyPatch, tmp_path: Path, whisper_base: Path
) -> None:
    cert, key = self_signed(tmp_path)
    with LocalHub({WHISPER_BASE_REPO: whisper_base}, certificate=(cert, key)) as mirror:
        hub_env.setenv("HF_ENDPOINT", mirror.url)
        hub_env.setenv("SSL_CERT_FILE", str(cert))
        engine = _engine(tmp_path / "models")
        try:
            await engine.load()
        finally:
            await engine.aclose()
        assert mirror.url.startswith("https://") and sorted(mirror.downloads()) == MODEL_FILES

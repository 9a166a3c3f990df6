"""The Home Assistant add-on's files, checked against what the Supervisor and the add-on linter accept.

No package ships the Supervisor's schema, so these checks restate it, each citing where it is written:
home-assistant/supervisor `supervisor/apps/validate.py` (`_SCHEMA_APP_CONFIG`, `SCHEMA_BUILD_CONFIG`,
`SCHEMA_APP_TRANSLATIONS`, `RE_SERVICE`, `RE_DOCKER_IMAGE_BUILD`), `supervisor/apps/options.py` (`RE_SCHEMA_ELEMENT`),
`supervisor/apps/const.py` (`RE_SLUG`, `MappingType`, `AppBackupMode`), `supervisor/const.py` (`ARCH_ALL`),
`supervisor/store/validate.py` (`SCHEMA_REPOSITORY_CONFIG`), `supervisor/store/data.py` (`_find_app_configs`), and
frenck/action-addon-linter `src/lint.py` (a property at its default is an error; cold backups take no pre/post
commands). Read at supervisor 090ef31 (2026-08) and action-addon-linter 2bd8faa (2026-04).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePath
from typing import Any

import pytest
import yaml

from farmhost import __version__
from farmhost.addon.options import AddonOptions
from farmhost.layout import DataLayout

REPO = Path(__file__).resolve().parents[2]
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")  # supervisor/const.py FILE_SUFFIX_CONFIGURATION

# The keys _SCHEMA_APP_CONFIG knows (supervisor/apps/validate.py); it drops others silently (REMOVE_EXTRA).
KNOWN_KEYS = {
    "name", "version", "slug", "description", "arch", "machine", "url", "startup", "boot", "init", "advanced",
    "stage", "ports", "ports_description", "watchdog", "webui", "ingress", "ingress_port", "ingress_entry",
    "ingress_stream", "panel_icon", "panel_title", "panel_admin", "homeassistant", "host_network", "host_pid",
    "host_ipc", "host_uts", "host_dbus", "devices", "udev", "tmpfs", "map", "environment", "privileged", "apparmor",
    "full_access", "audio", "video", "gpio", "usb", "uart", "devicetree", "kernel_modules", "realtime", "hassio_api",
    "hassio_role", "homeassistant_api", "stdin", "legacy", "docker_api", "auth_api", "services", "discovery",
    "backup_exclude", "backup_pre", "backup_post", "backup", "options", "schema", "image", "ulimits", "timeout",
    "journald", "breaking_versions",
}  # fmt: skip
# Their defaults, where _SCHEMA_APP_CONFIG gives one; the linter refuses a property written at its default.
DEFAULTS: dict[str, Any] = {
    "startup": "application", "boot": "auto", "init": True, "advanced": False, "stage": "stable", "ingress": False,
    "ingress_port": 8099, "ingress_stream": False, "panel_icon": "mdi:puzzle", "panel_admin": True,
    "host_network": False, "host_pid": False, "host_ipc": False, "host_uts": False, "host_dbus": False, "udev": False,
    "tmpfs": False, "map": [], "apparmor": True, "full_access": False, "audio": False, "video": False, "gpio": False,
    "usb": False, "uart": False, "devicetree": False, "kernel_modules": False, "realtime": False, "hassio_api": False,
    "hassio_role": "default", "homeassistant_api": False, "stdin": False, "legacy": False, "docker_api": False,
    "auth_api": False, "backup": "hot", "options": {}, "schema": {}, "ulimits": {}, "timeout": 10, "journald": False,
}  # fmt: skip
ARCH_ALL = {"aarch64", "amd64"}  # supervisor/const.py ARCH_ALL (armhf, armv7, i386 deprecated)
RE_SLUG_FIELD = re.compile(r"^[-_.A-Za-z0-9]+$")
RE_SERVICE = re.compile(r"^(?P<service>mqtt|mysql):(?P<rights>provide|want|need)$")
RE_DOCKER_IMAGE_BUILD = re.compile(r"^([a-zA-Z\-\.:\d{}]+/)*?([\-\w{}]+)/([\-\w{}]+)(:[\.\-\w{}]+)?$")
RE_SCHEMA_ELEMENT = re.compile(
    r"^(?:"
    r"|bool"
    r"|email"
    r"|url"
    r"|port"
    r"|device(?:\((?P<filter>subsystem=[a-z]+)\))?"
    r"|str(?:\((?P<s_min>\d+)?,(?P<s_max>\d+)?\))?"
    r"|password(?:\((?P<p_min>\d+)?,(?P<p_max>\d+)?\))?"
    r"|int(?:\((?P<i_min>-?\d+)?,(?P<i_max>-?\d+)?\))?"
    r"|float(?:\((?P<f_min>-?\d*\.?\d+)?,(?P<f_max>-?\d*\.?\d+)?\))?"
    r"|match\((?P<match>.*)\)"
    r"|list\((?P<list>.+)\)"
    r")\??$"
)
MAPPING_TYPES = {
    "data", "config", "ssl", "local_apps", "backup", "share", "media", "homeassistant_config", "all_app_configs",
    "app_config", "addons", "all_addon_configs", "addon_config",
}  # fmt: skip


def load(name: str) -> Any:
    return yaml.safe_load((REPO / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    loaded = load("config.yaml")
    assert isinstance(loaded, dict)
    return loaded


def test_the_repository_holds_exactly_one_add_on_and_its_repository_file() -> None:
    # The Supervisor takes every `**/config.{yaml,yml,json}` outside dot folders and `rootfs` as an add-on.
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found = [
        f
        for f in tracked
        if PurePath(f).stem == "config"
        and PurePath(f).suffix in CONFIG_SUFFIXES
        and not any(p.startswith(".") or p == "rootfs" for p in PurePath(f).parts)
    ]
    assert found == ["config.yaml"], found
    repository = load("repository.yaml")
    assert isinstance(repository["name"], str) and set(repository) <= {"name", "url", "maintainer"}, repository


def test_config_yaml_passes_the_supervisors_schema_and_the_linters_rules(config: dict[str, Any]) -> None:
    assert set(config) <= KNOWN_KEYS, set(config) - KNOWN_KEYS
    for key in ("name", "version", "slug", "description"):
        assert isinstance(config[key], str) and config[key], key
    assert RE_SLUG_FIELD.match(config["slug"])
    assert config["version"] == __version__, "the add-on's version follows farmhost's"
    assert set(config["arch"]) == ARCH_ALL, config["arch"]
    at_default = [key for key, value in config.items() if key in DEFAULTS and value == DEFAULTS[key]]
    assert not at_default, f"the linter refuses properties at their default: {at_default}"
    assert isinstance(config["init"], bool) and isinstance(config["homeassistant_api"], bool)
    assert all(RE_SERVICE.match(s) for s in config["services"]), config["services"]
    assert config["backup"] in ("hot", "cold")
    if config["backup"] == "cold":
        assert "backup_pre" not in config and "backup_post" not in config
    assert all(isinstance(p, str) for p in config["backup_exclude"])
    for volume in config["map"]:
        assert volume["type"] in MAPPING_TYPES and isinstance(volume.get("read_only", True), bool), volume
        assert set(volume) <= {"type", "read_only", "path"}, volume
    assert isinstance(config["timeout"], int) and 10 <= config["timeout"] <= 300
    # What the add-on needs, and nothing wider: no host network, no privileges, no Docker, no full access.
    assert config["homeassistant_api"] is True and config["services"] == ["mqtt:want"]
    assert config["init"] is False  # tini is PID 1 (the Dockerfile's ENTRYPOINT)
    wide = {"privileged", "full_access", "docker_api", "host_network", "host_pid", "hassio_api", "apparmor"}
    assert not wide & set(config), wide & set(config)


def test_the_options_schema_is_one_the_supervisor_reads_and_the_daemons_model(config: dict[str, Any]) -> None:
    schema, options = config["schema"], config["options"]
    for name, element in schema.items():
        assert isinstance(element, str) and RE_SCHEMA_ELEMENT.match(element), (name, element)
        # A required option (no `?`) must have a value, or the Supervisor refuses to start the add-on.
        assert element.endswith("?") or name in options, f"required option {name} has no default"
    assert set(options) <= set(schema)
    for name, value in options.items():
        element = schema[name]
        choices = re.fullmatch(r"list\((.+)\)\??", element)
        if choices:
            assert value in choices[1].split("|"), (name, value)
    assert set(schema) == set(AddonOptions.model_fields), set(schema) ^ set(AddonOptions.model_fields)
    defaults = AddonOptions()
    for name, value in options.items():
        assert getattr(defaults, name) == value, f"option {name}: config.yaml and AddonOptions differ"
    # The model takes what the schema allows: each `list(...)` choice, and the farm profile's pattern.
    for name, element in schema.items():
        choices = re.fullmatch(r"list\((.+)\)\??", element)
        for choice in choices[1].split("|") if choices else ():
            assert getattr(AddonOptions.model_validate({name: choice}), name) == choice
    profile = re.fullmatch(r"match\((.+)\)\?", schema["farm_profile"])
    assert profile is not None
    assert profile[1] == AddonOptions.model_fields["farm_profile"].metadata[0].pattern


def test_build_yaml_names_a_base_for_every_architecture_and_a_dockerfile_each(config: dict[str, Any]) -> None:
    build = load("build.yaml")
    assert set(build) <= {"build_from", "squash", "args", "labels"}, build
    assert set(build["build_from"]) == set(config["arch"])
    for arch, base in build["build_from"].items():
        assert RE_DOCKER_IMAGE_BUILD.match(base), base
        dockerfile = (REPO / f"Dockerfile.{arch}").read_text()
        assert f"ARG BUILD_FROM={base}\n" in dockerfile and "FROM ${BUILD_FROM}\n" in dockerfile, arch
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in build.get("labels", {}).items())
    amd64, aarch64 = ((REPO / f"Dockerfile.{a}").read_text().splitlines() for a in ("amd64", "aarch64"))
    differ = [(a, b) for a, b in zip(amd64, aarch64, strict=True) if a != b]
    assert [a.split("=")[0] for a, _ in differ] == ["ARG BUILD_FROM"], differ


def test_every_option_has_an_english_name_and_description(config: dict[str, Any]) -> None:
    files = sorted((REPO / "translations").glob("*"))
    assert [f.name for f in files] == ["en.yaml"]
    for file in files:
        translations = yaml.safe_load(file.read_text(encoding="utf-8"))
        assert set(translations) <= {"configuration", "network"}, file
        configuration = translations["configuration"]
        assert set(configuration) == set(config["schema"]), set(configuration) ^ set(config["schema"])
        for name, entry in configuration.items():
            assert set(entry) <= {"name", "description", "fields"}, (name, entry)
            assert isinstance(entry["name"], str) and isinstance(entry["description"], str), name


def test_the_add_on_folder_has_its_documents_and_icon() -> None:
    for name in ("DOCS.md", "CHANGELOG.md", "apparmor.txt"):
        assert (REPO / name).read_text().strip(), name
    assert f"## {__version__}" in (REPO / "CHANGELOG.md").read_text()
    icon = (REPO / "icon.png").read_bytes()
    assert icon[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(icon[16:20], "big") == int.from_bytes(icon[20:24], "big") == 128  # square, 128 px
    assert "profile farmhost " in (REPO / "apparmor.txt").read_text()  # the Supervisor loads it as the slug


def _backed_up(data: Path, excludes: list[str]) -> set[str]:
    """What a backup of `data` takes, by the Supervisor's filter (PurePath.match on the full path, apps/app.py).

    Applied as securetar's `atomic_contents_add` applies it: to each entry, before descending into a directory.
    """
    kept: set[str] = set()

    def walk(directory: Path) -> None:
        for entry in sorted(directory.iterdir()):
            if any(entry.match(pattern) for pattern in excludes):
                continue
            kept.add(str(entry.relative_to(data)))
            if entry.is_dir() and not entry.is_symlink():
                walk(entry)

    walk(data)
    return kept


def test_backups_take_the_state_and_leave_out_what_is_rebuilt(tmp_path: Path, config: dict[str, Any]) -> None:
    data = tmp_path / "data"
    layout = DataLayout(data / "farmhost")
    layout.create()
    layout.create_group("main")
    (data / "options.json").write_text("{}")
    layout.db_path.write_bytes(b"db")
    (layout.create_memory_index() / "main.sqlite").write_bytes(b"index")
    layout.create_group_run("main")
    runs = layout.run_logs("main")
    runs.mkdir(parents=True, exist_ok=True)
    (runs / "run-1.log").write_text("log")
    quarantined = layout.errors / "main"
    quarantined.mkdir(parents=True, exist_ok=True)
    (quarantined / "bad.json").write_text("{")
    (layout.workspace("main") / "notes.md").write_text("soil")
    kept = _backed_up(data, config["backup_exclude"])
    assert {"options.json", "farmhost/farmhost.db", "farmhost/groups/main/notes.md"} <= kept
    left_out = {"farmhost/memory-index/main.sqlite", "farmhost/logs/runs/main/run-1.log", "farmhost/ipc/errors/main"}
    assert not left_out & kept, left_out & kept
    assert not any(k.startswith("farmhost/run/") for k in kept), sorted(kept)

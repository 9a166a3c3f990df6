"""arm64 first: every package uv.lock installs on a Raspberry Pi has a wheel for it, so nothing needs a compiler.

The lock is walked from farmhost and farmagent (with the dev group: `make test` runs on the Pi too), following
only the dependencies whose markers hold on Linux aarch64 with CPython 3.11 (Raspberry Pi OS bookworm, the
farmhost image) and 3.12 (the agent image); each package reached must have a wheel whose tags that platform
accepts (manylinux for glibc <= 2.36, or a pure `py3-none-any`). musllinux wheels do not count: Raspberry Pi OS
is glibc. A package without any usable wheel would be listed by name, version and what it offers.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("farmhost", "farmagent")
GLIBC_MINOR = 36  # Debian bookworm / Raspberry Pi OS bookworm: glibc 2.36


@dataclass(frozen=True)
class Target:
    python: tuple[int, int]
    full_version: str

    @property
    def environment(self) -> dict[str, str]:
        major_minor = f"{self.python[0]}.{self.python[1]}"
        return {
            "implementation_name": "cpython",
            "implementation_version": self.full_version,
            "os_name": "posix",
            "platform_machine": "aarch64",
            "platform_python_implementation": "CPython",
            "platform_release": "6.6.51+rpt-rpi-v8",
            "platform_system": "Linux",
            "platform_version": "#1 SMP PREEMPT Debian",
            "python_full_version": self.full_version,
            "python_version": major_minor,
            "sys_platform": "linux",
            "extra": "",
        }

    def tags(self) -> set[Tag]:
        platforms = [f"manylinux_2_{minor}_aarch64" for minor in range(GLIBC_MINOR, 16, -1)]
        platforms += ["manylinux2014_aarch64", "linux_aarch64"]
        tags = set(cpython_tags(self.python, platforms=platforms))
        tags |= set(
            compatible_tags(self.python, interpreter=f"cp{self.python[0]}{self.python[1]}", platforms=platforms)
        )
        return tags


TARGETS = {"cp311": Target((3, 11), "3.11.2"), "cp312": Target((3, 12), "3.12.8")}


def _lock() -> list[dict[str, Any]]:
    packages: list[dict[str, Any]] = tomllib.loads((REPO / "uv.lock").read_text(encoding="utf-8"))["package"]
    return packages


def _applies(marker: str | None, target: Target) -> bool:
    return marker is None or Marker(marker).evaluate(target.environment)


def _pick(packages: list[dict[str, Any]], dependency: dict[str, Any], target: Target) -> dict[str, Any]:
    """The locked package a dependency entry means (the lock may hold several versions of one name)."""
    candidates = [p for p in packages if p["name"] == dependency["name"]]
    if "version" in dependency:
        candidates = [p for p in candidates if p["version"] == dependency["version"]]
    if len(candidates) > 1:
        candidates = [p for p in candidates if any(_applies(m, target) for m in p.get("resolution-markers", [None]))]
    assert len(candidates) == 1, f"cannot tell which {dependency['name']} is meant: {candidates}"
    return candidates[0]


def installed_packages(target: Target) -> list[dict[str, Any]]:
    """Every locked package an install of farmhost + farmagent (+ dev) reaches on `target`."""
    packages = _lock()
    seen: dict[tuple[str, str], dict[str, Any]] = {}
    todo: list[tuple[dict[str, Any], list[str]]] = [(_pick(packages, {"name": n}, target), []) for n in ROOTS]
    while todo:
        package, extras = todo.pop()
        key = (package["name"], package["version"])
        first = key not in seen
        seen[key] = package
        entries = list(package.get("dependencies", [])) if first else []
        if first:
            for group in package.get("dev-dependencies", {}).values():
                entries += group
        for extra in extras:
            entries += package.get("optional-dependencies", {}).get(extra, [])
        for entry in entries:
            if _applies(entry.get("marker"), target):
                todo.append((_pick(packages, entry, target), list(entry.get("extra", []))))
    return sorted(seen.values(), key=lambda p: p["name"])


def _usable(package: dict[str, Any], target: Target) -> bool:
    if "editable" in package["source"] or "virtual" in package["source"]:
        return True  # farmhost and farmagent themselves: pure Python from this repository
    accepted = target.tags()
    for wheel in package.get("wheels", []):
        filename = wheel["url"].rsplit("/", 1)[-1]
        _, _, _, tags = parse_wheel_filename(filename)
        if tags & accepted:
            return True
    return False


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_installed_package_has_an_arm64_wheel(name: str) -> None:
    target = TARGETS[name]
    packages = installed_packages(target)
    names = {p["name"] for p in packages}
    # The walk found the real tree: native packages that matter on a Pi are in it.
    assert {"farmhost", "farmagent", "pydantic-core", "aiohttp", "playwright", "mypy"} <= names, sorted(names)
    assert "pywin32" not in names and "colorama" not in names  # Windows-only markers were honoured
    missing = [
        f"{p['name']} {p['version']}: " + ", ".join(w["url"].rsplit("/", 1)[-1] for w in p.get("wheels", [])[:4])
        for p in packages
        if not _usable(p, target)
    ]
    assert not missing, f"no wheel for Linux aarch64 {name}; these would need a compiler on a Pi: {missing}"


def test_the_check_rejects_wheels_for_other_platforms() -> None:
    target = TARGETS["cp311"]
    x86_only = {
        "name": "x",
        "version": "1",
        "source": {"registry": "https://pypi.org/simple"},
        "wheels": [
            {"url": "https://h/x-1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"},
            {"url": "https://h/x-1-cp311-cp311-musllinux_1_2_aarch64.whl"},
            {"url": "https://h/x-1-cp312-cp312-manylinux_2_17_aarch64.whl"},
            {"url": "https://h/x-1-cp311-cp311-manylinux_2_39_aarch64.whl"},
        ],
    }
    assert not _usable(x86_only, target)
    assert _usable({**x86_only, "wheels": [{"url": "https://h/x-1-cp311-cp311-manylinux_2_28_aarch64.whl"}]}, target)
    assert _usable({**x86_only, "wheels": [{"url": "https://h/x-1-cp38-abi3-manylinux2014_aarch64.whl"}]}, target)
    assert _usable({**x86_only, "wheels": [{"url": "https://h/x-1-py3-none-any.whl"}]}, target)
    sdist_only = {"name": "y", "version": "1", "source": {"registry": "https://pypi.org/simple"}, "sdist": {}}
    assert not _usable(sdist_only, target)

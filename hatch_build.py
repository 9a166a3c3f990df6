"""Hatch build hook: the shipped dashboards and global memory become package data of farmhost's wheel.

The top-level `dashboards/` and `memory/` stay the source (edited there, read from there in a checkout); a
standard wheel carries copies under `farmhost/shipped/`, where `farmhost.layout.shipped_dir` finds them once
installed. Editable installs get nothing copied: they read the checkout, so an edit shows at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SHIPPED = ("dashboards", "memory")  # farmhost/layout.py: SHIPPED_PACKAGE_DIR/<name>


class ShippedDataHook(BuildHookInterface):  # type: ignore[misc]
    """Force-include the shipped directories into standard (not editable) wheels."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Map `<root>/<name>` to `farmhost/shipped/<name>` in the wheel."""
        if self.target_name != "wheel" or version != "standard":
            return
        for name in SHIPPED:
            source = Path(self.root) / name
            if not source.is_dir():
                raise FileNotFoundError(f"{source} is missing: the farmhost wheel ships it as package data")
            build_data["force_include"][str(source)] = f"farmhost/shipped/{name}"

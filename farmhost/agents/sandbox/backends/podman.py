"""podman: the docker backend with podman's CLI; rootless podman keeps the daemon's uid inside the container."""

from __future__ import annotations

from dataclasses import dataclass

from farmhost.agents.sandbox.backends.docker import DockerBackend


@dataclass(frozen=True, kw_only=True)
class PodmanBackend(DockerBackend):
    """`podman run` with the same flags as docker."""

    engine: str = "podman"
    name: str = "podman"
    rootless: bool = False

    def _engine_args(self) -> list[str]:
        # Rootless podman maps container uids onto subordinate ids; keep-id maps the daemon's own uid onto the
        # same number inside, so files the agent writes in its workspace stay owned by the data dir's owner.
        return ["--userns", "keep-id"] if self.rootless else []

    def _mount_options(self) -> list[str]:
        # podman's -v takes them: nothing setuid or a device node in a workspace works in the container
        return ["nosuid", "nodev"]

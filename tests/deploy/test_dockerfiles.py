"""Both Dockerfiles build only from what is in the repository (and pinned images and registries).

Checked without an engine, by reading the Dockerfiles and their .dockerignore the way Docker does: every COPY/ADD
source exists in the build context and is not ignored, nothing is fetched from a URL (no ADD of a URL, no curl,
wget or git in RUN), base images and COPY --from images are pinned to a tag, pip installs only pinned versions
or local paths, and the farmhost image keeps the Makefile's uv and the project's licence.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from farmhost_testing import clean_env

from farmhost.agents.kinds import IMAGE_OPENCODE_BIN, OPENCODE_VERSION

REPO = Path(__file__).resolve().parents[2]
# (Dockerfile, build context) as docker-compose.yml builds them (tests/deploy/test_compose_config.py checks that).
IMAGES = {
    "farmhost": (REPO / "Dockerfile", REPO),
    "agent": (REPO / "container" / "Dockerfile", REPO / "container"),
    # The Home Assistant add-on's, built by the Supervisor from the repository root (config.yaml beside them).
    "addon-amd64": (REPO / "Dockerfile.amd64", REPO),
    "addon-aarch64": (REPO / "Dockerfile.aarch64", REPO),
}
FETCHERS = re.compile(r"\b(curl|wget|git\s+clone|fetch)\b|https?://|\bgit\+")


@dataclass
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Dockerfile:
    instructions: list[Instruction]
    stages: list[str] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def global_args(self) -> dict[str, str]:
        """The defaults of the ARGs before the first FROM (what a FROM line may use)."""
        defaults: dict[str, str] = {}
        for instruction in self.instructions:
            if instruction.keyword == "FROM":
                break
            if instruction.keyword == "ARG":
                name, _, default = instruction.args.partition("=")
                defaults[name] = default
        return defaults

    def base(self, instruction: Instruction) -> str:
        """The image a FROM names, with the global ARGs' defaults substituted."""
        image = instruction.args.split()[0]
        for name, default in self.global_args().items():
            image = image.replace(f"${{{name}}}", default).replace(f"${name}", default)
        return image

    def named(self, name: str) -> list[Instruction]:
        """The instructions of the stage `FROM ... AS name`, from its FROM on."""
        froms = [i.args.split() for i in self.all("FROM")]
        return self.stage(next(n for n, words in enumerate(froms) if words[1:] in (["AS", name], ["as", name])))

    def stage(self, index: int) -> list[Instruction]:
        """The instructions of the `index`th stage (-1: the final one, the image), from its FROM on."""
        starts = [n for n, i in enumerate(self.instructions) if i.keyword == "FROM"]
        begin = starts[index]
        end = next((s for s in starts if s > begin), len(self.instructions))
        return self.instructions[begin:end]


def parse(path: Path) -> Dockerfile:
    """Instructions with continuation lines joined and comment lines dropped, as Docker's parser does."""
    instructions: list[Instruction] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, args = text.partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
    assert not pending, f"{path}: the file ends inside a continued line"
    parsed = Dockerfile(instructions)
    for instruction in parsed.all("FROM"):
        words = instruction.args.split()
        if len(words) == 3 and words[1].upper() == "AS":
            parsed.stages.append(words[2])
    return parsed


def _args_of(instruction: Instruction) -> tuple[dict[str, str], list[str]]:
    """(--flags, words) of a COPY/ADD, in JSON or shell form."""
    flags: dict[str, str] = {}
    rest = instruction.args
    while rest.startswith("--"):
        flag, _, rest = rest.partition(" ")
        name, _, value = flag[2:].partition("=")
        flags[name] = value
        rest = rest.strip()
    words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
    return flags, words


def _pinned(image: str) -> bool:
    """`name:tag` with a tag other than latest, or a digest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


# --- .dockerignore, as Docker reads it ---------------------------------------------------------------------


def _pattern(glob: str) -> re.Pattern[str]:
    """Docker's glob: `*` and `?` stay within one path element, `**` spans any number of them."""
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        elif glob[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif glob[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(glob[i]), i + 1
    return re.compile(out + r"\Z")


def ignored(context: Path, relative: str) -> bool:
    """Whether `relative` (a path in the context) is left out of the build.

    The last matching rule decides; a rule matches a path or any of its parent directories.
    """
    file = context / ".dockerignore"
    rules = []
    if file.exists():
        for line in file.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            rules.append((negated, _pattern(line.lstrip("!").strip("/"))))
    parts = relative.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    verdict = False
    for negated, pattern in rules:
        if any(pattern.match(prefix) for prefix in prefixes):
            verdict = not negated
    return verdict


def _files_under(context: Path, source: str) -> list[str]:
    path = context / source
    if path.is_file():
        return [source]
    return sorted(
        str(p.relative_to(context))
        for p in path.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )


# --- the checks --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_every_copy_source_is_in_the_build_context_and_not_ignored(image: str) -> None:
    dockerfile, context = IMAGES[image]
    parsed = parse(dockerfile)
    copies = parsed.all("COPY") + parsed.all("ADD")
    assert copies, "no COPY at all?"
    for instruction in copies:
        flags, words = _args_of(instruction)
        if "from" in flags:
            source = flags["from"]
            assert source in parsed.stages or _pinned(source), f"line {instruction.line}: COPY --from={source}"
            continue
        for source in words[:-1]:
            assert not FETCHERS.search(source), f"line {instruction.line}: {instruction.keyword} of a URL: {source}"
            assert "*" not in source and ".." not in source.split("/"), f"line {instruction.line}: {source}"
            assert (context / source).exists(), f"line {instruction.line}: {source} is not in {context}"
            files = _files_under(context, source)
            assert files, f"line {instruction.line}: {source} holds no file"
            left_out = [f for f in files if ignored(context, f)]
            assert not left_out, f"line {instruction.line}: .dockerignore leaves out {left_out[:5]}"


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_nothing_is_fetched_but_pinned_images_and_registry_packages(image: str) -> None:
    dockerfile, _ = IMAGES[image]
    parsed = parse(dockerfile)
    for instruction in parsed.all("FROM"):
        base = parsed.base(instruction)  # FROM ${BASE_IMAGE}: the ARG's default must be pinned
        assert base in parsed.stages or _pinned(base), f"line {instruction.line}: FROM {base} is not pinned to a tag"
    for instruction in parsed.all("ADD"):
        assert not FETCHERS.search(instruction.args), f"line {instruction.line}: ADD {instruction.args}"
    for instruction in parsed.all("RUN"):
        assert not FETCHERS.search(instruction.args), f"line {instruction.line}: RUN fetches: {instruction.args}"
        assert not re.search(r"\|\s*(ba)?sh\b", instruction.args), f"line {instruction.line}: pipes into a shell"
        for command in re.split(r"&&|;|\|\|", instruction.args):
            words = shlex.split(command)
            if len(words) > 1 and Path(words[0]).name in ("pip", "pip3") and words[1] == "install":
                packages = [w for w in words[2:] if not w.startswith("-")]
                for package in packages:
                    pinned = re.fullmatch(r"[A-Za-z0-9_.-]+==[^=]+", package) is not None
                    assert pinned or package.startswith("/"), f"line {instruction.line}: pip install {package}"
            if words[:2] == ["npm", "install"]:
                packages = [w for w in words[2:] if not w.startswith("-") and not w.startswith("/")]
                assert packages, f"line {instruction.line}: npm install of the package.json's ranges"
                for package in packages:  # name@version, the version an ARG whose default is an exact version
                    pinned = re.fullmatch(r"[a-z0-9@/._-]+@(\d+\.\d+\.\d+|\$\{[A-Z_]+\})", package) is not None
                    assert pinned, f"line {instruction.line}: npm install {package}"


def test_the_ignore_rules_keep_secrets_and_local_state_out_of_the_farmhost_build() -> None:
    for path in (".env", ".venv/bin/python", ".tools/bin/uv", "data/farmhost.db", ".git/HEAD", ".ha/x",
                 ".mypy_cache/x.json", ".pytest_cache/v", "tests/conftest.py", "farmhost/__pycache__/app.cpython-311.pyc",
                 "container/farmagent/__pycache__/run.cpython-311.pyc", "deploy/install.sh"):  # fmt: skip
        assert ignored(REPO, path), path
    for path in (
        "farmhost/app.py",
        "uv.lock",
        "container/farmagent/run.py",
        "dashboards/farm.yaml",
        "memory/MEMORY.md",
    ):
        assert not ignored(REPO, path), path


def test_the_farmhost_image_keeps_the_makefile_uv_the_lock_and_the_licence() -> None:
    parsed = parse(REPO / "Dockerfile")
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    makefile_uv = re.search(r"^UV_VERSION \?= (\S+)$", (REPO / "Makefile").read_text(), re.MULTILINE)
    assert makefile_uv is not None
    assert [i.args for i in parsed.all("ARG") if i.args.startswith("UV_VERSION")] == [f"UV_VERSION={makefile_uv[1]}"]
    syncs = [i.args for i in parsed.all("RUN") if "uv sync" in i.args]
    assert syncs and all("--frozen" in s and "--no-dev" in s for s in syncs)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert f'org.opencontainers.image.licenses="{project["license"]}"' in text
    assert project["license"] == "GPL-3.0-or-later"
    # The runtime stage: the Python Raspberry Pi OS bookworm has, a non-root user, the health check, farmhost.
    assert parsed.base(parsed.all("FROM")[-1]) == "python:3.11-slim-bookworm"
    users = [i.args for i in parsed.all("USER")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert parsed.all("HEALTHCHECK")[-1].args.endswith('CMD ["farmhost", "health"]')
    assert json.loads(parsed.all("ENTRYPOINT")[-1].args)[-1] == "farmhost"
    assert json.loads(parsed.all("CMD")[-1].args) == ["run"]
    assert "FARMHOST_DATA_DIR=/data" in " ".join(i.args for i in parsed.all("ENV"))
    # BuildKit-only syntax would break the classic builder of docker-compose 1.29 / docker.io 20.10.
    assert "--mount=" not in text and "--chmod=" not in text and "--link" not in text


def test_the_farmhost_images_bases_are_build_arguments_defaulting_to_the_official_images() -> None:
    """BASE_IMAGE, DOCKER_CLI_IMAGE and PYTHON: a Pi builds from the official images, the tests from local ones."""
    parsed = parse(REPO / "Dockerfile")
    assert parsed.global_args() == {
        "BASE_IMAGE": "python:3.11-slim-bookworm",
        "DOCKER_CLI_IMAGE": "docker:28.2.2-cli",
        "PYTHON": "/usr/local/bin/python3.11",  # the official image's; Debian's own python3 is /usr/bin/python3.11
    }
    assert [i.args for i in parsed.all("FROM")] == [
        "${DOCKER_CLI_IMAGE} AS docker-cli", "${BASE_IMAGE} AS build", "${BASE_IMAGE}",
    ]  # fmt: skip
    # The classic builder takes no variable in COPY --from: the CLI image is a stage, and only its binary is copied.
    copies = [_args_of(i) for i in parsed.stage(-1) if i.keyword == "COPY"]
    assert ({"from": "docker-cli"}, ["/usr/local/bin/docker", "/usr/local/bin/docker"]) in copies
    assert parsed.named("docker-cli") == parsed.all("FROM")[:1], "the CLI stage only names its image"
    # A global ARG is empty inside a stage unless the stage declares it again: the build stage does, for PYTHON.
    build = parsed.named("build")
    declared = {i.args.partition("=")[0] for i in build if i.keyword == "ARG"}
    assert {"PYTHON", "PIP_CERT", "SSL_CERT_FILE"} <= declared
    runs = [i.args for i in build if i.keyword == "RUN"]
    assert all('--python "$PYTHON"' in r for r in runs if "uv sync" in r) and sum("uv sync" in r for r in runs) == 2
    assert any(r.startswith('"$PYTHON" -m venv /opt/uv') for r in runs), runs
    # The CA arguments have no default: a build that is not given them uses the image's own trust store.
    assert {i.args for i in build if i.keyword == "ARG" and i.args in ("PIP_CERT", "SSL_CERT_FILE")} == {
        "PIP_CERT", "SSL_CERT_FILE",
    }  # fmt: skip


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_each_image_carries_the_licence_of_its_package(image: str) -> None:
    dockerfile, context = IMAGES[image]
    licence = tomllib.loads((context / "pyproject.toml").read_text())["project"]["license"]
    labels = " ".join(i.args for i in parse(dockerfile).all("LABEL"))
    assert re.findall(r'org\.opencontainers\.image\.licenses="([^"]+)"', labels) == [licence]
    assert licence == "GPL-3.0-or-later"  # homeassistant-api is GPL-3.0-or-later (README, Licence)


def test_the_agent_image_is_built_from_container_only() -> None:
    parsed = parse(REPO / "container" / "Dockerfile")
    text = (REPO / "container" / "Dockerfile").read_text(encoding="utf-8")
    for instruction in parsed.all("COPY"):  # from the context or its own stages, never from another image
        flags, _ = _args_of(instruction)
        assert flags.get("from", parsed.stages[0]) in parsed.stages, f"line {instruction.line}: {instruction.args}"
    users = [i.args for i in parsed.all("USER")]
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "farmagent.run" in text


def test_the_agent_image_has_the_pinned_opencode_from_its_npm_package_and_no_npm() -> None:
    parsed = parse(REPO / "container" / "Dockerfile")
    # Both stages build on the base the BASE_IMAGE build argument names (python:3.12-slim unless told).
    assert parsed.global_args() == {"BASE_IMAGE": "python:3.12-slim"}
    assert [i.args.split()[0] for i in parsed.all("FROM")] == ["${BASE_IMAGE}", "${BASE_IMAGE}"]
    assert parsed.stages == ["opencode"]
    build = parsed.stage(0)
    versions = [
        i.args.partition("=")[2] for i in build if i.keyword == "ARG" and i.args.startswith("OPENCODE_VERSION=")
    ]
    assert versions == [OPENCODE_VERSION]  # the build argument's default is the version farmhost pins
    runs = " && ".join(i.args for i in build if i.keyword == "RUN")
    assert '"opencode-ai@${OPENCODE_VERSION}"' in runs and "--ignore-scripts" in runs
    assert IMAGE_OPENCODE_BIN == "/opt/opencode/bin/opencode" and IMAGE_OPENCODE_BIN in runs
    assert 'test "$(HOME=/tmp /opt/opencode/bin/opencode --version)" = "$OPENCODE_VERSION"' in runs
    # The image takes only the binary (and its package.json) from that stage: no node, no npm.
    image = parsed.stage(-1)
    copies = [_args_of(i) for i in image if i.keyword == "COPY" and "--from" in i.args]
    assert copies == [({"from": "opencode"}, ["/opt/opencode", "/opt/opencode"])]
    image_runs = " ".join(i.args for i in image if i.keyword == "RUN")
    assert "npm" not in image_runs and "node" not in image_runs


@pytest.mark.slow
def test_the_build_stage_installs_farmhost_from_exactly_what_it_copies(tmp_path: Path) -> None:
    """The farmhost image's build stage, replayed without Docker.

    Its COPYs (through .dockerignore) and its `uv sync` steps, with the checkout's uv (the same version) and this
    Python, in a directory standing for /app.
    """
    parsed = parse(REPO / "Dockerfile")
    build = parsed.named("build")
    workdir = next(i.args for i in build if i.keyword == "WORKDIR")
    app = tmp_path / "app"
    app.mkdir()
    # The build sees only the image's own ENV, not the caller's uv settings (`make test` exports some).
    env = {k: v for k, v in clean_env().items() if not k.startswith("UV_")}
    for instruction in build:
        if instruction.keyword == "ENV":
            for name, value in re.findall(r"(\w+)=(\S+)", instruction.args):
                if name != "UV_NO_CACHE":  # the image keeps no cache; here uv's cache is used
                    env[name] = value.replace(workdir, str(app))
            env["UV_COMPILE_BYTECODE"] = "0"  # bytecode: covered by the install test
        elif instruction.keyword == "ARG" and "=" in instruction.args:  # a build argument's default, e.g. VOICE=1
            name, _, value = instruction.args.partition("=")
            env[name] = value
        elif instruction.keyword == "COPY" and "--from" not in instruction.args:
            _, words = _args_of(instruction)
            target = app / words[-1] if not words[-1].startswith("/") else Path(words[-1].replace(workdir, str(app)))
            for source in words[:-1]:
                for file in _files_under(REPO, source):
                    if ignored(REPO, file):
                        continue
                    inside = Path(file).relative_to(source) if (REPO / source).is_dir() else Path(file).name
                    into = target / inside if (REPO / source).is_dir() or words[-1].endswith("/") else target
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(REPO / file, into)
        elif instruction.keyword == "RUN" and "uv sync" in instruction.args:
            command = instruction.args.replace(workdir, str(app)).replace('"$PYTHON"', sys.executable)
            command = re.sub(r"(^|&& )uv ", rf"\g<1>{REPO / '.tools' / 'bin' / 'uv'} ", command)
            done = subprocess.run(
                command, shell=True, cwd=app, env=env, capture_output=True, text=True, timeout=120, check=False
            )
            assert done.returncode == 0, f"line {instruction.line}: {command}\n{done.stderr}"
    venv = Path(env["UV_PROJECT_ENVIRONMENT"])
    assert venv == app / ".venv"
    version = subprocess.run([venv / "bin" / "farmhost", "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("farmhost ")
    # farmhost is an editable install of /app, so it seeds dashboards and the global memory from there.
    probe = "from farmhost.layout import shipped_dir; import farmagent; print(shipped_dir('dashboards'), "
    probe += "shipped_dir('memory'), farmagent.__file__)"
    shipped = subprocess.run(
        [venv / "bin" / "python", "-c", probe], capture_output=True, text=True, check=True, cwd=app
    )
    assert shipped.stdout.split() == [
        str(app / "dashboards"),
        str(app / "memory"),
        str(app / "container" / "farmagent" / "__init__.py"),
    ]
    # Nothing dev-only, nothing the lock does not name.
    installed = subprocess.run(
        [REPO / ".tools" / "bin" / "uv", "pip", "list", "--python", venv / "bin" / "python", "--format", "json"],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    names = {p["name"] for p in json.loads(installed.stdout)}
    assert "pytest" not in names and "mypy" not in names and {"farmhost", "farmagent", "playwright"} <= names
    assert {"faster-whisper", "av", "wyoming"} <= names  # the voice extra (VOICE=1 by default)

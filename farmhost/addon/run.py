"""`farmhost addon-run`: the add-on's entry point, from the Supervisor's options to `farmhost run`.

It reads /data/options.json, finds Home Assistant (the Supervisor's proxy, SUPERVISOR_TOKEN) and the MQTT broker
(the Supervisor's services API), writes them into the environment farmhost's Settings read, creates the data dir
and the main chat's group, then replaces itself with `farmhost run` as the unprivileged user `farmhost`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from farmhost.addon.options import OPTIONS_PATH, AddonOptions, read_options
from farmhost.addon.supervisor import Supervisor, SupervisorError

logger = logging.getLogger("farmhost.addon")

DATA_DIR: Final = Path("/data/farmhost")  # /data is what HA backs up; options.json sits beside this folder
CONFIG_DIR: Final = Path("/config")  # the add-on's config folder (addon_config), where a farm profile is put
# The daemon runs as this uid, not as the container's root: bwrap then makes its sandbox in a user namespace of an
# ordinary uid, which needs no capability the add-on does not have (docs/deployment.md, "Home Assistant add-on").
RUN_UID: Final = 1000
# What this entry point found, for the commands run later in the container (`docker exec -u 1000 ... farmhost doctor`
# reads `.env` from its working directory, the image's WORKDIR): in the container's own layer, never in a backup.
ENV_FILE: Final = Path("/home/farmhost/.env")
# The settings addon_environment gives farmhost run, and so what ENV_FILE repeats.
_SETTINGS: Final = (
    "FARMHOST_DATA_DIR", "FARM_MODE", "FARMHOST_LOG_LEVEL", "TELEGRAM_BOT_TOKEN", "FARMHOST_LLM_BASE_URL",
    "FARMHOST_LLM_MODEL", "FARMHOST_LLM_API_KEY", "FARM_PROFILE_PATH", "HA_URL", "HA_TOKEN", "FARMHOST_MQTT_URL",
    "FARMHOST_AGENT_RUNTIME", "FARMHOST_SANDBOX_PROC", "FARMHOST_AGENT_UNENFORCED_LIMITS", "TZ",
)  # fmt: skip
MAIN_FOLDER: Final = "main"


def addon_environment(
    options: AddonOptions, supervisor: Supervisor | None, base: dict[str, str], *, config_dir: Path = CONFIG_DIR
) -> dict[str, str]:
    """`base` with farmhost's settings from the options and the Supervisor (theirs win; runtime knobs only default)."""
    env = dict(base)
    env["FARMHOST_DATA_DIR"] = str(DATA_DIR)
    env["FARM_MODE"] = options.farm_mode
    env["FARMHOST_LOG_LEVEL"] = options.log_level
    given = {
        "TELEGRAM_BOT_TOKEN": options.telegram_bot_token,
        "FARMHOST_LLM_BASE_URL": options.llm_base_url,
        "FARMHOST_LLM_MODEL": options.llm_model,
        "FARMHOST_LLM_API_KEY": options.llm_api_key,
        "FARM_PROFILE_PATH": str(config_dir / options.farm_profile) if options.farm_profile else None,
    }
    for key, value in given.items():
        if value is not None:
            env[key] = value
    if supervisor is not None:
        env["HA_URL"] = supervisor.ha_url
        env["HA_TOKEN"] = supervisor.token
        try:
            mqtt = supervisor.mqtt()
        except SupervisorError as err:
            logger.warning("MQTT is off: %s", err.message)
        else:
            if mqtt is None:
                logger.warning("MQTT is off: no add-on provides it (install and start the Mosquitto broker add-on)")
            else:
                env["FARMHOST_MQTT_URL"] = mqtt.url
                logger.info("MQTT broker from the Supervisor: %s:%d (user %s)", mqtt.host, mqtt.port, mqtt.username)
    # The sandbox inside the add-on: bwrap in a user namespace, the container's /proc, no cgroup of its own.
    env.setdefault("FARMHOST_AGENT_RUNTIME", "bwrap")
    env.setdefault("FARMHOST_SANDBOX_PROC", "container")
    env.setdefault("FARMHOST_AGENT_UNENFORCED_LIMITS", "allow")
    env.setdefault("HOME", "/home/farmhost")
    return env


def addon_run(options_path: Path = OPTIONS_PATH) -> int:
    """Prepare and exec `farmhost run`; returns only when that cannot start (exit status 1)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    options, _ = read_options(options_path)
    supervisor = Supervisor.from_env()
    if supervisor is None:
        logger.warning("SUPERVISOR_TOKEN is not set: Home Assistant and MQTT are off (is this run as an add-on?)")
    else:
        logger.info("Home Assistant through the Supervisor at %s", supervisor.ha_url)
    env = addon_environment(options, supervisor, dict(os.environ))
    drop = _drop_privileges()
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        for path in (DATA_DIR, *DATA_DIR.rglob("*")):  # the data dir is the run user's, whoever restored it
            os.lchown(path, RUN_UID, RUN_UID)
    _write_env_file(env)
    farmhost = [*drop, sys.executable, "-m", "farmhost", "--data-dir", str(DATA_DIR)]
    done = subprocess.run([*farmhost, "init"], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        logger.error("farmhost init failed: %s", (done.stderr or done.stdout).strip())
        return 1
    if options.main_chat_id is not None:
        register_main(farmhost, env, options)
    logger.info("starting farmhost run (data in %s)", DATA_DIR)
    argv = [*farmhost, "run"]
    os.execvpe(argv[0], argv, env)


def _drop_privileges() -> list[str]:
    """The prefix that runs a command as RUN_UID when this is root (setpriv, util-linux), else nothing."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={RUN_UID}", f"--regid={RUN_UID}", "--clear-groups", "--"]


def register_main(farmhost: Sequence[str], env: dict[str, str], options: AddonOptions) -> None:
    """Register the main chat as the main group, once; a main group that exists is kept (and a changed id said)."""
    listed = subprocess.run(
        [*farmhost, "group", "list", "--json"], env=env, capture_output=True, text=True, check=False
    )
    groups = json.loads(listed.stdout) if listed.returncode == 0 and listed.stdout.strip() else []
    jid = f"telegram:{options.main_chat_id}"
    main = [g for g in groups if g.get("isMain")]
    if main:
        if main[0].get("jid") != jid:
            logger.warning(
                "option main_chat_id is %s but the main group is %s: the registered one stays "
                "(farmhost group remove main, then restart the add-on, to change it)",
                options.main_chat_id,
                main[0].get("jid"),
            )
        return
    # `--name=`: a name that starts with `-` ("-= Farm office =-") is the option's value, not another option.
    add = [*farmhost, "group", "add", "--jid", jid, f"--name={options.main_chat_name}", "--folder", MAIN_FOLDER]
    done = subprocess.run([*add, "--main"], env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        logger.error(
            "options main_chat_id and main_chat_name: the main group was not registered: %s",
            (done.stderr or done.stdout).strip(),
        )
    else:
        logger.info("registered %s as the main chat (%s)", jid, options.main_chat_name)


def _write_env_file(env: dict[str, str]) -> None:
    """ENV_FILE with the settings farmhost run gets (0600, the run user's); a failure only costs `doctor` its view."""
    lines = [f"{key}='{_quoted(env[key])}'\n" for key in _SETTINGS if key in env]
    try:
        ENV_FILE.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(ENV_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write("".join(lines))
        if os.geteuid() == 0:
            os.chown(ENV_FILE, RUN_UID, RUN_UID)
    except OSError as err:
        logger.warning(
            "%s not written (%s): `farmhost doctor` in the container will not see the options", ENV_FILE, err
        )


def _quoted(value: str) -> str:
    """A value inside single quotes as python-dotenv reads them: backslash and quote escaped."""
    return value.replace("\\", "\\\\").replace("'", "\\'")

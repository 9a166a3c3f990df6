#!/usr/bin/env bash
# Install farmhost without Docker: a virtualenv with uv.lock's exact versions in a prefix, the systemd unit, the
# settings file and an initialised data directory. Agents then run in bubblewrap sandboxes (docs/deployment.md).
#
#   sudo deploy/install.sh --user farmhost                  # /opt/farmhost, /var/lib/farmhost, /etc/farmhost
#   deploy/install.sh --no-systemd --prefix ~/farmhost --data-dir ~/farmhost-data   # files only, as yourself
#   sudo deploy/install.sh --user farmhost --with-opencode  # and OpenCode, for agents of kind opencode
#
# Safe to run again (an upgrade is `git pull` and the same command): the virtualenv is synced to the lock, the
# source copy and the unit are replaced, the settings file and the data directory are kept; an OpenCode installed
# once is brought to the pinned version on every run.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=/opt/farmhost
DATA_DIR=/var/lib/farmhost
CONFIG_DIR=
RUN_USER=
SYSTEMD=1
DRY_RUN=0
PYTHON=
OPENCODE=0
VOICE=1
UNIT_DIR=/etc/systemd/system
STEP=0
STEPS=8

usage() {
    cat <<EOF
Usage: deploy/install.sh [options]

Install farmhost from this checkout into a prefix, with the exact dependency versions of uv.lock.

  --prefix DIR       where the virtualenv goes; DIR/bin/farmhost is the command (default /opt/farmhost)
  --data-dir DIR     the data directory, created and initialised (default /var/lib/farmhost)
  --config-dir DIR   where farmhost.env (the settings file) goes (default /etc/farmhost as root,
                     else ~/.config/farmhost); never inside the prefix, which agent sandboxes see
  --user NAME        the user the daemon runs as, created as a system user if missing (needs root);
                     required when run as root unless --no-systemd
  --python PATH      the Python 3.11+ to build the virtualenv on (default /usr/bin/python3, else python3)
  --with-opencode    also install OpenCode (agent kind opencode, about 190 MB) at the version farmhost pins into
                     DIR/opencode, from its npm package (needs npm), or copied from this checkout's .tools/opencode
                     when that holds the version (make opencode); kept up to date by later runs
  --without-voice    leave out the voice extra (faster-whisper, PyAV, ONNX Runtime: about 390 MB) that
                     transcribes the farmers' voice notes on this machine (docs/voice.md)
  --no-systemd       install the files only: no unit in $UNIT_DIR, no systemctl
  --dry-run          print what would be done and change nothing
  -h, --help         this text
EOF
}

say() { printf '%s\n' "$*"; }
step() {
    STEP=$((STEP + 1))
    printf '[%d/%d] %s\n' "$STEP" "$STEPS" "$*"
}
die() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 2
}
# run CMD...: run it, or print it under --dry-run.
run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '      would run:'
        printf ' %q' "$@"
        printf '\n'
    else
        "$@"
    fi
}
# absolute PATH: PATH made absolute and tidied (no trailing slash, no `..`), symlinks left as they are.
absolute() {
    realpath --canonicalize-missing --no-symlinks -- "$1"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) PREFIX=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --data-dir) DATA_DIR=${2:?--data-dir needs a directory}; shift 2 ;;
        --data-dir=*) DATA_DIR=${1#*=}; shift ;;
        --config-dir) CONFIG_DIR=${2:?--config-dir needs a directory}; shift 2 ;;
        --config-dir=*) CONFIG_DIR=${1#*=}; shift ;;
        --user) RUN_USER=${2:?--user needs a name}; shift 2 ;;
        --user=*) RUN_USER=${1#*=}; shift ;;
        --python) PYTHON=${2:?--python needs a path}; shift 2 ;;
        --python=*) PYTHON=${1#*=}; shift ;;
        --with-opencode) OPENCODE=1; shift ;;
        --without-voice) VOICE=0; shift ;;
        --no-systemd) SYSTEMD=0; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage >&2; die "unknown option: $1" ;;
    esac
done

PREFIX=$(absolute "$PREFIX")
DATA_DIR=$(absolute "$DATA_DIR")
if [ -z "$CONFIG_DIR" ]; then
    if [ "$(id -u)" = 0 ]; then CONFIG_DIR=/etc/farmhost; else CONFIG_DIR=${XDG_CONFIG_HOME:-$HOME/.config}/farmhost; fi
fi
CONFIG_DIR=$(absolute "$CONFIG_DIR")
for path in "$PREFIX" "$DATA_DIR" "$CONFIG_DIR"; do
    case "$path" in
        *[[:space:]%\\\"\']*) die "'$path': paths with spaces, quotes, backslashes or % cannot go into a systemd unit" ;;
    esac
done
# bwrap mounts the prefix (the agents' interpreter) read-only into every sandbox: no data, no secrets in it.
case "$DATA_DIR/" in
    "$PREFIX"/*) die "--data-dir must not be inside --prefix: every agent sandbox sees the prefix" ;;
esac
case "$CONFIG_DIR/" in
    "$PREFIX"/*) die "--config-dir must not be inside --prefix: every agent sandbox sees the prefix, and farmhost.env holds the tokens" ;;
esac
# The unit's ProtectHome=yes hides /home, /root and /run/user from the service.
hidden_from_service() {
    case "$1/" in /home/* | /root/* | /run/user/*) return 0 ;; *) return 1 ;; esac
}
if [ "$SYSTEMD" = 1 ]; then
    for path in "$PREFIX" "$DATA_DIR" "$CONFIG_DIR"; do
        ! hidden_from_service "$path" || die "$path: the service cannot see /home, /root or /run/user (ProtectHome=yes); choose a path elsewhere or pass --no-systemd"
    done
fi

# Who runs the daemon. The daemon must not run as root (agent limits and isolation assume a dedicated user).
IS_ROOT=0
[ "$(id -u)" = 0 ] && IS_ROOT=1
ME=$(id -un)
if [ "$SYSTEMD" = 1 ]; then
    if [ -z "$RUN_USER" ] && [ "$IS_ROOT" = 1 ]; then
        die "refusing to install a root daemon: pass --user NAME (for example --user farmhost; created if missing), or --no-systemd to install only the files"
    fi
    if [ "$IS_ROOT" = 0 ] && [ "$DRY_RUN" = 0 ]; then
        die "installing the systemd unit needs root: run 'sudo $0 --user farmhost ...', or pass --no-systemd"
    fi
fi
RUN_USER=${RUN_USER:-$ME}
if [ "$SYSTEMD" = 1 ] && [ "$RUN_USER" = root ]; then
    die "refusing to install a root daemon: --user must name an unprivileged user (for example farmhost), or pass --no-systemd"
fi
if [ "$SYSTEMD" = 1 ] && [ "$RUN_USER" = nobody ]; then
    die "nobody is shared by unrelated processes (and its RLIMIT_NPROC with them): the service needs a dedicated user, for example --user farmhost"
fi
if [ "$IS_ROOT" = 0 ] && [ "$RUN_USER" != "$ME" ]; then
    die "only root can install for another user ($RUN_USER); run it with sudo or drop --user"
fi

say "farmhost install from $REPO"
say "  prefix      $PREFIX  (command: $PREFIX/bin/farmhost)"
say "  data dir    $DATA_DIR"
say "  settings    $CONFIG_DIR/farmhost.env"
say "  user        $RUN_USER"
[ -d "$PREFIX/opencode" ] && OPENCODE=1  # installed once: kept at the pinned version
say "  opencode    $([ "$OPENCODE" = 1 ] && echo "yes, $PREFIX/opencode" || echo "no (--with-opencode)")"
say "  systemd     $([ "$SYSTEMD" = 1 ] && echo "yes, $UNIT_DIR/farmhost.service" || echo no)"
[ "$DRY_RUN" = 1 ] && say "  dry run: nothing is changed"

# ------------------------------------------------------------------------------------------ 1. prerequisites
step "checking Python, uv and bubblewrap"
if [ -z "$PYTHON" ]; then
    if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=$(command -v python3 || true); fi
fi
[ -n "$PYTHON" ] && [ -x "$PYTHON" ] || die "no python3 found; install it (apt-get install python3) or pass --python"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$PYTHON is Python $("$PYTHON" -c 'import platform; print(platform.python_version())'); farmhost needs 3.11+"
BASE_PREFIX=$("$PYTHON" -c 'import sys; print(sys.base_prefix)')
if [ "$SYSTEMD" = 1 ] && hidden_from_service "$BASE_PREFIX"; then
    die "$PYTHON lives in $BASE_PREFIX, which the service cannot see (ProtectHome=yes); use the system's python3 (--python /usr/bin/python3)"
fi
say "      python: $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
if ! command -v bwrap >/dev/null 2>&1; then
    say "      note: bubblewrap is not installed; agent runs need it: apt-get install bubblewrap"
fi

# uv: the version the Makefile pins; the checkout's own (.tools/bin/uv from `make`) when it is that version,
# else a throw-away copy installed with pip (removed at exit).
UV_VERSION=$(sed -n 's/^UV_VERSION ?= *//p' "$REPO/Makefile")
[ -n "$UV_VERSION" ] || die "cannot read UV_VERSION from $REPO/Makefile"
UV=$REPO/.tools/bin/uv
if ! { [ -x "$UV" ] && "$UV" --version 2>/dev/null | grep -qx "uv $UV_VERSION.*"; }; then
    UV=
    if command -v uv >/dev/null 2>&1 && uv --version | grep -qx "uv $UV_VERSION.*"; then
        UV=$(command -v uv)
    fi
fi
BOOTSTRAP=
cleanup() { [ -z "$BOOTSTRAP" ] || rm -rf "$BOOTSTRAP"; }
trap cleanup EXIT
if [ -z "$UV" ]; then
    if [ "$DRY_RUN" = 1 ]; then
        say "      would install uv $UV_VERSION with pip into a temporary directory"
        UV=uv
    else
        BOOTSTRAP=$(mktemp -d)
        say "      installing uv $UV_VERSION (pip, into $BOOTSTRAP)"
        "$PYTHON" -m venv "$BOOTSTRAP" || die "$PYTHON -m venv failed: apt-get install python3-venv"
        "$BOOTSTRAP/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION"
        UV=$BOOTSTRAP/bin/uv
    fi
fi
say "      uv: $UV"

# ------------------------------------------------------------------------------------------ 2. the user
step "the daemon's user: $RUN_USER"
if id -u "$RUN_USER" >/dev/null 2>&1; then
    say "      exists (uid $(id -u "$RUN_USER"))"
else
    [ "$IS_ROOT" = 1 ] || [ "$DRY_RUN" = 1 ] || die "user $RUN_USER does not exist"
    say "      creating system user $RUN_USER (home $DATA_DIR, no login shell)"
    run useradd --system --user-group --home-dir "$DATA_DIR" --no-create-home --shell /usr/sbin/nologin "$RUN_USER"
fi
RUN_GROUP=$(id -gn "$RUN_USER" 2>/dev/null || echo "$RUN_USER")

# ------------------------------------------------------------------------------------------ 3. the virtualenv
step "installing farmhost and farmagent into $PREFIX (uv.lock, no dev tools)"
if [ -e "$PREFIX" ] && [ ! -f "$PREFIX/pyvenv.cfg" ] && [ -n "$(ls -A "$PREFIX" 2>/dev/null)" ]; then
    die "$PREFIX exists and is not a farmhost virtualenv; choose another --prefix or empty it"
fi
export UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1 UV_PROJECT_ENVIRONMENT="$PREFIX"
if [ ! -f "$PREFIX/pyvenv.cfg" ]; then
    run "$UV" venv --quiet --python "$PYTHON" "$PREFIX"
fi
# farmhost is installed editable from a copy of the sources in PREFIX/src, as in a checkout (the exact versions of
# uv.lock; a wheel would resolve its own): the starting dashboards and the global memory are seeded from there. The copy is swapped in whole.
SOURCES=(pyproject.toml uv.lock README.md LICENSE hatch_build.py farmhost container/pyproject.toml
    container/README.md container/farmagent dashboards memory)
if [ "$DRY_RUN" = 1 ]; then
    say "      would copy ${SOURCES[*]} to $PREFIX/src"
else
    rm -rf "$PREFIX/src.new" "$PREFIX/src.old"
    mkdir -p "$PREFIX/src.new"
    tar -C "$REPO" --exclude=__pycache__ --exclude='*.pyc' -cf - "${SOURCES[@]}" | tar -C "$PREFIX/src.new" -xf -
    [ ! -d "$PREFIX/src" ] || mv "$PREFIX/src" "$PREFIX/src.old"
    mv "$PREFIX/src.new" "$PREFIX/src"
    rm -rf "$PREFIX/src.old"
fi
# Bytecode compiled now: bwrap mounts the prefix read-only, so an agent could never write it (UV_COMPILE_BYTECODE
# does site-packages, compileall the editable sources).
# The voice extra unless --without-voice: a later run without it removes it again (the prefix follows the lock).
EXTRAS=()
[ "$VOICE" = 0 ] || EXTRAS=(--extra voice)
run "$UV" sync --quiet --frozen --no-dev "${EXTRAS[@]}" --directory "$PREFIX/src"
run "$PREFIX/bin/python" -m compileall -q "$PREFIX/src/farmhost" "$PREFIX/src/container/farmagent"
[ "$DRY_RUN" = 1 ] || say "      $("$PREFIX/bin/farmhost" --version)"

# ------------------------------------------------------------------------------------------ 4. OpenCode
# The binary of the npm package opencode-ai at the version farmhost/agents/kinds.py pins, where an installed
# farmhost looks for it (PREFIX/opencode, next to the interpreter; bwrap mounts it read-only into runs of kind
# opencode). The checkout's own copy (`make opencode`) when it is that version, else scripts/opencode-install (npm).
step "OpenCode"
OPENCODE_VERSION=$(sed -n 's/^OPENCODE_VERSION: Final = "\(.*\)".*/\1/p' "$REPO/farmhost/agents/kinds.py")
[ -n "$OPENCODE_VERSION" ] || die "cannot read OPENCODE_VERSION from $REPO/farmhost/agents/kinds.py"
# has_opencode DIR: DIR holds opencode-ai at the pinned version and the binary of this machine.
has_opencode() {
    grep -q "\"version\": \"$OPENCODE_VERSION\"" "$1/node_modules/opencode-ai/package.json" 2>/dev/null \
        && [ -x "$1/node_modules/opencode-linux-$NPM_ARCH/bin/opencode" ]
}
case "$(uname -m)" in
    x86_64) NPM_ARCH=x64 ;;
    aarch64) NPM_ARCH=arm64 ;;
    *) NPM_ARCH= ;;
esac
if [ "$OPENCODE" = 0 ]; then
    say "      not installed (--with-opencode installs OpenCode $OPENCODE_VERSION for agents of kind opencode)"
elif [ -z "$NPM_ARCH" ]; then
    die "OpenCode has no prebuilt binary for $(uname -m); leave out --with-opencode"
elif has_opencode "$PREFIX/opencode"; then
    say "      OpenCode $OPENCODE_VERSION kept ($PREFIX/opencode)"
elif has_opencode "$REPO/.tools/opencode"; then
    say "      OpenCode $OPENCODE_VERSION from $REPO/.tools/opencode (this checkout's, make opencode)"
    run rm -rf "$PREFIX/opencode.new"
    run mkdir -p "$PREFIX/opencode.new/node_modules"
    run cp -a "$REPO/.tools/opencode/node_modules/opencode-ai" "$REPO/.tools/opencode/node_modules/opencode-linux-$NPM_ARCH" \
        "$PREFIX/opencode.new/node_modules/"
    run rm -rf "$PREFIX/opencode"
    run mv "$PREFIX/opencode.new" "$PREFIX/opencode"
else
    command -v npm >/dev/null 2>&1 || die "--with-opencode needs npm (apt-get install npm), or run 'make opencode' in $REPO first"
    say "      OpenCode $OPENCODE_VERSION from npm (about 190 MB)"
    run "$REPO/scripts/opencode-install" "$PREFIX/opencode"
fi
if [ "$OPENCODE" = 1 ] && [ "$DRY_RUN" = 0 ]; then
    say "      $PREFIX/opencode/node_modules/opencode-linux-$NPM_ARCH/bin/opencode"
fi

# ------------------------------------------------------------------------------------------ 5. settings
step "settings file $CONFIG_DIR/farmhost.env"
run mkdir -p "$CONFIG_DIR"
if [ -e "$CONFIG_DIR/farmhost.env" ]; then
    say "      kept (the current template is farmhost.env.example next to it)"
else
    say "      written from .env.example: every line is commented out; set HA_URL, HA_TOKEN, the LLM, TZ there"
    run install -m 0640 "$REPO/.env.example" "$CONFIG_DIR/farmhost.env"
    if [ "$IS_ROOT" = 1 ]; then run chown "root:$RUN_GROUP" "$CONFIG_DIR/farmhost.env"; fi
fi
run install -m 0644 "$REPO/.env.example" "$CONFIG_DIR/farmhost.env.example"

# ------------------------------------------------------------------------------------------ 6. data directory
step "data directory $DATA_DIR"
if [ "$IS_ROOT" = 1 ]; then
    run install -d -o "$RUN_USER" -g "$RUN_GROUP" -m 0750 "$DATA_DIR"
    AS_USER=(runuser -u "$RUN_USER" --)
    [ "$RUN_USER" != root ] || AS_USER=()
else
    run install -d -m 0750 "$DATA_DIR"
    AS_USER=()
fi
# From /, with a clean environment: no stray .env or FARMHOST_* of this shell ends up in the data directory.
(cd / && run "${AS_USER[@]}" env -i PATH=/usr/bin:/bin "$PREFIX/bin/farmhost" init --data-dir "$DATA_DIR" | sed -n 's/^/      /; 1p')

# ------------------------------------------------------------------------------------------ 7. systemd unit
step "systemd unit"
UNIT=$PREFIX/share/farmhost/farmhost.service
render_unit() {
    "$PYTHON" - "$REPO/deploy/systemd/farmhost.service" "$PREFIX" "$DATA_DIR" "$CONFIG_DIR" "$RUN_USER" "$RUN_GROUP" <<'EOF'
import re
import sys

template, prefix, data_dir, config_dir, user, group = sys.argv[1:]
text = open(template, encoding="utf-8").read()
paths = {"/opt/farmhost": prefix, "/var/lib/farmhost": data_dir, "/etc/farmhost": config_dir}
text = re.sub("|".join(map(re.escape, paths)), lambda m: paths[m.group(0)], text)
text = re.sub(r"^User=farmhost$", f"User={user}", text, flags=re.M)
text = re.sub(r"^Group=farmhost$", f"Group={group}", text, flags=re.M)
sys.stdout.write(text)
EOF
}
if [ "$DRY_RUN" = 1 ]; then
    say "      would write $UNIT (paths and user filled in)"
else
    mkdir -p "$(dirname "$UNIT")"
    render_unit >"$UNIT.tmp"
    mv "$UNIT.tmp" "$UNIT"
    say "      $UNIT"
    if command -v systemd-analyze >/dev/null 2>&1; then
        systemd-analyze verify "$UNIT" 2>&1 | sed 's/^/      systemd-analyze: /' || true
    fi
fi
if [ "$SYSTEMD" = 1 ]; then
    run install -m 0644 "$UNIT" "$UNIT_DIR/farmhost.service"
    if [ -d /run/systemd/system ]; then
        run systemctl daemon-reload
        run systemctl enable farmhost.service
        if systemctl is-active --quiet farmhost.service; then
            say "      restarting the running service on the new version"
            run systemctl restart farmhost.service
        fi
    else
        say "      systemd is not running here: the unit is installed but not enabled"
    fi
else
    say "      not installed (--no-systemd); to use it: install -m 0644 $UNIT $UNIT_DIR/"
fi

# ------------------------------------------------------------------------------------------ 8. check
step "checking the install (farmhost doctor, without the settings file)"
if [ "$DRY_RUN" = 0 ]; then
    (cd / && "${AS_USER[@]}" env -i PATH=/usr/bin:/bin "$PREFIX/bin/farmhost" doctor --data-dir "$DATA_DIR" \
        | sed 's/^/      /') || say "      (doctor reports something broken above; fix it before starting)"
fi

say ""
say "done. Next:"
say "  1. edit $CONFIG_DIR/farmhost.env (HA_URL, HA_TOKEN, TELEGRAM_BOT_TOKEN, FARMHOST_LLM_*, TZ)"
say "  2. register the main chat: ${AS_USER[*]:+${AS_USER[*]} }$PREFIX/bin/farmhost group add --data-dir $DATA_DIR --jid telegram:<chat id> --name 'Farm office' --folder main --main"
if [ "$SYSTEMD" = 1 ]; then
    say "  3. sudo systemctl start farmhost && journalctl -u farmhost -f"
else
    say "  3. run it: ${AS_USER[*]:+${AS_USER[*]} }$PREFIX/bin/farmhost run --data-dir $DATA_DIR   (settings from the environment or ./.env)"
fi

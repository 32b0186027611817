# Sourced by the other scripts: create or reuse ./.venv with the project installed in it.
# It leaves the working directory as it was: a script that wants the repository's (test.sh)
# changes to "$ROOT" itself; train.sh keeps the user's, for the paths they give it.
# Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VIT_VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[vit] creating virtual environment in $VENV"
    "$PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.vit-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
    echo "[vit] installing the project and its dependencies into $VENV (first time: a few minutes)"
    LOG="$VENV/pip-install.log"
    if ! "$VENV/bin/python" -m pip install -e "$ROOT[dev]" > "$LOG" 2>&1; then
        tail -n 40 "$LOG"
        echo "[vit] installation failed; the whole pip output is in $LOG" >&2
        exit 1
    fi
    echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"

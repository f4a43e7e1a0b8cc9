# Sourced by scripts/serve and scripts/test: make ./.venv with the project installed.
# Idempotent and quick when nothing changed (a stamp of pyproject.toml's hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MAXQ_VENV:-$ROOT/.venv}"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "MaxQ-Raft needs Python 3.11 or newer ($PY is $("$PY" --version 2>&1))" >&2
  exit 1
fi
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
STAMP="$VENV/.maxq-installed${EXTRAS:+-$EXTRAS}"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  echo "installing MaxQ-Raft${EXTRAS:+ with [$EXTRAS]} into $VENV ..." >&2
  LOG="$VENV/install.log"
  if ! { "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip &&
         "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$ROOT${EXTRAS:+[$EXTRAS]}"; } >"$LOG" 2>&1; then
    cat "$LOG" >&2
    echo "install failed (log above, also in $LOG)" >&2
    exit 1
  fi
  echo "$WANT" > "$STAMP"
fi

#!/usr/bin/env bash
# Build `.venv-traces`: the trace server the tracing tests start (MLflow's tracking server, which
# takes OTLP/HTTP spans and keeps their links), from locks/trace-server.txt with hashes checked.
# Its own venv: its pins (SQLAlchemy, Flask, pandas, ...) stay out of Ferry's.
#
# Idempotent: a stamp holding the lock is compared first, so a second run costs nothing.
set -euo pipefail

cd "$(dirname "$0")/.."
VENV=${TRACES_VENV:-.venv-traces}
LOCK=locks/trace-server.txt
STAMP="$VENV/.ferry-trace-server"
UV=${UV:-.venv/bin/uv}

if [ -f "$STAMP" ] && cmp -s "$LOCK" "$STAMP" && [ -f "$VENV/empty-store.db" ]; then
    exit 0
fi
test -x "$VENV/bin/python" || "$UV" venv -q --python .venv/bin/python "$VENV"
"$UV" pip sync -q --python "$VENV/bin/python" "$LOCK"
# An empty store with every migration applied (~30 s of CPU): each test session starts from a
# copy of it instead of migrating a new one.
rm -f "$VENV/empty-store.db"
"$VENV/bin/mlflow" db upgrade "sqlite:///$PWD/$VENV/empty-store.db" >/dev/null 2>&1
cp "$LOCK" "$STAMP"

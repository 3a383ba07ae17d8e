"""Every validation error: a clear message, and nothing written."""

from __future__ import annotations

import math
import re

import pytest

from amfs_server.core.errors import ValidationError
from amfs_server.core.models import Actor
from amfs_server.core.service import MemoryService, ServiceConfig, WriteRequest


@pytest.mark.parametrize(
    ("entity_path", "message"),
    [
        ("", "non-empty"),
        ("a//b", "empty segment"),
        ("/a", "empty segment"),
        ("a/", "empty segment"),
        ("a/../b", "relative segments"),
        ("a/./b", "relative segments"),
        ("a b", "invalid segment"),
        ("checkout\n", "invalid segment"),  # `$` alone would let a final newline through: a look-alike entry
        ("a/b\n", "invalid segment"),
        ("x" * 256, "limit is 255"),
        ("a/" + "y" * 65, "limit is 64"),
        (42, "non-empty string"),
    ],
)
async def test_bad_entity_paths_are_refused_and_nothing_is_written(
    service: MemoryService, actor: Actor, entity_path: object, message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        await service.write(actor, WriteRequest(entity_path, "k", "v"))  # type: ignore[arg-type]
    assert await service.list() == []


@pytest.mark.parametrize(
    ("request_kwargs", "message"),
    [
        ({"key": ""}, "non-empty"),
        ({"key": "a/b"}, "contains '/'"),
        ({"key": "k" * 129}, "limit is 128"),
        ({"key": ".."}, "relative"),
        ({"key": "retry-pattern\n"}, "invalid"),
        ({"value": {1, 2}}, "JSON-serializable"),
        ({"value": math.nan}, "JSON-serializable"),
        ({"value": object()}, "JSON-serializable"),
        ({"confidence": -0.1}, "between 0 and 100"),
        ({"confidence": math.inf}, "between 0 and 100"),
        ({"confidence": 1.7e308}, "between 0 and 100"),
        ({"confidence": 100.01}, "between 0 and 100"),
        ({"confidence": "high"}, "number"),
        ({"memory_type": "opinion"}, "memory_type"),
        ({"ttl_seconds": 0}, "future"),
        ({"ttl_seconds": -5}, "future"),
        ({"ttl_seconds": 1e12}, "at most 3153600000"),
        ({"importance_score": 1.5}, "between 0.0 and 1.0"),
        ({"importance_dimensions": {"x": 2}}, "importance_dimensions"),
    ],
)
async def test_bad_writes_are_refused_with_the_reason(
    service: MemoryService, actor: Actor, request_kwargs: dict, message: str
) -> None:
    fields = {"entity_path": "svc", "key": "k", "value": "v", **request_kwargs}
    with pytest.raises(ValidationError, match=message):
        await service.write(actor, WriteRequest(**fields))
    assert await service.list() == []


async def test_value_size_limit_is_configurable_and_enforced(store, actor: Actor) -> None:
    small = MemoryService(store, ServiceConfig(max_value_bytes=100))
    await small.open()
    with pytest.raises(ValidationError, match="limit is 100"):
        await small.write(actor, WriteRequest("svc", "big", "x" * 200))
    await small.write(actor, WriteRequest("svc", "fits", "x" * 50))
    assert [e.key for e in await small.list()] == ["fits"]


async def test_default_value_limit_is_one_mebibyte(service: MemoryService, actor: Actor) -> None:
    with pytest.raises(ValidationError, match="limit is 1048576"):
        await service.write(actor, WriteRequest("svc", "big", "x" * (1024 * 1024)))


async def test_bulk_write_with_one_bad_request_writes_nothing(service: MemoryService, actor: Actor) -> None:
    with pytest.raises(ValidationError):
        await service.write_many(actor, [WriteRequest("svc", "ok", 1), WriteRequest("svc", "bad/key", 2)])
    assert await service.list() == []


async def test_confidence_above_one_is_allowed(service: MemoryService, actor: Actor) -> None:
    entry = await service.write(actor, WriteRequest("svc", "risk-x", "v", confidence=1.7))
    assert entry.confidence == 1.7


def test_a_lone_surrogate_is_found_in_any_string_key_or_value_and_named_by_where_it_is() -> None:
    from amfs_server.core.validation import refuse_lone_surrogates

    refuse_lone_surrogates({"note": ["fine", "caf\u00e9 \U0001F600"], "n": 1.5}, "value")  # astral text is text
    for value, where in [("x\ud800", "value"), ({"a": ["ok", {"b": "\udfff"}]}, "value.a[1].b"),
                         ({"\ud800": 1}, "value (a key)"), (("ok", "\udc00"), "value[1]"),
                         ({"\ud800": "\udc00"}, "value (a key)"), ({"a\nb": "\udc00"}, "value['a\\nb']")]:
        with pytest.raises(ValidationError, match=rf"^{re.escape(where)} holds a lone surrogate"):
            refuse_lone_surrogates(value, "value")

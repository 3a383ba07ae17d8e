"""`commit_outcome` in the SDK says when an outcome_ref was already applied, as the MCP tool does."""

from __future__ import annotations

from amfs_server import AgentMemory, MemoryEntry, OutcomeType


def test_committing_the_same_outcome_ref_twice_reports_already_applied_and_changes_nothing(tmp_path) -> None:
    with AgentMemory(agent_id="agent/sdk", data_dir=tmp_path, embedder="none") as mem:
        mem.write("checkout-service", "retry-pattern", "exponential backoff", confidence=0.85)
        mem.read("checkout-service", "retry-pattern")
        first = mem.commit_outcome("INC-1", OutcomeType.CRITICAL_FAILURE)
        (entry,) = first  # still the documented list of updated entries
        assert isinstance(entry, MemoryEntry) and first.already_applied is False and first.outcome_ref == "INC-1"
        again = mem.commit_outcome("INC-1", OutcomeType.CRITICAL_FAILURE)
        assert again.already_applied is True and [e.confidence for e in again] == [entry.confidence]
        assert mem.read("checkout-service", "retry-pattern").confidence == entry.confidence
        assert mem.commit_outcome_record("INC-1", OutcomeType.SUCCESS).already_applied is True

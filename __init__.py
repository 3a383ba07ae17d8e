"""amfs-server: an MCP memory server whose memories learn from real outcomes.

The public Python API: `AgentMemory` (sync) and `AsyncAgentMemory`, the enums and the errors.
"""

from .core.errors import AmfsError, ConflictError, NotFoundError, StoreError, ValidationError
from .core.models import MemoryEntry, MemoryType, OutcomeRecord, OutcomeType, ProvenanceTier, Tier
from .sdk import AgentMemory, AsyncAgentMemory

__version__ = "0.2.0"

__all__ = [
    "AgentMemory",
    "AsyncAgentMemory",
    "MemoryEntry",
    "MemoryType",
    "OutcomeRecord",
    "OutcomeType",
    "ProvenanceTier",
    "Tier",
    "AmfsError",
    "ConflictError",
    "NotFoundError",
    "StoreError",
    "ValidationError",
]

"""amfs-server: an MCP memory server whose memories learn from real outcomes.

The public Python API: `AgentMemory` (sync) and `AsyncAgentMemory`, `WriteRequest` (for `write_many`), the enums
and the errors.
"""

from .core.errors import AmfsError, ConflictError, NotFoundError, StoreError, ValidationError
from .core.models import AMFS_VERSION as __version__
from .core.models import MemoryEntry, MemoryType, OutcomeRecord, OutcomeType, ProvenanceTier, Tier
from .core.service import WriteRequest
from .sdk import AgentMemory, AsyncAgentMemory

__all__ = [
    "AgentMemory",
    "AsyncAgentMemory",
    "MemoryEntry",
    "MemoryType",
    "OutcomeRecord",
    "OutcomeType",
    "ProvenanceTier",
    "Tier",
    "WriteRequest",
    "AmfsError",
    "ConflictError",
    "NotFoundError",
    "StoreError",
    "ValidationError",
]

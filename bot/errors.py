"""Domain errors a caller can act on. Each message says how to fix the problem.

Translated at the edges: the CLI turns them into exit codes and one line on stderr; the responder
turns ``LLMUnavailable`` into a short apology that is never stored as something the model said.
"""

from __future__ import annotations


class MeshsageError(Exception):
    """Base class; ``str(err)`` is a complete, user-facing sentence with the fix."""

    exit_code = 1


class ConfigError(MeshsageError):
    exit_code = 2


class StorageError(MeshsageError):
    exit_code = 3


class DiskFull(StorageError):
    """The state directory's file system has no space left (exit code 28, like ENOSPC)."""

    exit_code = 28


class LLMUnavailable(MeshsageError):
    """Every configured endpoint failed (timeout, refused, 5xx, empty answer, missing model)."""

    exit_code = 4


class TransportError(MeshsageError):
    exit_code = 5


class EmbeddingUnavailable(MeshsageError):
    """The embedding server failed (timeout, refused, 5xx, missing model, malformed vectors).

    Never fatal to a turn: retrieval falls back to words and the indexer catches up later.
    """

    exit_code = 6


class MemoryRefused(MeshsageError):
    """A memory operation refused as a whole, nothing written: an import whose ids or
    conversations are taken, or a link that cannot be made (already linked, not a DM)."""

    exit_code = 1

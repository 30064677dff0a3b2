"""Message vectors in memory: float32 packing and a bounded per-conversation matrix cache.

Invariants:
- On disk a vector is float32 little-endian (``pack``/``unpack``), whatever the platform.
- A ``VectorMatrix`` holds one conversation's vectors of one model, unit length, ordered by
  message id, so an id range (reset mark .. recent window) is a slice found by binary search
  and scoring it is one matrix-vector product.
- The cache only ever holds what the database holds: its owner extends a matrix when vectors
  are appended in id order and drops it on anything else (replacements, deletes, writes by
  another connection). It is bounded by bytes and evicts the least recently used matrix.
- numpy is imported on first use, not at import: the store imports this module, and a bot
  without ``memory.embeddings`` (the default) never loads numpy (15 MB of RSS on a Pi). numpy
  comes with the ``embeddings`` extra.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    FloatArray = npt.NDArray[np.float32]
    IdArray = npt.NDArray[np.int64]

F32 = "<f4"  # float32, little-endian on disk
CACHE_BYTES = 64 * 1024 * 1024  # ~4 conversations of 6,000 nomic (768-d) vectors


def as_vectors(rows: Sequence[Sequence[float]] | Sequence[float]) -> FloatArray:
    """A float32 matrix (or one vector) from Python numbers."""
    import numpy as np

    return np.asarray(rows, dtype=np.float32)


def pack(vector: Sequence[float] | FloatArray) -> bytes:
    import numpy as np

    return np.asarray(vector, dtype=F32).tobytes()


def unpack(blob: bytes) -> FloatArray:
    import numpy as np

    return np.frombuffer(blob, dtype=F32).astype(np.float32)


def unit(matrix: FloatArray) -> FloatArray:
    """Rows scaled to unit length (zero rows stay zero)."""
    import numpy as np

    norms = np.linalg.norm(matrix, axis=-1, keepdims=True)
    out: FloatArray = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    return out


class VectorMatrix:
    def __init__(self, *, model: str, ids: IdArray, data: FloatArray) -> None:
        self.model = model
        self.dim = int(data.shape[1])
        self._n = len(ids)
        self._ids = ids
        self._data = data

    @classmethod
    def from_rows(cls, model: str, rows: Iterable[Sequence[Any]]) -> VectorMatrix | None:
        """From (message_id, dim, blob) rows in id order; rows of another dimension than the
        newest are skipped (a model served with a different size). None when there are none."""
        import numpy as np

        rows = list(rows)
        if not rows:
            return None
        dim = int(rows[-1][1])
        kept = [r for r in rows if int(r[1]) == dim]
        ids = np.fromiter((int(r[0]) for r in kept), dtype=np.int64, count=len(kept))
        data = np.frombuffer(b"".join(r[2] for r in kept), dtype=F32).reshape(len(kept), dim)
        return cls(model=model, ids=ids, data=unit(data.astype(np.float32)))

    @property
    def size(self) -> int:
        return self._n

    @property
    def last_id(self) -> int:
        return int(self._ids[self._n - 1]) if self._n else 0

    @property
    def nbytes(self) -> int:
        return int(self._data.nbytes + self._ids.nbytes)

    def can_append(self, ids: Sequence[int], dim: int) -> bool:
        return (
            dim == self.dim
            and bool(ids)
            and ids[0] > self.last_id
            and all(a < b for a, b in pairwise(ids))
        )

    def append(self, ids: Sequence[int], vectors: FloatArray) -> None:
        """Add rows newer than every row held (checked by ``can_append``); grows by doubling."""
        import numpy as np

        k = len(ids)
        if self._n + k > len(self._ids):
            cap = max(2 * len(self._ids), self._n + k, 64)
            new_ids = np.empty(cap, dtype=np.int64)
            new_data = np.empty((cap, self.dim), dtype=np.float32)
            new_ids[: self._n] = self._ids[: self._n]
            new_data[: self._n] = self._data[: self._n]
            self._ids, self._data = new_ids, new_data
        self._ids[self._n : self._n + k] = ids
        self._data[self._n : self._n + k] = unit(vectors.astype(np.float32))
        self._n += k

    def search(
        self, query: FloatArray, *, after_id: int, before_id: int, limit: int
    ) -> list[tuple[int, float]]:
        """(message id, cosine) best first for ids in (after_id, before_id)."""
        import numpy as np

        if limit <= 0 or query.shape != (self.dim,):
            return []
        ids = self._ids[: self._n]
        lo = int(np.searchsorted(ids, after_id, side="right"))
        hi = int(np.searchsorted(ids, before_id, side="left"))
        if hi <= lo:
            return []
        scores = self._data[lo:hi] @ query
        if limit < len(scores):
            top = np.argpartition(-scores, limit - 1)[:limit]
        else:
            top = np.arange(len(scores))
        top = top[np.lexsort((-ids[lo:hi][top], -scores[top]))]  # ties: newer first
        return [(int(ids[lo + i]), float(scores[i])) for i in top]


class VectorCache:
    """Least recently used matrices by conversation id, at most ``max_bytes`` in all."""

    def __init__(self, *, max_bytes: int = CACHE_BYTES) -> None:
        self._max = max_bytes
        self._items: OrderedDict[int, VectorMatrix] = OrderedDict()

    def get(self, conversation_id: int, model: str) -> VectorMatrix | None:
        matrix = self._items.get(conversation_id)
        if matrix is None or matrix.model != model:
            return None
        self._items.move_to_end(conversation_id)
        return matrix

    def put(self, conversation_id: int, matrix: VectorMatrix) -> None:
        self._items[conversation_id] = matrix
        self._items.move_to_end(conversation_id)
        self._shrink()

    def added(
        self, conversation_id: int, *, model: str, ids: Sequence[int], vectors: FloatArray
    ) -> None:
        """Vectors were stored for ``ids`` (ascending): extend the matrix, or drop it when they
        are not all newer than what it holds (a backfill, a replacement, another model)."""
        matrix = self._items.get(conversation_id)
        if matrix is None:
            return
        if matrix.model == model and matrix.can_append(ids, int(vectors.shape[1])):
            matrix.append(ids, vectors)
            self._shrink()
        else:
            del self._items[conversation_id]

    def drop(self, conversation_ids: Iterable[int]) -> None:
        for cid in conversation_ids:
            self._items.pop(cid, None)

    def clear(self) -> None:
        self._items.clear()

    def _shrink(self) -> None:
        total = sum(m.nbytes for m in self._items.values())
        while total > self._max and len(self._items) > 1:
            _cid, oldest = self._items.popitem(last=False)
            total -= oldest.nbytes

    def __contains__(self, conversation_id: int) -> bool:
        return conversation_id in self._items

    def __len__(self) -> int:
        return len(self._items)

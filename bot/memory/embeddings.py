"""The embedding port and its OpenAI-compatible adapter (Ollama, llama.cpp, vLLM, OpenAI).

Invariants:
- ``Embedder.embed`` returns one vector per input text, in order, every vector L2-normalised
  (so a dot product is the cosine similarity) and of one dimension; an empty input returns
  ``[]`` without a request.
- Every failure ends as ``EmbeddingUnavailable`` (no openai exception leaves this module); its
  message names the server and the model, never the texts (they are people's messages).
- Each request has explicit connect and read timeouts and an overall deadline. The openai
  client's own retries are off; a refused connection or a 5xx gets one retry after a short
  jittered pause, a timeout gets none (its time is already spent, and the query is embedded
  on the reply path).
- Importing this module loads no ``openai`` (about 0.5 s and 45 MB): retrieval imports the
  port, and the package is imported when the first adapter is built.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from bot.config import EmbeddingsConfig, Endpoint
from bot.errors import EmbeddingUnavailable

log = logging.getLogger("bot.memory.embeddings")

PLACEHOLDER_KEY = "not-needed"
RETRY_PAUSE = 0.25  # seconds before the one retry (jittered)


class Embedder(Protocol):
    model: str

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit-length vector per text, in order. Raises ``EmbeddingUnavailable``."""
        ...


def normalise(vector: Sequence[float]) -> list[float]:
    """``vector`` scaled to unit length (a zero vector stays zero: it matches nothing)."""
    norm = math.sqrt(math.fsum(x * x for x in vector))
    if norm == 0.0:
        return [0.0] * len(vector)
    return [x / norm for x in vector]


class OpenAICompatEmbedder:
    """``/v1/embeddings`` on the configured server (``memory.embeddings``, else ``llm``)."""

    def __init__(
        self,
        *,
        config: EmbeddingsConfig,
        llm: Endpoint,
        env: Mapping[str, str],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.model = config.model
        self._config = config
        self._sleep = sleep
        self.base_url, key_env = config.endpoint(llm)
        import openai  # here: the openai package costs 0.5 s and ~45 MB; retrieval needs none

        self._client = openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=(env.get(key_env) if key_env else None) or PLACEHOLDER_KEY,
            timeout=openai.Timeout(
                config.read_timeout,
                connect=config.connect_timeout,
                write=config.connect_timeout,
                pool=config.connect_timeout,
            ),
            max_retries=0,
        )

    async def close(self) -> None:
        await self._client.close()

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        out: list[list[float]] = []
        step = self._config.batch
        for start in range(0, len(texts), step):
            out.extend(await self._batch(list(texts[start : start + step])))
        return out

    async def _batch(self, texts: list[str]) -> list[list[float]]:
        import openai  # loaded by __init__ already

        for attempt in range(2):
            if attempt:
                await self._sleep(RETRY_PAUSE * random.uniform(0.5, 1.0))
            try:
                return await self._request(texts)
            except (openai.APITimeoutError, TimeoutError) as exc:
                raise self._unavailable(exc) from None
            except (openai.APIConnectionError, openai.InternalServerError) as exc:
                if attempt:
                    raise self._unavailable(exc) from None
                log.debug("embedding request failed, retrying once: %s", _describe(exc))
            except (openai.APIError, _Malformed) as exc:
                raise self._unavailable(exc) from None
        raise AssertionError("unreachable")

    async def _request(self, texts: list[str]) -> list[list[float]]:
        deadline = self._config.connect_timeout + self._config.read_timeout
        async with asyncio.timeout(deadline):
            resp = await self._client.embeddings.create(
                model=self.model, input=texts, encoding_format="float"
            )
        data = sorted(resp.data or [], key=lambda d: d.index)
        if len(data) != len(texts):
            raise _Malformed(f"{len(data)} vectors for {len(texts)} texts")
        vectors: list[list[float]] = []
        for item in data:
            vec = item.embedding
            if not isinstance(vec, list) or not vec:
                raise _Malformed("an empty or non-list vector")
            if not all(isinstance(x, int | float) and math.isfinite(x) for x in vec):
                raise _Malformed("a vector with non-finite or non-numeric values")
            if vectors and len(vec) != len(vectors[0]):
                raise _Malformed("vectors of different lengths")
            vectors.append(normalise(vec))
        return vectors

    def _unavailable(self, exc: BaseException) -> EmbeddingUnavailable:
        import openai  # loaded by __init__ already

        hint = (
            f"check that the server is running and has the model (`ollama pull {self.model}`)"
            if not isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError)
            else "set the API key in the variable named by memory.embeddings.api_key_env"
        )
        return EmbeddingUnavailable(
            f"embeddings from {self.base_url} ({self.model}) failed: {_describe(exc)}. "
            f"Fix: {hint}, or set memory.embeddings.enabled: false."
        )


class _Malformed(Exception):
    pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, _Malformed):
        return f"malformed answer ({exc})"
    from bot.llm.openai_compat import describe_error

    return describe_error(exc)

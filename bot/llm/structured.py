"""Structured output: how a JSON schema travels to each kind of OpenAI-compatible server.

Servers spell "answer with JSON of this shape" differently, and say so only by refusing:
- ``json_schema``: ``response_format: {"type": "json_schema", "json_schema": {...}}`` (OpenAI,
  vLLM, llama.cpp's llama-server, Ollama's ``/v1`` since 0.5);
- ``json_object``: ``response_format: {"type": "json_object", "schema": {...}}`` (the
  llama-cpp-python server, which refuses ``json_schema`` with a validation error, and
  llama-server, which takes both; the server turns the schema into a grammar);
- ``plain``: no ``response_format`` at all (a server that refuses both): the caller's own
  parsing of free text is all there is.

Invariants:
- Modes are tried in ``MODES`` order, per endpoint; a mode the server refused (``rejected``)
  is not tried again on that endpoint while the process runs, so a refusal costs one request
  once, and a request never fails because the server lacks structured output.
- ``rejected`` reads only the status and the server's message (no prompt text).
"""

from __future__ import annotations

import re
from typing import Any

from bot.llm.port import JsonSchema

MODES = ("json_schema", "json_object", "plain")
SCHEMA_NAME = "answer"
# A tiny request that learns a server's mode before a real prompt is sent in it
# (bot.llm.openai_compat): a refusal then never costs an evaluation of the real prompt.
PROBE_MARK = "(meshsage asks which structured output this server takes) "
PROBE_MESSAGES = [{"role": "user", "content": PROBE_MARK + "Answer with a JSON object."}]
_REFUSAL = re.compile(
    r"response_format|json_schema|json_object|literal_error|schema|grammar|unsupported|"
    r"not supported|extra_forbidden|unexpected keyword",
    re.IGNORECASE,
)


def request_fields(mode: str, schema: JsonSchema | None) -> dict[str, Any]:
    """The extra request body fields for ``mode`` (nothing without a schema or in ``plain``)."""
    if schema is None or mode == "plain":
        return {}
    if mode == "json_schema":
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": SCHEMA_NAME, "schema": dict(schema)},
            }
        }
    return {"response_format": {"type": "json_object", "schema": dict(schema)}}


def rejected(status: int | None, server_message: str) -> bool:
    """True when an error answer means "this server does not take that response_format"
    (HTTP 400/422, or 500 from a validating server, naming the field), not a real failure."""
    return status in (400, 422, 500) and bool(_REFUSAL.search(server_message))

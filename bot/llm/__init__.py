"""The LLM port (one method) and its OpenAI-compatible adapter; offline token counting."""

"""Memory: the raw log (ground truth), rolling summaries, facts, retrieval and context assembly."""

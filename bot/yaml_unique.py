"""YAML loading that refuses a key given twice in one mapping.

PyYAML keeps the last of two equal keys silently, so a second ``llm:`` block would replace
the first without a word. Invariant: the error names the key and both lines, and is a
``yaml.YAMLError`` (callers already turn those into one line with the position).
"""

from __future__ import annotations

from typing import Any

import yaml


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last one
    silently: a second ``llm:`` block would replace the first without a word)."""


def _unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:  # the keys written here (`<<: *base` merges may repeat)
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be a plain word, not a list or mapping", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"the key '{key}' appears twice (lines {seen[key]} and {line}); YAML would keep "
                "only the second. Fix: merge the two into one",
                key_node.start_mark,
            )
        seen[key] = line
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node))


UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _unique_mapping,
)


def load_unique(text: str) -> Any:
    """``yaml.safe_load`` that raises on duplicate keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: safe

"""Artemis-style wildcard patterns over dotted names, and most-specific-first merging.

A name such as ``orders.eu.refunds`` is a list of words separated by ``.``.
In a pattern, ``*`` matches exactly one word and ``#`` matches zero or more
words; every other word matches itself. So ``news.europe.#`` matches
``news.europe``, ``news.europe.sport`` and ``news.europe.politics.fr``, and
``news.*`` matches ``news.europe`` but not ``news.europe.sport``.

Specificity, a total order (most specific first), compares in turn:

1. kind: an exact pattern (no wildcard) beats one with ``*`` only, which
   beats one with ``#``;
2. the literal prefix: more literal words before the first wildcard wins;
3. more literal words in all;
4. fewer ``#`` words, then more words in all;
5. finally the pattern text itself, in code-point order, so that two patterns
   never tie and the outcome never depends on dict order.

When several patterns of one mapping match, the most specific supplies its
fields and the less specific ones fill in only the fields it leaves unset,
as Artemis merges address settings. A nested field (``breaker``, a mapping
of options) merges the same way, option by option.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from celery_dlq.errors import ConfigurationError

ONE = "*"
ANY = "#"


@dataclass(frozen=True)
class Pattern:
    text: str
    words: tuple[str, ...]

    @classmethod
    def parse(cls, text: Any, where: str = "pattern") -> Pattern:
        if not isinstance(text, str) or not text:
            raise ConfigurationError(f"{where}: a pattern must be a non-empty string, got {text!r}")
        words = tuple(text.split("."))
        for word in words:
            if not word:
                raise ConfigurationError(f"{where}: empty word in pattern {text!r}")
            if word not in (ONE, ANY) and (ONE in word or ANY in word):
                raise ConfigurationError(
                    f"{where}: {text!r}: '*' and '#' must be whole words (as in 'orders.*')")
        return cls(text, words)

    def matches(self, name: str) -> bool:
        return _match(self.words, tuple(name.split(".")))

    @property
    def specificity(self) -> tuple:
        """Sort key, larger is more specific (see the module docstring)."""
        has_any = ANY in self.words
        kind = 0 if has_any else (1 if ONE in self.words else 2)
        prefix = 0
        for word in self.words:
            if word in (ONE, ANY):
                break
            prefix += 1
        literals = sum(w not in (ONE, ANY) for w in self.words)
        return (kind, prefix, literals, -self.words.count(ANY), len(self.words))

    def sort_key(self) -> tuple:
        """Most specific first: negate the specificity, then the text ascending."""
        return tuple(-part for part in self.specificity) + (self.text,)


@lru_cache(maxsize=4096)
def _match(pattern: tuple[str, ...], words: tuple[str, ...]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == ANY:
        # '#' swallows zero words, or one word and stays in place.
        return _match(rest, words) or (bool(words) and _match(pattern, words[1:]))
    if not words:
        return False
    return (head == ONE or head == words[0]) and _match(rest, words[1:])


class PatternMap:
    """An ordered set of (pattern, value) pairs, looked up most-specific-first."""

    def __init__(self, items: Iterable[tuple[Pattern, Any]]) -> None:
        self.items = sorted(items, key=lambda item: item[0].sort_key())

    @classmethod
    def from_mapping(cls, mapping: Any, where: str, convert=lambda value, where: value) -> PatternMap:
        """``convert(value, where)`` validates each value, naming its pattern in errors."""
        if mapping is None:
            return cls(())
        if isinstance(mapping, Mapping):
            pairs = list(mapping.items())
        elif isinstance(mapping, (list, tuple)):
            pairs = list(mapping)
        else:
            raise ConfigurationError(f"{where}: expected a mapping of pattern -> fields, got {mapping!r}")
        items = []
        for pair in pairs:
            if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                raise ConfigurationError(f"{where}: expected (pattern, fields) pairs, got {pair!r}")
            text, value = pair
            pattern = Pattern.parse(text, where)
            items.append((pattern, convert(value, f"{where}[{text!r}]")))
        return cls(items)

    def matching(self, name: str) -> list[Any]:
        """Values whose pattern matches ``name``, most specific first."""
        return [value for pattern, value in self.items if pattern.matches(name)]

    def matching_items(self, name: str) -> list[tuple[Pattern, Any]]:
        """``(pattern, value)`` pairs whose pattern matches ``name``, most specific first."""
        return [(pattern, value) for pattern, value in self.items if pattern.matches(name)]

    def __bool__(self) -> bool:
        return bool(self.items)


def merge_fields(layers: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge partial field mappings, the first layer winning field by field, and in a nested mapping key by
    key (one layer may set ``breaker.min_failures`` and another ``breaker.window``)."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if not isinstance(value, Mapping):
                merged.setdefault(key, value)
            elif key not in merged:
                merged[key] = merge_fields([value])
            elif isinstance(merged[key], dict):
                merged[key] = merge_fields([merged[key], value])
    return merged

"""Context a client adds in the user's role: text that is wholly elements of known tags.

Claude Code's `<system-reminder>`, Codex's `<environment_context>` and the like carry the
client's state, not the user's words: they are neither searched by nor saved.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_TAGS = ("system-reminder", "environment_context", "user_instructions")


class ContextTags:
    """Tells a text that is only context elements (`scope.context_tags`) from the user's words."""

    def __init__(self, tags: Iterable[str] = DEFAULT_TAGS) -> None:
        names = "|".join(re.escape(tag) for tag in tags)
        # One element at the start of the text: <tag ...> ... </tag>, the same tag closing it.
        self._element = re.compile(rf"\s*<({names})(?:\s[^>]*)?>.*?</\1>\s*", re.DOTALL) if names else None

    def is_context(self, text: str) -> bool:
        """True for text that is wholly elements of context tags (and is not empty)."""
        if self._element is None or "<" not in text:
            return False
        position, end = 0, len(text)
        while position < end:
            found = self._element.match(text, position)
            if found is None:
                return False
            position = found.end()
        return position > 0

"""Text → index terms, shared by every lexical index so queries and documents agree.

Case is folded and words are stemmed (Snowball English), so "worked" finds "works".
Identifiers (hosts, paths, snake_case, kebab-case, codes) are kept whole *and* split into
their parts, so both `internal-hbr-2291.example` and `hbr` find the message that holds it.
Stop words stay in documents (they count toward length) but are dropped from queries,
where they would match nearly everything and cost 25-250x more.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

import snowballstemmer

# Scripts written without spaces (Chinese, Japanese kana and kanji): each character is a
# term, so "北京" finds "我住在北京" by its two characters. Every other script's words are
# split on spaces and punctuation as English is.
_UNSPACED = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_LETTER = rf"[^\W_{_UNSPACED}]"  # a letter or digit of any spaced script
_TOKEN = re.compile(rf"[{_UNSPACED}]|{_LETTER}(?:(?:[^\W{_UNSPACED}]|[.:/@+-])*{_LETTER})?")
# The same tokens in ASCII text (most text), found twice as fast.
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_.:/@+-]*[A-Za-z0-9])?")
_PART = re.compile(rf"{_LETTER}+")
_CHARACTER = re.compile(rf"[{_UNSPACED}]")
_CAMEL = re.compile(r"[a-z][A-Z]")  # not [a-z]+[A-Z]: quadratic on a long run of lower case
_WHOLE_SEPARATORS = re.compile(r"[_.:/@+-]")

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for from
    further had has have having he her here hers herself him himself his how i if in into is it
    its itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t don ll ve re d m o y also ever yes ok okay oh really hey hi""".split()
)

_stemmer = snowballstemmer.stemmer("english")

# A term is cut to this many characters, in documents and queries alike: a pasted blob
# (base64, hex) is one token, and PostgreSQL's index on its postings holds a term of at most
# about 2,700 bytes; no word or identifier a question names is longer.
MAX_TERM_CHARS = 128
CACHED_TOKEN_CHARS = 256  # the longest token (or word) whose terms are cached


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """The Snowball (English) stem of a lower-case word; digits, short words and other scripts' words
    stay as they are."""
    if len(word) < 4 or not (word.isascii() and word.isalpha()):
        return word
    return _stemmer.stemWord(word)


def _is_identifier(token: str) -> bool:
    return bool(_WHOLE_SEPARATORS.search(token) or _CAMEL.search(token)) or (
        any(c.isdigit() for c in token) and any(c.isalpha() for c in token)
    )


def _whole(token: str) -> str:
    """An identifier as one index term: lower case, Latin accents folded as in words (the
    Turkish "İ" lowers to "i" and a combining dot, which split the term on PostgreSQL),
    separators folded to `_`."""
    return _WHOLE_SEPARATORS.sub("_", _fold(token.lower()))


def _words(text: str) -> list[tuple[str, str]]:
    """(lower-case word, index term) pairs; an identifier's whole form has word ''."""
    out: list[tuple[str, str]] = []
    for token in (_ASCII_TOKEN if text.isascii() else _TOKEN).findall(text):
        out.extend(_cached_token_words(token) if len(token) <= CACHED_TOKEN_CHARS else _token_words(token))
    return out


def _token_words(token: str) -> tuple[tuple[str, str], ...]:
    """`_words` of one token."""
    if _CHARACTER.fullmatch(token):
        return ((token, token),)
    parts = _PART.findall(token)
    out: list[tuple[str, str]] = []
    if len(parts) > 1 or _is_identifier(token):
        out.append(("", _whole(token)[:MAX_TERM_CHARS]))
        if len(parts) == 1:
            return tuple(out)
    for part in parts:
        word = _fold(part.lower())[:MAX_TERM_CHARS]
        out.append((word, stem(word)))
    return tuple(out)


# Chat text repeats a small vocabulary. A longer token (a pasted blob) is not cached: the
# cache would keep it alive.
_cached_token_words = lru_cache(maxsize=65536)(_token_words)


def _fold(word: str) -> str:
    """The word without the accents of Latin letters ("café" is "cafe"), as SQLite's index
    folds them: a user who types no accents still finds the word, on either store."""
    if word.isascii():
        return word
    kept: list[str] = []
    for char in unicodedata.normalize("NFD", word):
        if unicodedata.combining(char) and kept and kept[-1].isascii():
            continue
        kept.append(char)
    return unicodedata.normalize("NFC", "".join(kept))


def terms(text: str) -> list[str]:
    """Every index term of a document, in order, stop words included."""
    return [term for _, term in _words(text)]


def query_terms(text: str) -> list[str]:
    """Distinct significant terms of a query, in order of first appearance."""
    seen: dict[str, None] = {}
    for word, term in _words(text):
        if word not in STOP_WORDS and term not in seen:
            seen[term] = None
    return list(seen)


def index_text(text: str) -> str:
    """The document as a space-separated term string, for an index with a plain tokenizer."""
    return " ".join(terms(text))

"""TOML parsing with limits checked before the parser sees the text.

tomllib recurses once per nested array or inline table (100k `[` is a RecursionError) and
spends quadratic time on dotted keys (a 30,000-part key takes 9 s and 3.5 GB). Presets and
profiles are a few kilobytes with two or three levels, so a single pass over the text that
counts nesting and key parts (outside strings and comments) refuses such input at once,
with one line that names the file.

The same scan guards JSON (a model's config.json, `hfconfig.load`): json.loads recurses once
per `[` or `{` too. Outside strings valid JSON has no `#`, `'` or `\\`, and json.loads stops at
the first such character, so the scan counts every level it would enter.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

MAX_TOML_BYTES = 1 << 20  # a profile with a long change log is ~20 KB
MAX_TOML_DEPTH = 32
MAX_KEY_PARTS = 32

# Everything the scan reacts to; other characters are skipped in bulk by the regex engine.
_TOKENS = re.compile(r'"""|\'\'\'|\\.|["\'#\n\[\]{}=,.]', re.S)
# Inside a string or a comment only its end and escapes matter: the scan jumps to the next of
# these (a model card is 100 KB of strings, most of them a phase's requests: token by token the
# scan took 4.3 ms of a carded plan). No token the jump passes over can hold one of them, so the
# tokens from there on are the ones a token-by-token scan meets.
_STRING_STOPS = {"'": re.compile(r"['\n\\]"), '"': re.compile(r'["\n\\]'),
                 "'''": re.compile(r"['\\]"), '"""': re.compile(r'["\\]')}
_COMMENT_STOP = re.compile(r"[\n\\]")


class TomlLimitError(ValueError):
    """Text over a size, nesting or dotted-key limit (message: one line naming the source)."""


def check_toml_limits(text: str, source: str, max_chars: int | None = MAX_TOML_BYTES) -> None:
    """Raise TomlLimitError when `text` is bigger, deeper or has longer dotted keys than allowed.

    `max_chars=None`: the caller has limited the size itself (JSON files have their own)."""
    if max_chars is not None and len(text) > max_chars:
        raise TomlLimitError(f"{source}: {len(text):,} characters is too long for a zlayout TOML "
                             f"file (at most {MAX_TOML_BYTES:,})")
    depth = 0
    dots = 0  # dots since the last '=', ',', bracket or newline: the parts of one dotted key
    quote: str | None = None  # the delimiter of the string we are in
    comment = False
    search = _TOKENS.search
    pos = 0
    while True:
        if comment or quote is not None:  # in one since the last token: on to what can end it
            stop = (_COMMENT_STOP if comment else _STRING_STOPS[quote]).search(text, pos)
            pos = stop.start() if stop is not None else len(text)
        match = search(text, pos)
        if match is None:
            break
        token, pos = match.group(), match.end()
        if comment:
            comment = token != "\n"
            continue
        if quote is not None:
            if token == quote or (token == "\n" and len(quote) == 1):
                quote = None
            elif token.startswith("\\") and quote == "'":
                # literal strings have no escapes: the character after '\' may close it
                if token[1:] == "'":
                    quote = None
            continue
        if token in ('"""', "'''", '"', "'"):
            quote = token
        elif token.startswith("\\"):
            continue
        elif token == "#":
            comment = True
        elif token in "[{":
            depth += 1
            dots = 0
            if depth > MAX_TOML_DEPTH:
                raise TomlLimitError(f"{source}: nested more than {MAX_TOML_DEPTH} levels deep "
                                     f"(line {_line(text, match.start())})")
        elif token in "]}":
            depth = max(0, depth - 1)
            dots = 0
        elif token == ".":
            dots += 1
            if dots >= MAX_KEY_PARTS:
                raise TomlLimitError(f"{source}: a dotted key of more than {MAX_KEY_PARTS} parts "
                                     f"(line {_line(text, match.start())})")
        else:  # '=', ',' or a newline
            dots = 0


def _line(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def loads(text: str, source: str) -> dict[str, Any]:
    """tomllib.loads after the limits; raises TomlLimitError or tomllib.TOMLDecodeError."""
    check_toml_limits(text, source)
    return tomllib.loads(text)

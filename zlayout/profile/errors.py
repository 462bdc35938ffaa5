"""A profile file's validation errors in the file's own words: pydantic's errors as
'line N: field.path: what is wrong', with the file's key names and line numbers. Read by the
store (a profile that does not validate) and by the builder (a verify result that does not)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from zlayout.messages import type_error_text
from zlayout.profile.schema import SPEC_TO_FILE_SUFFIX


def _file_loc(loc: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """pydantic's location as the file spells it: the file's key names (nvme_gb_per_s, not
    the spec's nvme_gbps), without the union branch pydantic adds past a value ('int')."""
    out: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict):
            if part not in node and isinstance(part, str):
                for spec_suffix, file_suffix in SPEC_TO_FILE_SUFFIX.items():
                    renamed = part[: -len(spec_suffix)] + file_suffix
                    if part.endswith(spec_suffix) and renamed in node:
                        part = renamed
                        break
            out.append(part)
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int):
            out.append(part)
            node = node[part] if 0 <= part < len(node) else None
        elif node is None:  # missing keys and tables: pydantic's location is the file's
            out.append(part)
        else:
            break  # past a value: pydantic's own tags (the union branch), not the file's
    return tuple(out)


def describe_validation_error(exc: ValidationError, text: str | None = None, data: Any = None) -> str:
    """pydantic's errors as 'line N: field.path: what is wrong', one per error; with the
    parsed file (`data`), the path and the key in "write KEY = VALUE" are the file's."""
    parts = []
    errors = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        if data is not None:
            loc = _file_loc(loc, data)
        errors.append({**err, "loc": loc})
    # `int | float` reports each branch: "a number" covers both
    numbers = {e["loc"] for e in errors if e["type"] == "float_type"}
    errors = [e for e in errors if not (e["type"] == "int_type" and e["loc"] in numbers)]
    for err in errors:
        loc = err["loc"]
        field = ascii(".".join(str(p) for p in loc))[1:-1][:200]
        message = " ".join(err["msg"].removeprefix("Value error, ").split())
        typed = type_error_text(err)
        if typed is not None:
            message = typed
        elif err["type"] == "missing":
            message = "missing (required)"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (misspelt? remove it or use a field zlayout knows)"
        line = line_of(text, loc) if text else None
        parts.append(f"line {line}: {field}: {message}" if line else f"{field}: {message}")
    return "; ".join(parts)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(r'^\s*("[^"]*"|[A-Za-z0-9_-]+)\s*=')


def line_of(text: str, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line that holds `loc` (a key or its table), for error messages."""
    seen: dict[tuple[Any, ...], int] = {}
    aot_counts: dict[tuple[Any, ...], int] = {}
    table: tuple[Any, ...] = ()
    for number, line in enumerate(text.splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            names = tuple(p.strip().strip('"') for p in header.group(2).split("."))
            if header.group(1) == "[[":
                index = aot_counts.get(names, 0)
                aot_counts[names] = index + 1
                seen.setdefault(names, number)
                table = (*names, index)
            else:
                table = names
            seen.setdefault(table, number)
            continue
        key = _KEY.match(line)
        if key:
            seen.setdefault((*table, key.group(1).strip('"')), number)
    for end in range(len(loc), 0, -1):
        if loc[:end] in seen:
            return seen[loc[:end]]
    return None

"""How a message shows what the user typed, shared by the command line and the app.

No imports beyond the standard library: the app's first frame and the planner use it.
"""

from __future__ import annotations

import json
import re

MAX_SHOWN_CHARS = 40


def parse_whole_number(text: str) -> int | None:
    """A whole number as the command line and the app read it: '1_000', '1,000' and '+8'
    are numbers; '8.0', other scripts' digits ('١٢', which int() takes) and anything else
    are not (None)."""
    cleaned = str(text).strip().replace("_", "").replace(",", "")
    return int(cleaned) if re.fullmatch(r"[+-]?[0-9]{1,30}", cleaned) else None


# k and M on a count of tokens or of a width (sequence, hidden, ffn, vocabulary) are binary, as
# "4k context" (4,096) and "32K" (32,768) are said; parameter counts (--params) stay decimal.
COUNT_UNITS = {"": 1, "k": 1024, "ki": 1024, "m": 1024**2, "mi": 1024**2}
_COUNT_RE = re.compile(r"([+-]?[0-9][0-9_,]{0,30}(?:\.[0-9]{1,12})?)\s*(k|ki|m|mi)?", re.I)


def parse_count_with_unit(text: str) -> int | None:
    """A whole count typed bare or with k/M (1,024 / 1,048,576): '4096', '4k', '32K', '1.5k',
    '1M'; None for anything else, a fraction of one ('4.1k' is 4,198.4) included. A sign is
    read ('-1' is -1), so a negative count meets its range, not "not a whole number"."""
    match = _COUNT_RE.fullmatch(str(text).strip())
    if match is None:
        return None
    number, unit = match.groups()
    if unit is None:
        return parse_whole_number(number)
    digits = number.replace("_", "").replace(",", "").lstrip("+")
    sign = -1 if digits.startswith("-") else 1
    whole, _, decimals = digits.lstrip("-").partition(".")
    # exact arithmetic: 1.5k is 1,536 and 4.1k is not a whole count
    scaled = int(whole + decimals) * COUNT_UNITS[unit.lower()]
    divisor = 10 ** len(decimals)
    return sign * (scaled // divisor) if scaled % divisor == 0 else None


# sizes in GiB that also take a unit: '2T' / '2TiB' is 2,048 GiB, '3.84TB' (decimal, as drives
# are sold) is 3,576.3 GiB (--host-ram-gib, --nvme-gib and the app's fields alike)
GIB_PER_UNIT = {"g": 1.0, "gi": 1.0, "gib": 1.0, "t": 1024.0, "ti": 1024.0, "tib": 1024.0,
                "gb": 1e9 / 2**30, "tb": 1e12 / 2**30}
GIB_UNIT_RE = re.compile(r"(.*?)\s*(gib|gi|gb|g|tib|ti|tb|t)", re.I)


def parse_gib_amount(text: str) -> float | None:
    """A size in GiB, bare (512) or with a unit (512G, 2T, 3.84TB, 960GB); None when it is not
    a finite number."""
    import math

    match = GIB_UNIT_RE.fullmatch(str(text).strip())
    number, factor = (match.group(1), GIB_PER_UNIT[match.group(2).lower()]) if match else (str(text), 1.0)
    try:
        value = float(number.strip().replace("_", "").replace(",", ""))
    except ValueError:
        return None
    return value * factor if math.isfinite(value) else None


def printable(text: object) -> str:
    """`text` with every character a terminal would act on (escape sequences, line breaks,
    tabs) written as its escape, for text read from files shown in a table."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def printable_name(text: str) -> str:
    """A name read from a file or a folder (a config.json's `_name_or_path`, the folder holding
    it) as one line of printable text: each character a terminal would act on becomes a space."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def quoted(value: object, limit: int = MAX_SHOWN_CHARS) -> str:
    """`value` as Python quotes it (balanced quotes, escapes visible); a long one is cut
    and says so: 'xxxx'... (60 characters)."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def exception_text(exc: BaseException) -> str:
    """An exception's message as written, for one line shown to the user.

    str(KeyError('x')) is "'x'" (KeyError quotes its argument): a bare KeyError shows its
    argument. Nothing else is stripped: stripping quotes off the ends of every message cut the
    closing quote off ones that end by quoting a value ("..., got '32'" read "got '32").
    """
    if isinstance(exc, KeyError) and type(exc).__str__ is KeyError.__str__ and len(exc.args) == 1:
        text = str(exc.args[0])
    else:
        text = str(exc)
    return text.strip() or type(exc).__name__


# pydantic's strict type errors -> what the file should hold (TOML's words)
_EXPECTED_TYPE = {
    "int_type": "an integer (a whole number, without quotes)",
    "float_type": "a number (without quotes)",
    "bool_type": "true or false (without quotes)",
    "string_type": "a string (in quotes)",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
    "datetime_type": "a date-time such as 2026-11-30T01:02:03Z (without quotes)",
}


def toml_value(value: object) -> str:
    """A value read from TOML, as the file spells it: the string "4096", true, 4096.0, an array."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):  # TOML's basic string is JSON's: "4096", escapes visible
        shown = value if len(value) <= MAX_SHOWN_CHARS else value[:MAX_SHOWN_CHARS]
        return "the string " + json.dumps(shown) + ("..." if shown != value else "")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def type_error_text(error: dict) -> str | None:
    """A pydantic strict-mode type error (one of ValidationError.errors()) as "expected an
    integer (...), got the string "4096": write hidden = 4096"; None for other errors."""
    expected = _EXPECTED_TYPE.get(str(error.get("type")))
    if expected is None or "input" not in error:
        return None
    value = error["input"]
    text = f"expected {expected}, got {toml_value(value)}"
    key = error["loc"][-1] if error.get("loc") else None
    fixed = None
    if isinstance(value, str) and error["type"] in ("int_type", "float_type", "bool_type"):
        fixed = {"int_type": _as_int, "float_type": _as_float, "bool_type": _as_bool}[error["type"]](value.strip())
    elif (error["type"] == "int_type" and isinstance(value, float) and value.is_integer()
          and abs(value) < 2**63):
        fixed = str(int(value))  # memory_bytes = 80e9: TOML integers have no exponent
    elif error["type"] == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
        fixed = json.dumps(str(value))  # name = 8: a name is text
    if fixed is not None and isinstance(key, str):
        text += f": write {key} = {fixed}"
    return text


def _as_int(text: str) -> str | None:
    cleaned = text.replace("_", "").replace(",", "")
    return cleaned if re.fullmatch(r"[+-]?[0-9]{1,18}", cleaned) else None


def _as_float(text: str) -> str | None:
    if _as_int(text) is not None:  # "12" where a number belongs: 12 is one
        return _as_int(text)
    try:
        value = float(text)
    except ValueError:
        return None
    return repr(value) if value == value and abs(value) != float("inf") else None


def _as_bool(text: str) -> str | None:
    return {"true": "true", "false": "false"}.get(text.lower())


# The other allocator as each surface names it: the command line's flag and the environment
# variable it sets; the app's Allocator field (one line shorter in the status at 80x24).
EXPANDABLE_NOTE = "With --allocator expandable (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)"
EXPANDABLE_NOTE_IN_APP = "With Allocator: expandable"

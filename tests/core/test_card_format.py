"""A card's parameter tensors (names, shapes, dtypes: hundreds each) are written as strings
"a, b, ...", a shape "d d" (zlayout.cards `_parameters_text`), as the phases' requests are: as
TOML arrays they were 90% of parsing a card. Cards written before, with the arrays, in users'
caches and among the shipped ones, read as they did."""

from __future__ import annotations

import dataclasses
import re
import tomllib

import pytest
import tomli_w

from zlayout import cards
from zlayout.core.card import CardError, card_from_dict

LISTS = ("names", "shapes", "dtypes")


def shipped(config_name: str):
    return next(p for p in cards.SHIPPED_CARDS_DIR.glob("*.toml")
                if f"({config_name})" in p.read_text()[:200])


def as_arrays(text: str) -> str:
    """The card as zlayout wrote it before: its parameter lists as TOML arrays."""
    params = tomllib.loads(text)["parameters"]
    for key in LISTS:
        line = re.search(rf"^{key} = '.*'\n", text, re.MULTILINE)
        assert line is not None, key
        listed = params[key].split(", ")
        if key == "shapes":
            listed = [[int(d) for d in shape.split()] for shape in listed]
        text = text.replace(line.group(0), tomli_w.dumps({key: listed}))
    return text


def fields(card) -> dict:
    return {f.name: getattr(card, f.name) for f in dataclasses.fields(card) if f.name not in ("source", "digest")}


@pytest.mark.parametrize("config_name", ["Qwen3-8B.json", "llava-1.5-7b-hf.json"])
def test_parameter_strings_and_the_older_arrays_read_alike(tmp_path, config_name):
    """LLaVA's card names untrained tensors (its vision tower's), looked up among the names."""
    path = shipped(config_name)
    text = path.read_text()
    for key in LISTS:
        assert re.search(rf"^{key} = '", text, re.MULTILINE), key
    older = tmp_path / path.name
    older.write_text(as_arrays(text))
    assert "names = [\n" in older.read_text()
    new, old = cards.read_card(path), cards.read_card(older)
    assert fields(new) == fields(old)
    assert new.parameter_layers is not None and len(new.parameter_numels) > 100
    if config_name.startswith("llava"):
        assert new.untrained_tensors and new.untrained_params


def test_lists_a_string_cannot_hold_stay_arrays():
    """A name with a comma or a space, or a 0-d shape, would not split back into the same list."""
    text = cards.dumps_card({"format": 1, "parameters": {
        "count": 5, "names": ["a.b", "odd name"], "shapes": [[2, 2], []], "dtypes": ["float32", "float32"]}},
        "0" * 16, "x.json")
    params = tomllib.loads(text)["parameters"]
    assert params["names"] == ["a.b", "odd name"] and params["shapes"] == [[2, 2], []]
    assert params["dtypes"] == "float32, float32"


def test_a_damaged_shape_string_is_one_line_naming_the_card(tmp_path):
    path = shipped("Qwen3-8B.json")
    broken = tmp_path / path.name
    broken.write_text(re.sub(r"^shapes = '151936 4096, ", "shapes = '151936 x, ", path.read_text(), flags=re.MULTILINE))
    with pytest.raises(CardError, match="shape") as raised:
        cards.read_card(broken)
    assert "\n" not in str(raised.value) and path.stem in str(raised.value)


@pytest.mark.parametrize("edit, message", [
    (lambda regimes: regimes[-1].update(min_tokens=2048), "only the first regime may set min_tokens"),
    (lambda regimes: regimes[0].update(min_tokens=0), "min_tokens must be a whole number of tokens"),
    (lambda regimes: regimes[0].update(min_tokens="2048"), "min_tokens must be a whole number of tokens"),
    (lambda regimes: regimes[1].update(max_micro_batch=True), "max_micro_batch must be a whole number of sequences"),
    (lambda regimes: regimes[1].update(max_positions=-1), "max_positions must be a whole number of tokens"),
])
def test_a_card_s_shortest_sequence_is_its_first_regime_s_whole_number(tmp_path, edit, message):
    path = shipped("Qwen3-8B.json")
    data = tomllib.loads(path.read_text())
    data["regimes"] = [dict(data["regimes"][0]), *data["regimes"]]
    data["regimes"][0]["max_tokens"] = 1023
    assert card_from_dict(data, "k").shortest_sequence is None
    edit(data["regimes"])
    with pytest.raises(CardError, match=message):
        card_from_dict(data, "k")


def test_a_card_from_a_shortest_sequence_on_says_so():
    data = tomllib.loads(shipped("Qwen3-8B.json").read_text())
    data["regimes"][0]["min_tokens"] = 2048
    assert card_from_dict(data, "k").shortest_sequence == 2048


@pytest.mark.parametrize("key, value", [
    ("buffer_bytes", -1), ("buffer_bytes", "4096"), ("buffer_bytes", True), ("buffer_bytes", 2**60),
    ("block_buffer_bytes", 4096), ("block_buffer_bytes", [1, 2, 3]), ("block_buffer_bytes", [-1]),
])
def test_a_card_s_buffer_bytes_are_whole_numbers_one_a_kind(key, value):
    data = tomllib.loads(shipped("Qwen3-8B.json").read_text())
    assert card_from_dict(data, "k").built_buffer_bytes() >= 0
    data["parameters"][key] = value
    with pytest.raises(CardError, match=f"parameters.{key} must"):
        card_from_dict(data, "k")


def test_a_card_without_buffer_bytes_reads_as_none():
    """Cards learned before buffers were recorded (users' caches, measurement folders) plan as before."""
    data = tomllib.loads(shipped("Qwen3-8B.json").read_text())
    for key in ("buffer_bytes", "block_buffer_bytes"):
        data["parameters"].pop(key, None)
    card = card_from_dict(data, "k")
    assert (card.buffer_bytes, card.block_buffer_bytes, card.built_buffer_bytes()) == (0, (), 0)

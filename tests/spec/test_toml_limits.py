"""TOML limits are checked before tomllib sees the text (it recurses per bracket and is
quadratic in dotted-key parts), for preset files and for profiles alike."""

from __future__ import annotations

import tomllib

import pytest

from zlayout import catalog, tomlsafe
from zlayout.cli import main
from zlayout.profile import ProfileError
from zlayout.profile.store import loads_profile

DEEP = "a = " + "[" * 100_000 + "]" * 100_000 + "\n"
DOTTED = "a" + ".a" * 29_999 + " = 1\n"


@pytest.mark.parametrize(("text", "message"), [
    (DEEP, "nested more than 32 levels deep (line 1)"),
    ("x = 1\n" + "t = " + "{a = " * 40 + "1" + "}" * 40 + "\n", "nested more than 32 levels deep (line 2)"),
    (DOTTED, "a dotted key of more than 32 parts (line 1)"),
    ("[" + ".".join(["t"] * 40) + "]\n", "a dotted key of more than 32 parts"),
    ("x = " + "1" * (tomlsafe.MAX_TOML_BYTES + 1), "too long for a zlayout TOML file"),
])
def test_over_the_limits_is_one_line_naming_the_source(text, message):
    with pytest.raises(tomlsafe.TomlLimitError) as caught:
        tomlsafe.loads(text, "f.toml")
    assert str(caught.value).startswith("f.toml: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", [
    'name = "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.1.2.3.4.5.6.7.8.9"\n',
    "values = [" + ", ".join(["1.5"] * 500) + "]\n",
    "# [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ a comment\nx = 1\n",
    'path = \'C:\\dir\\\'\nother = "a\\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["\n',
    'text = """\n' + "[" * 100 + '\n"""\n',
    "a.b.c = 1\n[t.u.v]\nw = {x = [1, [2, [3]]]}\n",
])
def test_ordinary_toml_passes_and_parses_the_same(text):
    assert tomlsafe.loads(text, "f.toml") == tomllib.loads(text)


def test_a_preset_file_over_the_limits_is_refused_at_the_command_line(tmp_path, capsys):
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "deep.toml").write_text(DEEP)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "dotted.toml").write_text(DOTTED)
    for flags in (["--gpu", "deep"], ["--intra-link", "dotted"]):
        code = main(["plan", "--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "100",
                     "--presets-dir", str(tmp_path), *flags])
        err = capsys.readouterr().err.splitlines()
        assert code == 2 and len(err) == 1
        assert err[0].startswith("zlayout: error: ") and str(tmp_path) in err[0]
    with pytest.raises(catalog.PresetFileError, match="nested more than 32 levels"):
        catalog.load_gpu("deep", [tmp_path])


def test_a_profile_over_the_limits_is_a_profile_error():
    with pytest.raises(ProfileError, match="dotted key of more than 32 parts"):
        loads_profile("schema_version = 1\n" + DOTTED, "p/profile.toml")
    with pytest.raises(ProfileError, match="nested more than 32 levels"):
        loads_profile("schema_version = 1\n" + DEEP, "p/profile.toml")


def test_every_shipped_card_is_within_the_limits_it_is_read_without():
    # zlayout.cards reads its own cards without the scan (read_card(shipped=True)): this holds
    # them to it instead
    from zlayout import cards

    shipped = sorted(cards.SHIPPED_CARDS_DIR.glob("*.toml"))
    assert shipped
    for path in shipped:
        tomlsafe.check_toml_limits(path.read_text(encoding="utf-8"), str(path), max_chars=None)


def test_a_card_from_elsewhere_is_scanned(tmp_path):
    from zlayout import cards

    card = tmp_path / "0123456789abcdef.toml"
    card.write_text(f"{cards.HEADER}\n" + DEEP)
    with pytest.raises(cards.CardError, match="nested more than 32 levels deep"):
        cards.read_card(card)

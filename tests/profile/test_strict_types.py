"""A profile (and a preset, and a calibration file) holds each value in its own TOML type.

`hidden = "4096"`, `bias = 0`, `stage = true`, `hidden = 4096.0` were converted silently
(pydantic's lax mode); now every command that reads the file refuses it with one line naming
the file, the line, the key, the type expected and what to write, and exits 2.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from zlayout import catalog
from zlayout.profile.store import ProfileError, loads_profile

SHIPPED = catalog.preset_path("profiles", "llama3-8b-8xh100") / "profile.toml"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def zlayout(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zlayout", *argv], capture_output=True, text=True,
                          timeout=120)


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("zlayout: error: "), lines
    return lines[0]


def edited(tmp_path: Path, old: str, new: str) -> Path:
    text = SHIPPED.read_text()
    assert old in text
    path = tmp_path / "profile.toml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(("old", "new", "says"), [
    ("\nhidden = 4096\n", '\nhidden = "4096"\n',
     'inputs.model.hidden: expected an integer (a whole number, without quotes), got the string "4096": '
     "write hidden = 4096"),
    ("\nhidden = 4096\n", '\nhidden = "big"\n',
     'inputs.model.hidden: expected an integer (a whole number, without quotes), got the string "big"'),
    ("\nhidden = 4096\n", "\nhidden = 4096.0\n",
     "inputs.model.hidden: expected an integer (a whole number, without quotes), got 4096.0: write hidden = 4096"),
    ("\nhidden = 4096\n", "\nhidden = true\n", "inputs.model.hidden: expected an integer"),
    ("\nbias = false\n", "\nbias = 0\n", "inputs.model.bias: expected true or false (without quotes), got 0"),
    ("\nbias = false\n", '\nbias = "false"\n',
     'inputs.model.bias: expected true or false (without quotes), got the string "false": write bias = false'),
    ("\nheadroom_fraction = 0.05\n", '\nheadroom_fraction = "0.05"\n',
     "inputs.headroom_fraction: expected a number (without quotes)"),
    ("\nnvme_gb_per_s = 6.0\n", '\nnvme_gb_per_s = "6.0"\n',
     'inputs.hardware.nvme_gb_per_s: expected a number (without quotes), got the string "6.0": '
     "write nvme_gb_per_s = 6.0"),
    ("\nstage = 1\n", "\nstage = true\n", "layout.stage: expected 0, 1, 2 or 3 (a whole number, without quotes), got true"),
    ("\nstage = 1\n", "\nstage = 1.0\n", "layout.stage: expected 0, 1, 2 or 3"),
    ("\nstage = 1\n", '\nstage = "1"\n', 'layout.stage: expected 0, 1, 2 or 3 (a whole number, without quotes), '
                                         'got the string "1": write stage = 1'),
    ("\nmaster_port = 29500\n", '\nmaster_port = "29500"\n', "run.master_port: expected an integer"),
    ("\noverlap_comm = true\n", '\noverlap_comm = "true"\n', "inputs.zero.overlap_comm: expected true or false"),
    ("\nfits = true\nfits_gpu", "\nfits = 1\nfits_gpu", "prediction.fits: expected true or false"),
    # a fraction written as a percentage
    ("\nheadroom_fraction = 0.05\n", "\nheadroom_fraction = 5\n",
     "inputs.headroom_fraction: must be from 0 to 0.9 (got 5); it is a fraction: did you mean 0.05 (5%)?"),
    ("\nmargin_fraction = 0.1\n", "\nmargin_fraction = 10\n",
     "alerts.gpu_memory.margin_fraction: must be from 0 to 1 (got 10); it is a fraction: did you mean 0.1 (10%)?"),
])
def test_show_refuses_a_value_of_the_wrong_type_naming_file_line_key_and_type(tmp_path, old, new, says):
    path = edited(tmp_path, old, new)
    line = one_error_line(zlayout("show", str(path)))
    number = next(i for i, text in enumerate(path.read_text().splitlines(), 1)
                  if text == new.strip().splitlines()[0])
    assert line.startswith(f"zlayout: error: {path}: line {number}: ")
    assert says in line, line


@pytest.mark.parametrize("command", [["show"], ["show", "--json"], ["show", "--markdown"], ["check"],
                                     ["diff", str(SHIPPED.parent)], ["verify", "--cpu"], ["app"]])
def test_every_command_that_reads_a_profile_reports_it_cleanly(tmp_path, command):
    path = edited(tmp_path, "\nhidden = 4096\n", '\nhidden = "4096"\n')
    argv = [command[0], str(path), *command[1:]]
    line = one_error_line(zlayout(*argv))
    assert str(path) in line and 'inputs.model.hidden: expected an integer' in line


def _leaves(value, path=()):
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


@pytest.mark.parametrize("source", [SHIPPED, FIXTURES / "v1-custom-verified.toml"],
                         ids=["ready-profile", "v1-verified"])
def test_every_numeric_and_boolean_key_refuses_a_string_and_another_type(source):
    """Each number and boolean of a real profile (inputs, layout, run, prediction, terms,
    verification, drill, limits, alerts, change log), written as a string and as the wrong
    TOML type, is refused with the file, the dotted key and the type expected. The summary is
    derived (ignored on load) and so is left out."""
    data = tomllib.loads(source.read_text())
    checked = 0
    for path, value in _leaves(data):
        if path[0] == "summary" or path == ("schema_version",) or isinstance(value, str):
            continue
        if not isinstance(value, (bool, int, float)):
            continue
        wrong = [str(value).lower() if isinstance(value, bool) else str(value)]
        if isinstance(value, bool):
            wrong.append(0)
        elif isinstance(value, int):
            wrong.append(True)
        for bad in wrong:
            broken = copy.deepcopy(data)
            table = broken
            for part in path[:-1]:
                table = table[part]
            table[path[-1]] = bad
            with pytest.raises(ProfileError) as caught:
                loads_profile(tomli_w.dumps(broken), "edited.toml")
            message = str(caught.value)
            dotted = ".".join(map(str, path))
            assert message.startswith("edited.toml: line ") and f"{dotted}: expected " in message, message
            checked += 1
    assert checked > 200


def test_the_shipped_profiles_and_fixtures_still_load():
    for name in catalog.list_presets("profiles"):
        loads_profile((catalog.preset_path("profiles", name) / "profile.toml").read_text())
    for fixture in FIXTURES.glob("*.toml"):
        loads_profile(fixture.read_text(), str(fixture))


def test_a_profile_of_a_model_with_dense_layers_round_trips(tmp_path):
    """dense_layers is an array in TOML and a tuple in the spec: strict loading took only a
    tuple, and one unreadable preset (deepseek-v2-lite) made every family unknown."""
    out = tmp_path / "ds"
    proc = zlayout("export", "--preset", "deepseek-v2-lite", "--gpus-per-node", "8", "--stage", "3",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "dense_layers" in (out / "profile.toml").read_text()
    assert zlayout("show", str(out)).returncode == 0
    assert catalog.load_model("deepseek-v2-lite").dense_layers == (0,)


def test_a_preset_file_with_a_number_in_quotes_is_refused(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.toml").write_text('layers = 2\nhidden = "128"\nheads = 4\nvocab = 100\n')
    line = one_error_line(zlayout("plan", "--preset", "mine", "--presets-dir", str(tmp_path)))
    assert "mine.toml: invalid model preset: hidden: expected an integer (a whole number, without quotes), " \
           'got the string "128": write hidden = 128' in line


def test_a_calibration_file_with_a_number_in_quotes_is_refused(tmp_path):
    path = tmp_path / "cal.toml"
    path.write_text('schema = "zlayout-calibration/1"\n[factors]\ngpu = "1.2"\n')
    line = one_error_line(zlayout("plan", "--preset", "llama3-8b", "--calibration", str(path)))
    assert line == (f"zlayout: error: --calibration {path}: factors.gpu: expected a number (without quotes), "
                    'got the string "1.2": write gpu = 1.2')

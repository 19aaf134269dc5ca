"""The speculation cost gate kept across processes (``CostGate.remember``, ``Model.remember_speculation``, the
command line's default): what a gate learned comes back whole in a new gate for the same setting and only
for it; malformed, foreign or unwritable files cost exploration, never an exception or output."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest

import regolith
from regolith import cli
from regolith import model as model_module
from regolith.speculative import GATE_FORMAT, CostGate

KEYS = [("mtp", i) for i in range(7)]
SUFFIX = [("suffix", i) for i in range(7)]


@pytest.fixture(autouse=True)
def root(monkeypatch, tmp_path):
    """Each test's own cache root."""
    path = tmp_path / "cache"
    monkeypatch.setattr(model_module, "cache_root", lambda: path)
    return path


def _learned() -> CostGate:
    """A gate after some measurements: evaluations with stalls, two drafters' costs, a custom drafter's key
    that cannot be stored (not a (name, integer) pair) and acceptance that differs by key."""
    gate = CostGate(stall_clock=lambda: 0.0)
    for n in range(1, 9):
        for rep in range(3):
            gate.observe_eval(n, 0.010 + 0.002 * (n - 1) + 0.001 * rep, 0.004 + 0.0005 * rep)
    gate.observe_eval(3, 0.030)  # a busy moment the isotonic fit smooths
    gate.observe_draft("mtp", 4, 0.004)
    gate.observe_catch_up("mtp", 30, 0.006)
    gate.observe_draft("suffix", 7, 0.00001)
    for i in range(7):
        for j in range(9):
            gate.record(("mtp", i), j < 7 - i)
            gate.record(("suffix", i), j % 2 == 0)
    gate.record("custom", True)
    return gate


def test_a_gates_state_survives_json_and_decides_alike():
    gate = _learned()
    back = CostGate()
    back.restore(json.loads(json.dumps(gate.state())))
    assert back.state() == gate.state()
    for n in range(1, 12):
        assert back.eval_cost(n) == gate.eval_cost(n)
    for keys, name in ((KEYS, "mtp"), (SUFFIX, "suffix")):
        for limit in range(8):
            assert back.best_length(name, keys, limit) == gate.best_length(name, keys, limit)
        assert [back.acceptance(k) for k in keys] == [gate.acceptance(k) for k in keys]
    assert back.catch_up_pays("mtp", 200, 150.0, 64) == gate.catch_up_pays("mtp", 200, 150.0, 64)
    assert "custom" in gate.pool.tries and "custom" not in back.pool.tries
    assert gate.best_length("mtp", KEYS, 7) > 0  # the restored decisions compared are not all "no draft"


def _broken(mutate):
    state = json.loads(json.dumps(_learned().state()))
    mutate(state)
    return state


@pytest.mark.parametrize(
    "state",
    [
        _broken(lambda s: s.pop("eval")),
        _broken(lambda s: s["eval"][0].__setitem__(1, -0.01)),
        _broken(lambda s: s["eval"][0].__setitem__(1, math.nan)),
        _broken(lambda s: s["eval"][0].__setitem__(0, 0)),
        _broken(lambda s: s["eval"][0].__setitem__(0, 1.5)),
        _broken(lambda s: s["eval"][0].__setitem__(3, 0.0)),
        _broken(lambda s: s["eval"][0].__setitem__(3, 6.0)),
        _broken(lambda s: s["eval"][0].append(1.0)),
        _broken(lambda s: s["draft"].__setitem__("mtp", "fast")),
        _broken(lambda s: s.__setitem__("catch_up", [])),
        _broken(lambda s: s["pool"][0].__setitem__(2, 99.0)),  # more hits than tries
        _broken(lambda s: s["pool"][0].__setitem__(0, 7)),
        _broken(lambda s: s["pool"][0].__setitem__(1, True)),
        "eval",
        None,
    ],
)
def test_restore_refuses_what_is_not_a_gate_state_and_keeps_the_gate(state):
    gate = _learned()
    before = gate.state()
    with pytest.raises(ValueError, match="not a cost gate's state"):
        gate.restore(state)
    assert gate.state() == before


def test_a_remembered_gate_comes_back_for_its_setting_only(tmp_path, caplog, monkeypatch):
    path = tmp_path / "gate.json"
    setting = {"model": "ab", "backend": "cpu", "threads": 2}
    gate = CostGate()
    assert not gate.remember(path, setting) and not path.exists()
    learned = _learned()
    learned.remember(path, setting)  # no file yet: the learned gate keeps what it has
    learned.checkpoint()
    saved = path.read_text()
    assert json.loads(saved)["format"] == GATE_FORMAT

    learned.observe_eval(1, 1.0)
    learned.checkpoint()  # within SAVE_SECONDS of the last save: not written
    assert path.read_text() == saved
    monkeypatch.setattr("regolith.speculative.SAVE_SECONDS", 0.0)
    learned.checkpoint()
    assert path.read_text() != saved
    learned.checkpoint(force=True)

    again = CostGate()
    assert again.remember(path, setting)
    assert again.state() == learned.state()

    caplog.set_level(logging.WARNING, "regolith.speculative")
    other = CostGate()
    assert not other.remember(path, {**setting, "threads": 4})
    assert other.state() == CostGate().state() and "another format or setting" in caplog.text
    other.checkpoint(force=True)  # the other setting's gate takes the file over
    assert json.loads(path.read_text())["setting"]["threads"] == 4

    for text in (saved[: len(saved) // 2], "[]", json.dumps({"format": GATE_FORMAT, "setting": setting})):
        path.write_text(text)
        caplog.clear()
        fresh = CostGate()
        assert not fresh.remember(path, setting) and caplog.text
        assert fresh.state() == CostGate().state()


def test_a_save_that_fails_is_logged_and_leaves_no_file(tmp_path, caplog):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    gate = _learned()
    assert not gate.remember(blocker / "gate.json", {})
    caplog.set_level(logging.WARNING, "regolith.speculative")
    gate.checkpoint(force=True)
    assert "could not save the speculation cost gate" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["a file"] and blocker.read_text() == ""


def test_a_new_model_process_takes_up_what_the_last_learned(tmp_path, root):
    first = regolith.Model.load("regolith-demo", arena_gb=0.004)
    path = first.remember_speculation()
    assert path.parent == root / "speculation"
    first.generate("def add(a, b):\n    return a + b\n\ndef add(a, b):\n", 24, temperature=0)
    assert path.is_file() and first.spec_gate.eval_seconds

    second = regolith.Model.load("regolith-demo", arena_gb=0.004)
    assert second.remember_speculation() == path
    assert second.spec_gate.state() == first.spec_gate.state()
    resident = regolith.Model.load("regolith-demo")  # no arena: another setting, another file
    assert resident.remember_speculation() != path
    assert not resident.spec_gate.eval_seconds

    own = tmp_path / "mine.json"
    assert second.remember_speculation(own) == own and not own.exists()


def test_the_speculation_folder_keeps_the_newest_files(root):
    folder = root / "speculation"
    folder.mkdir(parents=True)
    for i in range(model_module.REMEMBERED + 5):
        f = folder / f"old{i:03d}.json"
        f.write_text("{}")
        os.utime(f, (1_000_000 + i, 1_000_000 + i))
    path = regolith.Model.load("regolith-demo").remember_speculation()
    left = sorted(p.name for p in folder.glob("*.json"))
    newest = [f"old{i:03d}.json" for i in range(6, model_module.REMEMBERED + 5)]
    assert left == sorted(newest) and not path.exists()  # room for the model's own file


def test_the_command_line_remembers_unless_told_not_to(capsys, root):
    folder = root / "speculation"
    args = ["run", "-p", "class Stack:", "-n", "6", "--temp", "0", "-q", "--arena-gb", "0.005"]
    assert cli.main([*args, "--no-spec-memory"]) == 0
    assert not folder.exists()
    assert cli.main(args) == 0
    (saved,) = folder.glob("*.json")
    assert json.loads(saved.read_text())["state"]["eval"]
    capsys.readouterr()

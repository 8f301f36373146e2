"""``elastic-train ls`` and ``show`` on what a storage path may hold: a failed run (its
stored error is shown), a run.json cut short (``ls`` skips it with a warning), a run
crafted to hold terminal control sequences (shown escaped, never obeyed)."""

from __future__ import annotations

import json

import pytest

from elastic_train.cli.main import main
from tests.support.crafted_runs import RAW, crafted_run

ERROR = ("Training failed after 0 restarts: rank 1 exited with code 1\n"
         "Traceback (most recent call last):\n  RuntimeError: crash at epoch 2")


def _runs(root):
    for name, state in (("good", {"status": "finished", "format_version": 1, "created": 1.0}),
                        ("failed", {"status": "failed", "format_version": 1, "created": 2.0,
                                    "error": ERROR})):
        (root / name).mkdir(parents=True)
        (root / name / "run.json").write_text(json.dumps(state))
    (root / "cut").mkdir()
    (root / "cut" / "run.json").write_text('{"status": "fini')


def test_show_prints_a_failed_runs_stored_error(tmp_path, capsys):
    _runs(tmp_path)
    assert main(["show", str(tmp_path / "failed")]) == 0
    out = capsys.readouterr().out
    assert "error:    Training failed after 0 restarts: rank 1 exited with code 1" in out
    assert "          RuntimeError: crash at epoch 2" in out


def test_ls_skips_a_cut_short_run_json_with_a_warning(tmp_path, capsys):
    _runs(tmp_path)
    assert main(["ls", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "good" in out and "failed" in out and "cut" not in out
    assert err.count("\n") == 1 and "skipping" in err and "not valid JSON" in err


def assert_escaped(text: str) -> None:
    """No control character but the renderer's newlines; the crafted ones shown."""
    for raw in RAW:
        assert raw not in text, (raw, text)
    assert not any(line.startswith("status:   finished") for line in text.splitlines())


SHOWN = {"ls": ["crafted\\x1b]0;owned\\x07", "loss\\x1b[2J=0.5\\x1b]52;c;aGVsbG8=\\x07"],
         "show": ["error:    Training failed\\rstatus:   finished\\x1b]52;c;", "host\\x9b31m",
                  "          second line\\x1b]0;owned\\x07", "new processes\\x7f",
                  "train:    train:loop\\x1b[2J"]}


@pytest.mark.parametrize("command", [["ls"], ["ls", "--json"], ["show"], ["show", "--json"]])
def test_control_sequences_from_storage_are_shown_escaped(tmp_path, capsys, command):
    name = crafted_run(tmp_path / "results")
    where = tmp_path / "results" if command[0] == "ls" else tmp_path / "results" / name
    assert main([command[0], str(where), *command[1:]]) == 0
    out, err = capsys.readouterr()
    assert_escaped(out + err)
    if "--json" in command:
        assert json.loads(out) and json.dumps("\x1b]0;owned\x07")[1:-1] in out
    else:
        for shown in SHOWN[command[0]]:
            assert shown in out, (shown, out)

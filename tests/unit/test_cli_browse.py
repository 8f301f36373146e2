"""``elastic-train ls`` and ``show`` on what a storage path may hold: a failed run (its
stored error is shown), a run.json cut short (``ls`` skips it with a warning)."""

from __future__ import annotations

import json

from elastic_train.cli.main import main

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

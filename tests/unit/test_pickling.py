"""Functions pickled by value keep their file names (cloudpickle 3.1.3 writes "<dynamic-code>")."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import cloudpickle
import pytest

from elastic_train._internal import pickling

# CI runs these on cloudpickle 3.1.3 (the main suite) and 3.1.2 (.ci/compat's COMPAT_PINS).
pytestmark = pytest.mark.compat


def _outer():
    def inner():
        return (lambda: 1 / 0)()
    return inner()


def test_code_pickled_by_value_keeps_its_file_name_nested_code_too():
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        loaded = pickle.loads(pickling.dumps(_outer))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert loaded is not _outer  # pickled by value, not imported back
    codes = [loaded.__code__]
    while codes:
        code = codes.pop()
        assert code.co_filename == __file__, code
        codes.extend(c for c in code.co_consts if isinstance(c, type(code)))


def test_a_scripts_train_function_fails_in_another_process_with_its_file_and_line(tmp_path):
    """The user's case: a function of ``__main__`` (always pickled by value) raises in a
    worker; the traceback names the script and shows the failing line."""
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent("""
        import sys
        from elastic_train._internal import pickling

        def train_func(config):
            raise ValueError("the user's own error")

        sys.stdout.buffer.write(pickling.dumps(train_func))
    """))
    payload = subprocess.run([sys.executable, str(script)], capture_output=True, check=True,
                             timeout=60).stdout
    worker = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())({})"],
        input=payload, capture_output=True, timeout=60)
    assert worker.returncode == 1
    traceback = worker.stderr.decode()
    assert f'File "{script}", line 6, in train_func' in traceback
    assert 'raise ValueError("the user\'s own error")' in traceback
    assert "<dynamic-code>" not in traceback

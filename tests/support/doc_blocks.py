"""The code blocks of the README and the guides under docs/, for the tests that run them
(tests/unit/test_doc_blocks.py): so that the docs cannot rot."""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass

from tests.support.paths import REPO as _REPO

ROOT = pathlib.Path(_REPO)
# Fenced blocks of these languages, at any indentation (a block inside a list item too).
_FENCE = re.compile(r"^( *)```(python|bash)\n(.*?)^\1```[ \t]*$", re.S | re.M)


@dataclass(frozen=True)
class DocBlock:
    """One fenced code block: ``doc`` (its file, from the repository's root), ``index``
    (its place among the doc's python and bash blocks, from 0), its first line (a key that
    says which block an entry means, and fails when the doc's blocks move)."""

    doc: str
    index: int
    language: str
    code: str

    @property
    def first_line(self) -> str:
        return self.code.splitlines()[0].strip()

    @property
    def key(self) -> tuple[str, int]:
        return self.doc, self.index

    def __str__(self) -> str:
        return f"{self.doc}#{self.index} ({self.language}: {self.first_line!r})"


def doc_files() -> list[str]:
    """README.md, CONTRIBUTING.md and every Markdown file under docs/."""
    docs = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return ["README.md", "CONTRIBUTING.md", *docs]


def doc_blocks() -> list[DocBlock]:
    """Every python and bash block of :func:`doc_files`, in order."""
    blocks = []
    for doc in doc_files():
        text = (ROOT / doc).read_text()
        for index, match in enumerate(_FENCE.finditer(text)):
            indent, language, code = match.groups()
            blocks.append(DocBlock(doc, index, language, textwrap.dedent(code)))
    return blocks


def shell_commands(code: str) -> list[list[str]]:
    """A bash block's commands as argument lists: continuation lines joined, comments and
    blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [shlex.split(line, comments=True) for line in joined.splitlines()
            if shlex.split(line, comments=True)]


# Blocks that no test runs here, each with why: (its first line, the reason). Every other
# python block runs (with its PRELUDES entry first, if any); every other bash block must
# hold only `elastic-train ...` commands, which the real parser parses.
NOT_RUN: dict[tuple[str, int], tuple[str, str]] = {
    ("README.md", 0): ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.14.1 "
                       "torchvision==0.29.1 && pip install -e \".[examples]\" && python "
                       "examples/digits.py",
                       "creates a venv and installs from the package index (minutes); "
                       "examples/digits.py runs in tests/e2e/test_observe.py"),
    ("README.md", 1): ("python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.14.1 "
                       "torchvision==0.29.1 && pip install -e \".[test,examples]\" && python -m "
                       "pytest -q",
                       "creates a venv and runs the whole suite (25 min): CI runs it, .ci/run"),
    ("docs/RELIABILITY.md", 0): ("python -m pytest -q tests/chaos                          "
                                 "# short profile (CI): 3 kinds drawn per run",
                                 "the chaos suite: minutes to hours"),
    ("docs/RELIABILITY.md", 1): ("CHAOS_PROFILE=long CHAOS_TRIALS=400 CHAOS_SEED=2914 "
                                 "CHAOS_RESULTS=rows.jsonl \\",
                                 "the chaos suite's long run (68 min)"),
    ("docs/RELIABILITY.md", 2): ("CHAOS_PROFILE=all CHAOS_ROUNDS=2 CHAOS_SEED=2915 "
                                 "CHAOS_RESULTS=rows.jsonl \\",
                                 "the chaos suite, every kind twice (8 min)"),
    ("docs/RELIABILITY.md", 3): ("CHAOS_SEED=2029 CHAOS_PROFILE=all CHAOS_ROUNDS=10 "
                                 "CHAOS_RESULTS=a.jsonl \\", "the chaos suite's rounds (hours)"),
    ("docs/RELIABILITY.md", 4): ("CHAOS_SEED=2110 CHAOS_PROFILE=all CHAOS_KINDS=clock_skew "
                                 "CHAOS_ROUNDS=5 \\", "the chaos suite's rounds (minutes)"),
    ("docs/RELIABILITY.md", 5): ("CHAOS_SEED=2401 CHAOS_PROFILE=all CHAOS_KINDS=power_cut_commit "
                                 "CHAOS_ROUNDS=5 python -m pytest -q tests/chaos",
                                 "the chaos suite's rounds (minutes)"),
    ("docs/elastic-data.md", 0): ("import torch", "runs in tests/e2e/test_elastic_data.py::"
                                  "test_the_elastic_data_guides_code_runs (checks its output)"),
    ("docs/fault-tolerance.md", 1): ("saved = False", "a fragment of a train function's loop "
                                     "(`start`, `steps`, `metrics` are the function's)"),
    ("docs/observability.md", 0): ("for step, batch in enumerate(loader):",
                                   "a fragment of a train function's loop (`loader`, "
                                   "`train_step`, `save` are the user's); the whole runs as "
                                   "bench/interval_job.py (figure 17)"),
    ("docs/large-models.md", 0): ("import torch.distributed.checkpoint as dcp",
                                  "a fragment of an FSDP2 train function; the whole runs as "
                                  "examples/fsdp_transformer.py in tests/e2e/test_fsdp_example.py"),
    ("docs/large-models.md", 1): ("from elastic_train.torch import async_save",
                                  "a fragment of a train function (`state()`, `model`, `metrics`)"
                                  "; async_save runs in tests/e2e/test_fsdp.py"),
    ("docs/launch.md", 1): ("scaling = ScalingConfig(",
                            "needs an etcd at etcd-host:2379, S3 and 2-4 nodes of 8 workers; "
                            "the same shape runs in tests/e2e/test_multinode_fit.py"),
    ("docs/porting-from-ray.md", 0): ("from elastic_train import ConfigError, FailureConfig, "
                                      "RunConfig, ScalingConfig",
                                      "runs in tests/unit/test_ray_arguments.py::"
                                      "test_the_porting_guides_code_runs (checks its output)"),
    ("docs/porting-from-ray.md", 1): ("from elastic_train import ValidationConfig, "
                                      "ValidationTaskConfig",
                                      "a fragment (`train_func`, `model`, `evaluate` are the "
                                      "user's); Ray's guide ported runs in "
                                      "tests/e2e/test_ray_guide_ports.py"),
}

# Python blocks that run with names the text around them gives: (first line, prelude).
PRELUDES: dict[tuple[str, int], tuple[str, str]] = {
    ("docs/storage.md", 0): ('RunConfig(storage_path="s3://bucket/experiments", name="resnet",',
                             "from elastic_train import RunConfig\n"),
    ("docs/storage.md", 1): ("from elastic_train.torch import TorchTrainer",
                             "path = 'no-such-run'  # a run directory\n"),
}

# Python blocks that are a script for `elastic-train launch`: (first line, prelude); an
# e2e test runs each under `launch --standalone --nproc-per-node 2`.
LAUNCH_SCRIPTS: dict[tuple[str, int], tuple[str, str]] = {
    ("docs/fault-tolerance.md", 0): ("@elastic_train.restart_in_process",
                                     "import elastic_train\nimport torch.distributed as dist\n"),
}


def calls_fit(block: DocBlock) -> bool:
    """Whether a python block trains: builds a ``TorchTrainer`` and fits it (a
    multi-process run: an e2e test runs it). A ``restore(path).fit()`` of no run does not."""
    return "TorchTrainer(" in block.code and ".fit()" in block.code


def runnable(language: str, with_fit: bool | None = None) -> list[DocBlock]:
    """The blocks of ``language`` that a test runs (for python: those that call ``fit()``
    or not, when ``with_fit`` says which)."""
    return [block for block in doc_blocks() if block.language == language
            and block.key not in NOT_RUN and block.key not in LAUNCH_SCRIPTS
            and (with_fit is None or calls_fit(block) == with_fit)]


def run_python_block(block: DocBlock, directory: pathlib.Path, timeout_s: float) -> None:
    """Runs a python block (after its PRELUDES entry) as a user's script would run: in a
    process of its own, in ``directory``, with HOME there (where runs go by default);
    fails with its output unless it exits 0."""
    done = subprocess.run([sys.executable, "-c", with_prelude(block)], cwd=directory,
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "HOME": str(directory)})
    assert done.returncode == 0, f"{block}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}"


def with_prelude(block: DocBlock) -> str:
    """The block's code after the names the text around it gives (PRELUDES,
    LAUNCH_SCRIPTS)."""
    prelude = {**PRELUDES, **LAUNCH_SCRIPTS}.get(block.key, ("", ""))[1]
    return prelude + block.code

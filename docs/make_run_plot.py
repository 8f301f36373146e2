"""Makes docs/run_plot.png, the picture of a run that `elastic-train show RUN --plot` draws,
from a real run of examples/digits.py whose last rank crashes after its 8th report (the
crash `elastic-train verify-resume` injects; the run restarts from its checkpoint).

    python docs/make_run_plot.py [--epochs 20] [--storage-path /tmp/run-plot]

Needs the `plot` extra (matplotlib) and the examples' (`pip install -e '.[plot,examples]'`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from elastic_train._internal import env_vars

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "digits-faulted"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--storage-path", default="/tmp/run-plot")
    parser.add_argument("--out", default=os.path.join(HERE, "run_plot.png"))
    args = parser.parse_args()
    env = {**os.environ, env_vars.FAIL_AT_REPORT: "8"}
    subprocess.run([sys.executable, os.path.join(HERE, "..", "examples", "digits.py"),
                    "--epochs", str(args.epochs), "--storage-path", args.storage_path,
                    "--name", NAME, "--max-failures", "1"], env=env, check=True)
    subprocess.run([sys.executable, "-m", "elastic_train.cli", "show",
                    os.path.join(args.storage_path, NAME), "--plot", args.out], check=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

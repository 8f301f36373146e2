"""Ray Train's "Inspecting Training Results" guide with the imports changed.

The guide's snippets (from Ray's ``key_concepts`` doc code) on a run of 2 workers
that reports 3 checkpoints: ``Result.metrics``, ``metrics_dataframe``,
``checkpoint``, ``best_checkpoints``, ``path`` and ``filesystem``,
``Result.from_path`` and ``Result.error`` of a run that failed.

What differs from the guide besides the imports, and why: the guide builds Ray v2's
``DataParallelTrainer`` from ``ray.train.v2.api.data_parallel_trainer`` (an internal
path); here the trainer of a plain train function is ``TorchTrainer``. ``filesystem``
is an fsspec filesystem, not ``pyarrow.fs.FileSystem``. The failed run raises
``TrainingFailedError`` whose ``failures`` list the workers' errors (Ray's subclass
``WorkerGroupError`` with ``worker_failures`` has no counterpart yet).

    python examples/ray_guide_results.py --storage-path /tmp/results
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import elastic_train as train  # was: import ray.train
from elastic_train.torch import TorchTrainer  # was: ...v2.api.data_parallel_trainer import


def _files(directory: str) -> list[str]:
    """The checkpoint's files (not our commit marker, ``.commit.json``)."""
    return sorted(p.name for p in Path(directory).iterdir() if not p.name.startswith("."))


def train_fn(config):
    for i in range(3):
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            Path(temp_checkpoint_dir).joinpath("model.pt").touch()
            train.report(
                {"loss": i},
                checkpoint=train.Checkpoint.from_directory(temp_checkpoint_dir),
            )


def error_train_fn(config):
    raise RuntimeError("Simulated training error")


def inspect_results(run_config: train.RunConfig) -> dict[str, Any]:
    """The guide's snippets, in its order; returns what they printed, for the tests."""
    seen: dict[str, Any] = {}
    trainer = TorchTrainer(
        train_fn, scaling_config=train.ScalingConfig(num_workers=2), run_config=run_config
    )

    # Last reported metrics
    result = trainer.fit()
    print("Observed metrics:", result.metrics)
    seen["metrics"] = result.metrics

    # Dataframe of all reported metrics
    df = result.metrics_dataframe
    print("Minimum loss", min(df["loss"]))
    seen["minimum_loss"] = min(df["loss"])

    # Last saved checkpoint
    print("Last checkpoint:", result.checkpoint)
    with result.checkpoint.as_directory() as tmpdir:
        # Load model from directory
        seen["last_files"] = _files(tmpdir)

    # Other checkpoints
    for checkpoint, metrics in result.best_checkpoints:
        print("Loss", metrics["loss"], "checkpoint", checkpoint)

    # Get checkpoint with minimal loss
    best_checkpoint = min(
        result.best_checkpoints, key=lambda checkpoint: checkpoint[1]["loss"]
    )[0]
    with best_checkpoint.as_directory() as tmpdir:
        # Load model from directory
        seen["best_files"] = _files(tmpdir)
    seen["best_path"] = best_checkpoint.path

    # Accessing storage location
    result_path: str = result.path
    result_filesystem = result.filesystem
    print(f"Results location (fs, path) = ({result_filesystem}, {result_path})")
    seen["path"] = result_path

    # Restore a result
    restored_result = train.Result.from_path(result_path)
    print("Restored loss", result.metrics["loss"])
    seen["restored_loss"] = restored_result.metrics["loss"]

    # Viewing errors
    trainer = TorchTrainer(
        error_train_fn, scaling_config=train.ScalingConfig(num_workers=1),
        run_config=train.RunConfig(name=f"{run_config.name}_error",
                                   storage_path=run_config.storage_path,
                                   start_over=run_config.start_over),
    )
    try:
        result = trainer.fit()
    except train.TrainingFailedError as e:
        print(e.failures)
        seen["failures"] = e.failures
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    inspect_results(train.RunConfig(name="results", storage_path=args.storage_path,
                                    start_over=True))


if __name__ == "__main__":
    main()

"""Ray Train's checkpointing guide ("Saving and Loading Checkpoints") with the imports changed.

Each part of the guide is a function here, run by ``main()`` (and by
``tests/e2e/test_ray_guide_ports.py``) on 2 CPU workers, offline, on the guide's own
toy data (random tensors made in the train function):

- ``run_save``: rank 0 saves the DDP model and reports it every ``checkpoint_freq`` epochs;
- ``run_restore``: model, optimizer and epoch restored from ``get_checkpoint()`` after the
  guide's intentional error at epoch 1 (``FailureConfig(max_failures=1)``);
- ``run_distributed``: every rank saves ``model-rank={rank}.pt`` into one checkpoint;
- ``inspect_checkpoint``: a checkpoint of a local directory, read with ``as_directory`` and
  ``to_directory``;
- ``run_upload_modes``: ``CheckpointUploadMode.SYNC`` from a ``TemporaryDirectory``,
  ``ASYNC`` from ``mkdtemp()``;
- ``run_no_upload``: every rank writes its DCP shards straight into the run directory
  and reports it with ``NO_UPLOAD``;
- ``run_custom_upload``: ``dcp.async_save`` writes into the run directory in the
  background, and ``report(checkpoint_upload_fn=...)`` hands over a function that waits
  for it (ASYNC: it runs off the training thread, and the commit follows it);
- ``run_all_reported``: ``get_all_reported_checkpoints()`` with ``COMMITTED`` and with the
  default, ``VALIDATED`` (which waits for the validations).

What differs from the guide besides the imports, and why: ``s3torchconnector``'s
``S3StorageWriter`` becomes torch's own ``FileSystemWriter`` on the run's local path (no
S3 here); ``storage_path="s3://bucket/"`` becomes a local path; the validation
function the guide leaves as ``...`` is a small one; the Lightning and Transformers
parts are ``examples/lightning_digits.py`` and ``examples/transformers_tiny.py``;
the background saves of ``run_custom_upload`` talk over a gloo group of their own
(``_save_group``), as DCP advises for gloo, and each waits for the one before it: two
saves in flight on one group interleave their collectives in an order that may differ
between the ranks, and hang (seen once the zygote's standby made one rank start a few
milliseconds sooner; torchtitan waits likewise).

    python examples/ray_guide_checkpoints.py --storage-path /tmp/results
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.checkpoint.state_dict_saver import async_save, save
from torch.optim import Adam

import elastic_train as train  # was: from ray import train
import elastic_train.torch  # was: import ray.train.torch
from elastic_train import Checkpoint, ScalingConfig  # was: from ray.train import ...
from elastic_train.torch import TorchTrainer  # was: from ray.train.torch import ...


def save_train_func(config):
    n = 100
    # create a toy dataset
    # data   : X - dim = (n, 4)
    # target : Y - dim = (n, 1)
    X = torch.Tensor(np.random.normal(0, 1, size=(n, 4)))
    Y = torch.Tensor(np.random.uniform(0, 1, size=(n, 1)))
    # toy neural network : 1-layer
    # Wrap the model in DDP
    model = elastic_train.torch.prepare_model(nn.Linear(4, 1))
    criterion = nn.MSELoss()

    optimizer = Adam(model.parameters(), lr=3e-4)
    for epoch in range(config["num_epochs"]):
        y = model.forward(X)
        loss = criterion(y, Y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        metrics = {"loss": loss.item()}

        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None

            should_checkpoint = epoch % config.get("checkpoint_freq", 1) == 0
            # In standard DDP training, where the model is the same across all ranks,
            # only the global rank 0 worker needs to save and report the checkpoint
            if train.get_context().get_world_rank() == 0 and should_checkpoint:
                torch.save(
                    model.module.state_dict(),  # NOTE: Unwrap the model.
                    os.path.join(temp_checkpoint_dir, "model.pt"),
                )
                checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)

            train.report(metrics, checkpoint=checkpoint)


def run_save(run_config: train.RunConfig) -> train.Result:
    trainer = TorchTrainer(
        save_train_func,
        train_loop_config={"num_epochs": 5},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=run_config,
    )
    return trainer.fit()


def restore_train_func(config):
    n = 100
    X = torch.Tensor(np.random.normal(0, 1, size=(n, 4)))
    Y = torch.Tensor(np.random.uniform(0, 1, size=(n, 1)))
    model = nn.Linear(4, 1)
    optimizer = Adam(model.parameters(), lr=3e-4)
    criterion = nn.MSELoss()

    # Wrap the model in DDP and move it to GPU.
    model = elastic_train.torch.prepare_model(model)

    # ====== Resume training state from the checkpoint. ======
    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            model_state_dict = torch.load(
                os.path.join(checkpoint_dir, "model.pt"),
                # map_location=...,  # Load onto a different device if needed.
            )
            model.module.load_state_dict(model_state_dict)
            optimizer.load_state_dict(
                torch.load(os.path.join(checkpoint_dir, "optimizer.pt"))
            )
            start_epoch = (
                torch.load(os.path.join(checkpoint_dir, "extra_state.pt"))["epoch"] + 1
            )
    # ========================================================

    for epoch in range(start_epoch, config["num_epochs"]):
        y = model.forward(X)
        loss = criterion(y, Y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        metrics = {"loss": loss.item(), "start_epoch": start_epoch}

        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            checkpoint = None

            should_checkpoint = epoch % config.get("checkpoint_freq", 1) == 0
            if train.get_context().get_world_rank() == 0 and should_checkpoint:
                # === Make sure to save all state needed for resuming training ===
                torch.save(
                    model.module.state_dict(),  # NOTE: Unwrap the model.
                    os.path.join(temp_checkpoint_dir, "model.pt"),
                )
                torch.save(
                    optimizer.state_dict(),
                    os.path.join(temp_checkpoint_dir, "optimizer.pt"),
                )
                torch.save(
                    {"epoch": epoch},
                    os.path.join(temp_checkpoint_dir, "extra_state.pt"),
                )
                # ================================================================
                checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)

            train.report(metrics, checkpoint=checkpoint)

        if epoch == 1:
            raise RuntimeError("Intentional error to showcase restoration!")


def run_restore(run_config: train.RunConfig) -> train.Result:
    trainer = TorchTrainer(
        restore_train_func,
        train_loop_config={"num_epochs": 5},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=dataclasses.replace(  # the guide's RunConfig(failure_config=...)
            run_config, failure_config=train.FailureConfig(max_failures=1)),
    )
    return trainer.fit()


def distributed_train_func(config):
    metrics = {"loss": 0.1}
    with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
        rank = train.get_context().get_world_rank()
        torch.save(
            {"rank": rank},
            os.path.join(temp_checkpoint_dir, f"model-rank={rank}.pt"),
        )
        checkpoint = Checkpoint.from_directory(temp_checkpoint_dir)

        train.report(metrics, checkpoint=checkpoint)


def run_distributed(run_config: train.RunConfig) -> train.Result:
    trainer = TorchTrainer(
        distributed_train_func,
        scaling_config=train.ScalingConfig(num_workers=2),
        run_config=run_config,
    )
    # The checkpoint in storage will contain: model-rank=0.pt, model-rank=1.pt
    return trainer.fit()


def inspect_checkpoint(directory: str) -> list[str]:
    # For demonstration, create a locally available directory with a `model.pt` file.
    example_checkpoint_dir = Path(directory)
    example_checkpoint_dir.mkdir()
    example_checkpoint_dir.joinpath("model.pt").touch()

    # Create the checkpoint, which is a reference to the directory.
    checkpoint = Checkpoint.from_directory(example_checkpoint_dir)

    # Inspect the checkpoint's contents with either `as_directory` or `to_directory`:
    with checkpoint.as_directory() as checkpoint_dir:
        assert Path(checkpoint_dir).joinpath("model.pt").exists()

    checkpoint_dir = checkpoint.to_directory()
    assert Path(checkpoint_dir).joinpath("model.pt").exists()
    return sorted(os.listdir(checkpoint_dir))


def upload_modes_train_fn(config):
    metrics = {"mode": "SYNC"}
    with tempfile.TemporaryDirectory() as tmpdir:
        torch.save({"w": 1}, os.path.join(tmpdir, "model.pt"))  # Save checkpoint to tmpdir
        checkpoint = Checkpoint.from_directory(tmpdir)
        train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_upload_mode=train.CheckpointUploadMode.SYNC,
        )

    metrics = {"mode": "ASYNC"}
    tmpdir = tempfile.mkdtemp()
    torch.save({"w": 2}, os.path.join(tmpdir, "model.pt"))  # Save checkpoint to tmpdir
    checkpoint = Checkpoint.from_directory(tmpdir)
    train.report(
        metrics,
        checkpoint=checkpoint,
        checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
    )
    return os.path.exists(tmpdir)  # ASYNC deletes it once staged (Ray's default)


def run_upload_modes(run_config: train.RunConfig) -> train.Result:
    return TorchTrainer(upload_modes_train_fn, scaling_config=ScalingConfig(num_workers=2),
                        run_config=run_config).fit()


def _model_and_optimizer():
    model = elastic_train.torch.prepare_model(nn.Linear(4, 1))
    return model, Adam(model.parameters(), lr=3e-4)


def no_upload_train_fn(config):
    for epoch in range(config["num_epochs"]):
        # Directly write the checkpoint into the run directory with Torch
        model, optimizer = _model_and_optimizer()
        storage_context = train.get_context().get_storage()
        checkpoint_path = storage_context.build_checkpoint_path_from_name(str(epoch))
        storage_writer = FileSystemWriter(checkpoint_path)
        model_dict, opt_dict = get_state_dict(model=model, optimizers=optimizer)
        save(
            {"model": model_dict, "opt": opt_dict},
            storage_writer=storage_writer,
        )

        # Report that checkpoint to elastic-train
        metrics = {"epoch": epoch}
        checkpoint = Checkpoint(checkpoint_path)
        train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_upload_mode=train.CheckpointUploadMode.NO_UPLOAD,
        )


def run_no_upload(run_config: train.RunConfig) -> train.Result:
    return TorchTrainer(no_upload_train_fn,
                        train_loop_config={"num_epochs": 2},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=run_config).fit()


def custom_upload_train_fn(config):
    ckpt_ref = None
    for epoch in range(config["num_epochs"]):
        model, optimizer = _model_and_optimizer()
        # Start the checkpoint save into the run directory in the background
        storage_context = train.get_context().get_storage()
        checkpoint_path = storage_context.build_checkpoint_path_from_name(str(epoch))
        storage_writer = FileSystemWriter(checkpoint_path)
        model_dict, opt_dict = get_state_dict(model=model, optimizers=optimizer)
        if ckpt_ref is not None:  # one save in flight: two would interleave their collectives
            ckpt_ref.result()
        ckpt_ref = async_save(
            {"model": model_dict, "opt": opt_dict},
            storage_writer=storage_writer,
            process_group=_save_group(),  # gloo: a group of its own, off the training's
        )

        # (ckpt_ref bound now: the function runs after report() returns, maybe next epoch)
        def wait_async_save(checkpoint, checkpoint_dir_name, ckpt_ref=ckpt_ref):
            # This function waits for checkpoint to be finalized before returning it as is
            ckpt_ref.result()
            return checkpoint

        # elastic-train runs the function off the training thread, then commits the checkpoint
        metrics = {"epoch": epoch}
        train.report(
            metrics,
            checkpoint=Checkpoint(checkpoint_path),
            checkpoint_upload_fn=wait_async_save,
            checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC,
        )


_SAVE_GROUP = []


def _save_group():
    """The process group the background saves talk over (made once, on every rank): the
    guide's NCCL job saves over the default group, but gloo runs one collective at a time
    per group, and the next epoch's DDP broadcast would meet the save's own."""
    if not _SAVE_GROUP:
        _SAVE_GROUP.append(torch.distributed.new_group(backend="gloo"))
    return _SAVE_GROUP[0]


def run_custom_upload(run_config: train.RunConfig) -> train.Result:
    return TorchTrainer(custom_upload_train_fn,
                        train_loop_config={"num_epochs": 2},
                        scaling_config=ScalingConfig(num_workers=2),
                        run_config=run_config).fit()


def loss_of(checkpoint: Checkpoint, offset: float = 0.0) -> dict:
    """The validation function of the last part (the guide leaves it as ``...``)."""
    with checkpoint.as_directory() as d:
        return {"val/loss": torch.load(os.path.join(d, "state.pt"))["epoch"] + offset}


def all_reported_train_fn():
    for epoch in range(2):
        metrics = {"train/loss": 0.1}
        checkpoint = None
        if train.get_context().get_world_rank() == 0:
            checkpoint = Checkpoint.from_directory(tempfile.mkdtemp())
            torch.save({"epoch": epoch}, os.path.join(checkpoint.path, "state.pt"))
        train.report(
            metrics,
            checkpoint=checkpoint,
            validation=checkpoint is not None,
        )

    # Get committed checkpoints which may still have ongoing validations.
    committed_checkpoints = train.get_all_reported_checkpoints(
        consistency_mode=train.CheckpointConsistencyMode.COMMITTED)

    # Wait for all pending validations to finish to access reported checkpoints
    # with validation metrics attached.
    validated_checkpoints = train.get_all_reported_checkpoints()
    return {"committed": [(c.status.value, c.metrics.get("val/loss"))
                          for c in committed_checkpoints],
            "validated": [(c.status.value, c.metrics.get("val/loss"))
                          for c in validated_checkpoints]}


def run_all_reported(run_config: train.RunConfig) -> train.Result:
    return TorchTrainer(all_reported_train_fn, scaling_config=ScalingConfig(num_workers=2),
                        validation_config=train.ValidationConfig(loss_of),
                        run_config=run_config).fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()

    def run(name: str) -> train.RunConfig:
        return train.RunConfig(name=name, storage_path=args.storage_path, start_over=True)

    print("save:", run_save(run("save")).checkpoint)
    print("restore:", run_restore(run("restore")).metrics_dataframe[["loss", "start_epoch"]])
    print("distributed:", sorted(os.listdir(run_distributed(run("distributed")).checkpoint
                                            .to_directory())))
    print("inspect:", inspect_checkpoint(os.path.join(tempfile.mkdtemp(), "test-checkpoint")))
    print("upload modes:", run_upload_modes(run("upload_modes")).metrics)
    print("no_upload:", run_no_upload(run("no_upload")).checkpoint)
    print("custom upload:", run_custom_upload(run("custom_upload")).checkpoint)
    print("all reported:", run_all_reported(run("all_reported")).return_value)


if __name__ == "__main__":
    main()

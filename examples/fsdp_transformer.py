"""Train a small decoder-only transformer with FSDP2 and sharded (DCP) checkpoints.

Runs offline on CPU (gloo) in about a minute; on GPUs with --use-gpu (nccl). It shows:

* FSDP2: ``fully_shard`` on every transformer block, then on the whole model
  (torchtitan's recipe); each rank holds 1/N of the weights and optimizer state;
* sharded checkpoints: every rank saves its shards with ``torch.distributed.checkpoint``
  into a directory of its own and reports it; the committed checkpoint holds every
  rank's ``__<rank>_0.distcp`` plus rank 0's ``.metadata``. With ``dcp.async_save``
  the loop blocks only while the state is copied to host memory: ``report()``
  returns at once and the files are written, uploaded and committed in the background;
* resume: ``dcp.load`` through ``elastic_train.torch.CheckpointReader``, which reads
  ``.metadata`` and this rank's byte ranges only -- from the node's local copy after
  a worker restart, from the store otherwise;
* a worker SIGKILLed at --kill-at-step: the group restarts from the last checkpoint;
* resharding: a second run with --reshard-to workers starts from the first run's
  final checkpoint (``resume_from_checkpoint``); DCP reshards the state to the new
  world size, which a single ``torch.save`` file per rank could not do.

    python examples/fsdp_transformer.py                       # 2 workers, then 1
    python examples/fsdp_transformer.py --storage-path s3://bucket/runs --num-workers 4
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import tempfile
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import elastic_train
from elastic_train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from elastic_train.torch import CheckpointReader, TorchTrainer, get_device


@dataclass
class ModelArgs:
    vocab_size: int = 256
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 64


def rope(seq_len: int, head_dim: int) -> torch.Tensor:
    """Rotary position embedding as complex rotations, (seq_len, head_dim / 2)."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(seq_len).float(), inv_freq)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rope(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    rotated = pairs * freqs[: x.shape[1]].view(1, x.shape[1], 1, -1)
    return torch.view_as_real(rotated).flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_heads, self.head_dim = args.n_heads, args.dim // args.n_heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(args.dim, args.dim, bias=False)
                                              for _ in range(4))

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = (w(x).view(batch, seq, self.n_heads, self.head_dim)
                   for w in (self.wq, self.wk, self.wv))
        q, k = apply_rope(q, freqs), apply_rope(k, freqs)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                             v.transpose(1, 2), is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    """SwiGLU, as in Llama and torchtitan."""

    def __init__(self, dim: int):
        super().__init__()
        hidden = 4 * dim * 2 // 3
        self.w1, self.w3 = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.attention_norm, self.ffn_norm = nn.RMSNorm(args.dim), nn.RMSNorm(args.dim)
        self.attention, self.feed_forward = Attention(args), FeedForward(args.dim)

    def forward(self, x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), freqs)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args) for _ in range(args.n_layers))
        self.norm = nn.RMSNorm(args.dim)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.register_buffer("freqs", rope(args.seq_len, args.dim // args.n_heads),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, self.freqs)
        return self.output(self.norm(x))


def shard(model: Transformer, device: torch.device) -> Transformer:
    """FSDP2, torchtitan's way: each block is a unit of its own, then the root."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (elastic_train.get_context().get_world_size(),))
    model = model.to(device)
    for block in model.layers:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def synthetic_batch(step: int, rank: int, args: ModelArgs, batch: int,
                    device: torch.device) -> torch.Tensor:
    """Counting sequences: a random start and stride, then token[t+1] = token[t] + stride.
    A model that learns the rule predicts every token after the second one."""
    gen = torch.Generator().manual_seed(step * 1009 + rank)
    start = torch.randint(0, args.vocab_size, (batch, 1), generator=gen)
    stride = torch.randint(1, 8, (batch, 1), generator=gen)
    return ((start + stride * torch.arange(args.seq_len + 1)) % args.vocab_size).to(device)


def state_of(model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> dict:
    """The sharded state DCP saves and loads: each rank's part of model and optimizer."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state, "step": step}


def restore(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Loads the latest checkpoint, resharded to this world size; returns its step."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    checkpoint = elastic_train.get_checkpoint()
    if checkpoint is None:
        return 0
    state = state_of(model, optimizer, 0)  # the shapes to fill, on this world size
    reader = CheckpointReader(checkpoint)
    dcp.load(state, storage_reader=reader)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    rank = elastic_train.get_context().get_world_rank()
    print(f"rank {rank}: resumed at step {state['step']} from {checkpoint.path} "
          f"({reader.bytes_fetched / 2**20:.2f} MiB fetched, "
          f"{reader.bytes_local / 2**20:.2f} MiB read from local disk)")
    return state["step"]


class ShardedCheckpointer:
    """Saves every rank's shards with ``dcp.async_save`` and reports them.

    The background writes run collectives of their own, so they get a gloo
    group the training does not use, and one save finishes before the next starts.
    """

    def __init__(self, use_async: bool):
        import torch.distributed as dist

        self.group = dist.new_group(backend="gloo") if use_async else None
        self.pending = None

    def report(self, metrics: dict, state: dict) -> None:
        import torch.distributed.checkpoint as dcp

        directory = tempfile.mkdtemp(prefix="fsdp_ckpt_")
        if self.group is None:
            dcp.save(state, checkpoint_id=directory)
            elastic_train.report(metrics, checkpoint=Checkpoint.from_directory(directory))
            return  # report() copied the files; the directory is ours to delete
        if self.pending is not None:
            self.pending.result()
        self.pending = dcp.async_save(state, checkpoint_id=directory, process_group=self.group)
        elastic_train.report(metrics, checkpoint=Checkpoint.from_directory(
            directory, written=self.pending))  # taken over: uploaded once written


def train_func(config: dict) -> float:
    torch.manual_seed(0)  # the same initial weights on every rank before sharding
    args, device = ModelArgs(), get_device()
    model = shard(Transformer(args), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config["lr"])
    step = restore(model, optimizer)
    checkpointer = ShardedCheckpointer(config["async_save"])
    ctx = elastic_train.get_context()
    loss = torch.tensor(math.log(args.vocab_size))
    while step < config["steps"]:
        tokens = synthetic_batch(step, ctx.get_world_rank(), args, config["batch"], device)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step == config["kill_at_step"] and ctx.get_world_rank() == 1 \
                and not os.path.exists(config["kill_marker"]):
            open(config["kill_marker"], "w").close()
            print(f"rank 1: killing myself at step {step} (a simulated crash)", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        metrics = {"loss": loss.item(), "step": step}
        if step % config["checkpoint_every"] == 0 or step == config["steps"]:
            checkpointer.report(metrics, state_of(model, optimizer, step))
            if ctx.get_world_rank() == 0:
                print(f"step {step}: loss {loss.item():.3f} (checkpoint on {ctx.get_world_size()}"
                      " worker(s))")
        elif step % 10 == 0:
            elastic_train.report(metrics)
    return loss.item()


def fit(args: argparse.Namespace, workers: int, steps: int, resume_from: Checkpoint | None,
        kill_at_step: int, marker: str) -> elastic_train.Result:
    return TorchTrainer(
        train_func,
        train_loop_config={"steps": steps, "lr": args.lr, "batch": args.batch,
                           "checkpoint_every": args.checkpoint_every,
                           "async_save": not args.sync_save, "kill_at_step": kill_at_step,
                           "kill_marker": marker},
        scaling_config=ScalingConfig(num_workers=workers, use_gpu=args.use_gpu),
        run_config=RunConfig(storage_path=args.storage_path,
                             failure_config=FailureConfig(max_failures=2)),
        resume_from_checkpoint=resume_from,
    ).fit()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--reshard-to", type=int, default=1,
                        help="workers of the second run, which continues from the first's "
                             "final checkpoint (0: no second run)")
    parser.add_argument("--more-steps", type=int, default=20, help="steps of the second run")
    parser.add_argument("--kill-at-step", type=int, default=30,
                        help="rank 1 kills itself once at this step (0: never)")
    parser.add_argument("--checkpoint-every", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8, help="sequences per worker and step")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sync-save", action="store_true",
                        help="dcp.save (blocking) instead of dcp.async_save")
    parser.add_argument("--use-gpu", action="store_true", help="one GPU per worker (nccl)")
    parser.add_argument("--storage-path", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        marker = os.path.join(scratch, "killed")
        first = fit(args, args.num_workers, args.steps, None, args.kill_at_step, marker)
        print(f"run 1: loss {first.metrics['loss']:.3f} after {args.steps} steps on "
              f"{args.num_workers} workers; {first.checkpoint}")
        if args.reshard_to:
            second = fit(args, args.reshard_to, args.steps + args.more_steps, first.checkpoint,
                         0, marker)
            print(f"run 2: loss {second.metrics['loss']:.3f} after "
                  f"{args.steps + args.more_steps} steps on {args.reshard_to} worker(s), "
                  f"resharded from {args.num_workers}; {second.checkpoint}")


if __name__ == "__main__":
    main()

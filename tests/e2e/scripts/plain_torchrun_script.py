"""A plain torchrun script (no elastic_train import): prints torchrun's variables."""

import os

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
        "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS")

if __name__ == "__main__":
    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    missing = [k for k in KEYS if k not in os.environ]
    print(f"ENV rank={os.environ['RANK']} world={os.environ['WORLD_SIZE']} "
          f"sum={int(total.item())} missing={missing} role={os.environ['ROLE_NAME']}",
          flush=True)
    dist.destroy_process_group()

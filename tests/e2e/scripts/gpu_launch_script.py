"""A launched script on nccl whose main is wrapped by ``@elastic_train.restart_in_process``.

    elastic-train launch --nproc-per-node gpu ... gpu_launch_script.py OUT cuda [--crash]

Each rank takes the GPU of its ``LOCAL_RANK``, joins an nccl process group, all-reduces
a CUDA tensor and writes ``OUT/rank-R-attempt-A-pid-P`` holding the sum, the backend
and the device's name. With ``--crash`` rank 0 raises after that in attempt 0 while the
others wait in a barrier: the restart in process must abort their nccl communicators,
and every rank must make new ones and all-reduce again. ``cpu`` instead of ``cuda``
runs the same on gloo (to check the script where there is no GPU).
"""

import os
import sys

import torch
import torch.distributed as dist

import elastic_train


@elastic_train.restart_in_process
def main(out: str, device: str, crash: bool) -> None:
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, attempt = dist.get_rank(), int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    total = torch.full((1,), float(rank + 1),
                       device=torch.device("cuda", torch.cuda.current_device()) if cuda
                       else "cpu")
    dist.all_reduce(total)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    with open(os.path.join(out, f"rank-{rank}-attempt-{attempt}-pid-{os.getpid()}"), "w") as f:
        f.write(f"{total.item():g} {dist.get_backend()} {name}")
    if crash and attempt == 0 and rank == 0:
        raise RuntimeError("crash in attempt 0")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--crash" in sys.argv[3:])

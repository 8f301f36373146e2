"""A launched script: each rank writes ``rank-R-pid-P`` holding ``bad`` if torch marked
its process a bad fork (its CUDA would not start), else ``clean``.
Usage: elastic-train launch ... fork_poison_script.py OUT"""

import os
import sys

import torch

with open(os.path.join(sys.argv[1], f"rank-{os.environ['RANK']}-pid-{os.getpid()}"), "w") as f:
    f.write("bad" if torch.cuda._is_in_bad_fork() else "clean")

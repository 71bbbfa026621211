"""A rank of bench/launch_latency's PyTorch job: joins the process group the env://
way, then writes the time it got past init_process_group to DIR/$RANK.t."""
import os
import sys
import time

import torch.distributed as dist

dist.init_process_group(backend="gloo", init_method="env://")
now = time.time_ns()
with open(os.path.join(sys.argv[1], os.environ["RANK"] + ".t"), "w") as f:
    f.write(f"{now}\n")
dist.barrier()
dist.destroy_process_group()

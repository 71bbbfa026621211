# What one rank sees, written to OUT/TAG-rank-R.json: its whole environment, its working
# directory, and torch.distributed's own view once init_process_group(gloo, env://)
# formed the group. Run by torchrun and by corral alike, so the two can be compared.
import datetime
import json
import os
import sys

import torch.distributed as dist

out, tag = sys.argv[1], sys.argv[2]
# A minute, not the default half hour: a store that never answers fails the run in time.
dist.init_process_group(backend="gloo", init_method="env://", timeout=datetime.timedelta(seconds=60))
view = {
    "rank": dist.get_rank(),
    "world_size": dist.get_world_size(),
    "env": dict(os.environ),
    "cwd": os.getcwd(),
}
dist.barrier()
with open(os.path.join(out, "%s-rank-%d.json" % (tag, view["rank"])), "w") as f:
    json.dump(view, f)
dist.destroy_process_group()

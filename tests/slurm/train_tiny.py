"""A team's training script in miniature, for the exported launch_slurm.sbatch: it takes
`--deepspeed_config`, hands it to deepspeed.initialize and trains a small MLP a few steps on
CPU (gloo), leaves one JSON report per rank in $TINY_TRAIN_OUT, and ends as the runbook's
"What the training script must do" says (barrier, then destroy the process group: without it a
gloo rank aborted in its destructor after the last step and SLURM recorded the job FAILED)."""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")
import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

STEPS = 3

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int, default=-1)
args = deepspeed.add_config_arguments(parser).parse_args()
config = json.loads(Path(args.deepspeed_config).read_text())
# FusedAdam is a CUDA op: on CPU, DeepSpeed's optimizer block falls back to torch's AdamW.
config.setdefault("optimizer", {"type": "AdamW", "params": {}})["params"]["torch_adam"] = True

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
dtype = next(engine.module.parameters()).dtype
losses = []
for _ in range(STEPS * engine.gradient_accumulation_steps()):
    x = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, dtype=dtype)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
rank = dist.get_rank()
report = {"rank": rank, "world": dist.get_world_size(), "global_steps": engine.global_steps,
          "zero_stage": engine.zero_optimization_stage(), "loss": losses[-1]}
Path(os.environ["TINY_TRAIN_OUT"], f"rank{rank}.json").write_text(json.dumps(report))
print(f"tiny-train rank {rank}: {engine.global_steps} steps, loss {losses[-1]:.4f}", flush=True)
dist.barrier()
dist.destroy_process_group()

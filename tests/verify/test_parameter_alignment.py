"""DeepSpeed's `zero_optimization.parameter_alignment`, which zlayout's ds_config sets where a
grouped-experts weight would land off a 16-byte boundary (tests/profile/test_ds_config.py), does
what the plan takes it to: a real ZeRO-2 engine (CPU, gloo) packs a 2-element tensor and a 3-D
expert weight after it into its flat buffer 4 bytes off a boundary without it, on one with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from zlayout.verify.launcher import free_port

pytestmark = pytest.mark.slow

ENGINE = textwrap.dedent("""
    import json, os, sys
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed, torch

    class Block(torch.nn.Module):  # zaya's order: a 2-element norm scale, then the experts
        def __init__(self):
            super().__init__()
            self.temp = torch.nn.Parameter(torch.ones(2))
            self.experts = torch.nn.Parameter(torch.randn(4, 8, 8))

        def forward(self, x):
            return (x @ self.experts[0] * self.temp[0]).sum()

    deepspeed.init_distributed(dist_backend="gloo")
    model = Block()
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 2, "parameter_alignment": sys.argv[1] == "aligned"}}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    loss = engine(torch.randn(1, 8, dtype=torch.bfloat16))
    engine.backward(loss)
    engine.step()
    print(json.dumps({"experts_offset": engine.module.experts.data_ptr() % 16,
                      "temp_offset": engine.module.temp.data_ptr() % 16}))
""")


@pytest.mark.parametrize(("flag", "experts_offset"), [("packed", 4), ("aligned", 0)])
def test_deepspeed_pads_each_tensor_to_16_bytes_only_when_asked(tmp_path, flag, experts_offset):
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), DS_ACCELERATOR="cpu")
    run = subprocess.run([sys.executable, "-c", ENGINE, flag], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    offsets = json.loads(run.stdout.strip().splitlines()[-1])
    assert offsets == {"experts_offset": experts_offset, "temp_offset": 0}

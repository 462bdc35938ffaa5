#!/usr/bin/env bash
# ZeRO-1 opt→cpu for llama3-8b on 1x h200
# Launch with DeepSpeed's launcher (`deepspeed`). Written by zlayout 0.1.0 from profile.toml (llama3-8b-1xh200-offload);
# re-export the profile rather than editing this file by hand.
#
# It runs YOUR training script: TRAIN_SCRIPT (default train.py) with
#   --deepspeed_config ds_config.json
# and any arguments given to this script. The training script must pass that file to
# deepspeed.initialize (deepspeed.add_config_arguments(parser) adds the flag).
# Hardware: 1 node(s) x 1 h200 GPUs = 1 processes.
set -euo pipefail
PROFILE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CONFIG="${DS_CONFIG:-$PROFILE_DIR/ds_config.json}"
# One rank per GPU: each gets its share of the node's cores (the launchers' default is 1).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / 1 > 0 ? $(nproc) / 1 : 1 ))}"
# Offload: PyTorch puts host tensors of 2 MiB or more on huge pages (the step's fresh host
# copies are not faulted in 4 KiB at a time); verify measured the step this way.
export THP_MEM_ALLOC_ENABLE="${THP_MEM_ALLOC_ENABLE:-1}"
TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"

exec deepspeed --num_gpus 1 --master_port "${MASTER_PORT:-29500}" \
    "$TRAIN_SCRIPT" --deepspeed_config "$DS_CONFIG" "$@"

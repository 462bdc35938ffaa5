#!/usr/bin/env bash
# ZeRO-3 for llama3-70b on 8 nodes of 8x h100
# Launch with DeepSpeed's launcher (`deepspeed`). Written by zlayout 0.1.0 from profile.toml (llama3-70b-64xh100);
# re-export the profile rather than editing this file by hand.
#
# It runs YOUR training script: TRAIN_SCRIPT (default train.py) with
#   --deepspeed_config ds_config.json
# and any arguments given to this script. The training script must pass that file to
# deepspeed.initialize (deepspeed.add_config_arguments(parser) adds the flag).
# Hardware: 8 node(s) x 8 h100 GPUs = 64 processes.
# Multi-node: HOSTFILE lists one node per line as 'hostname slots=GPUS'
# (8 lines, slots=8); the launcher reaches the nodes over ssh.
set -euo pipefail
PROFILE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CONFIG="${DS_CONFIG:-$PROFILE_DIR/ds_config.json}"
# One rank per GPU: each gets its share of the node's cores (the launchers' default is 1).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / 8 > 0 ? $(nproc) / 8 : 1 ))}"
TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"

exec deepspeed --hostfile "${HOSTFILE:-hostfile}" --num_nodes 8 --num_gpus 8 \
    --master_port "${MASTER_PORT:-29500}" \
    "$TRAIN_SCRIPT" --deepspeed_config "$DS_CONFIG" "$@"

#!/usr/bin/env bash
# ZeRO-3 for llama3-70b on 8 nodes of 8x h100
# Launch with torchrun (one process per GPU). Written by zlayout 0.1.0 from profile.toml (llama3-70b-64xh100);
# re-export the profile rather than editing this file by hand.
#
# It runs YOUR training script: TRAIN_SCRIPT (default train.py) with
#   --deepspeed_config ds_config.json
# and any arguments given to this script. The training script must pass that file to
# deepspeed.initialize (deepspeed.add_config_arguments(parser) adds the flag).
# Hardware: 8 node(s) x 8 h100 GPUs = 64 processes.
# The training script reads LOCAL_RANK from the environment (torchrun sets it).
# Multi-node: run this once on each of the 8 nodes with NODE_RANK=0..7
# and MASTER_ADDR set to node 0's address.
set -euo pipefail
PROFILE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
DS_CONFIG="${DS_CONFIG:-$PROFILE_DIR/ds_config.json}"
# One rank per GPU: each gets its share of the node's cores (the launchers' default is 1).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(( $(nproc) / 8 > 0 ? $(nproc) / 8 : 1 ))}"
TRAIN_SCRIPT_DEFAULT=train.py
TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"

exec torchrun --nnodes 8 --nproc_per_node 8 --node_rank "${NODE_RANK:?set NODE_RANK to this node index, 0..7}" \
    --rdzv_backend c10d --rdzv_id "${RDZV_ID:-zlayout}" --rdzv_endpoint "${MASTER_ADDR:?set MASTER_ADDR to node 0}:${MASTER_PORT:-29500}" \
    "$TRAIN_SCRIPT" --deepspeed_config "$DS_CONFIG" "$@"

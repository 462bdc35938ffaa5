"""Launch scripts beside the profile: DeepSpeed's launcher, torchrun, and SLURM (srun + torchrun).

Each runs the team's own training script, `${TRAIN_SCRIPT:-train.py}`, with
`--deepspeed_config ds_config.json`; the script must hand that file to `deepspeed.initialize`
(`deepspeed.add_config_arguments(parser)` adds the flag). zlayout ships no training script.
"""

from __future__ import annotations

import shlex

from zlayout.profile.schema import Profile
from zlayout.spec import HOST_HUGEPAGES_ENV

DEEPSPEED_SCRIPT = "launch_deepspeed.sh"
TORCHRUN_SCRIPT = "launch_torchrun.sh"
SLURM_SCRIPT = "launch_slurm.sbatch"


def _comment(text: object) -> str:
    """`text` fit for one `# ...` line: anything that is not printable (newlines, U+2028, U+0085,
    other controls) becomes a space, so no value can end the comment and start a command.
    The profile's validators refuse such values already; this holds even for one built around them."""
    return " ".join("".join(c if c.isprintable() else " " for c in str(text)).split())


def _default_train_script(profile: Profile) -> str:
    """The training script default as its own single-quoted assignment (shlex.quote), then used as
    "${TRAIN_SCRIPT:-$default}": a literal inside ${...:-...} would let `}` end the expansion
    ('scripts/{a}b.py' ran scripts/{ab.py}) and `$(...)` run."""
    return (f"TRAIN_SCRIPT_DEFAULT={shlex.quote(profile.run.train_script)}\n"
            'TRAIN_SCRIPT="${TRAIN_SCRIPT:-$TRAIN_SCRIPT_DEFAULT}"\n')


def _header(profile: Profile, how: str) -> str:
    hw = profile.inputs.hardware
    train = _comment(profile.run.train_script)
    description, name = _comment(profile.description), _comment(profile.name)
    lines = [
        "#!/usr/bin/env bash",
        f"# {description}",
        f"# {how}. Written by zlayout {_comment(profile.zlayout_version)} from profile.toml ({name});",
        "# re-export the profile rather than editing this file by hand.",
        "#",
        f"# It runs YOUR training script: TRAIN_SCRIPT (default {train}) with",
        "#   --deepspeed_config ds_config.json",
        "# and any arguments given to this script. The training script must pass that file to",
        "# deepspeed.initialize (deepspeed.add_config_arguments(parser) adds the flag).",
        f"# Hardware: {int(hw.nodes)} node(s) x {int(hw.gpus_per_node)} {_comment(hw.gpu.name)} GPUs = {int(hw.world)} processes.",
    ]
    if "nvme" in (profile.layout.offload_optimizer, profile.layout.offload_param):
        lines.append(f"# NVMe offload: {_comment(profile.run.nvme_path)} must exist and be writable on every node.")
    return "\n".join(lines) + "\n"


_FIND_CONFIG = (
    'PROFILE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"\n'
    'DS_CONFIG="${DS_CONFIG:-$PROFILE_DIR/ds_config.json}"\n'
)


def _cpu_threads(profile: Profile) -> str:
    """torchrun and DeepSpeed's launcher give every rank OMP_NUM_THREADS=1 when a node runs several,
    which leaves DeepSpeedCPUAdam (optimizer offload) one core per rank: 3-4x slower steps on the
    H200 runs. Give each rank its share of the node's cores unless the caller chose."""
    gpus = int(profile.inputs.hardware.gpus_per_node)
    return ("# One rank per GPU: each gets its share of the node's cores (the launchers' default is 1).\n"
            f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-$(( $(nproc) / {gpus} > 0 ? $(nproc) / {gpus} : 1 ))}}"\n')


def _host_pages(profile: Profile) -> str:
    """An offloaded step's host tensors on 2 MiB pages (spec.HOST_HUGEPAGES_ENV: verify ran so)."""
    if not profile.layout.offloads:
        return ""
    return ("# Offload: PyTorch puts host tensors of 2 MiB or more on huge pages (the step's fresh host\n"
            "# copies are not faulted in 4 KiB at a time); verify measured the step this way.\n"
            f'export {HOST_HUGEPAGES_ENV}="${{{HOST_HUGEPAGES_ENV}:-1}}"\n')


def _allocator(profile: Profile) -> str:
    """The plan judged 'fits' for the allocator it names; the run must use that allocator.
    Expandable segments are appended to whatever options the caller already set."""
    if profile.inputs.training.allocator != "expandable":
        return ""
    return ("# The plan assumes PyTorch's expandable segments (no split-segment fragmentation).\n"
            'export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:+$PYTORCH_CUDA_ALLOC_CONF,}'
            'expandable_segments:True"\n')


def _rank_environment(profile: Profile) -> str:
    """What every rank's environment needs, in each launcher: its cores, its host pages, the
    planned allocator."""
    return _cpu_threads(profile) + _host_pages(profile) + _allocator(profile)


def deepspeed_script(profile: Profile) -> str:
    hw, run = profile.inputs.hardware, profile.run
    out = _header(profile, "Launch with DeepSpeed's launcher (`deepspeed`)")
    if hw.nodes > 1:
        out += (
            "# Multi-node: HOSTFILE lists one node per line as 'hostname slots=GPUS'\n"
            f"# ({int(hw.nodes)} lines, slots={int(hw.gpus_per_node)}); the launcher reaches the nodes over ssh.\n"
        )
    out += "set -euo pipefail\n" + _FIND_CONFIG + _rank_environment(profile)
    out += _default_train_script(profile) + "\n"
    if hw.nodes > 1:
        out += (
            f'exec deepspeed --hostfile "${{HOSTFILE:-hostfile}}" --num_nodes {int(hw.nodes)} '
            f"--num_gpus {int(hw.gpus_per_node)} \\\n"
            f'    --master_port "${{MASTER_PORT:-{int(run.master_port)}}}" \\\n'
        )
    else:
        out += (
            f"exec deepspeed --num_gpus {int(hw.gpus_per_node)} "
            f'--master_port "${{MASTER_PORT:-{int(run.master_port)}}}" \\\n'
        )
    out += '    "$TRAIN_SCRIPT" --deepspeed_config "$DS_CONFIG" "$@"\n'
    return out


def torchrun_script(profile: Profile) -> str:
    hw, run = profile.inputs.hardware, profile.run
    out = _header(profile, "Launch with torchrun (one process per GPU)")
    out += "# The training script reads LOCAL_RANK from the environment (torchrun sets it).\n"
    if hw.nodes > 1:
        out += (
            f"# Multi-node: run this once on each of the {int(hw.nodes)} nodes with NODE_RANK=0..{int(hw.nodes) - 1}\n"
            "# and MASTER_ADDR set to node 0's address.\n"
        )
    out += "set -euo pipefail\n" + _FIND_CONFIG + _rank_environment(profile)
    out += _default_train_script(profile) + "\n"
    if hw.nodes > 1:
        out += (
            f"exec torchrun --nnodes {int(hw.nodes)} --nproc_per_node {int(hw.gpus_per_node)} "
            f'--node_rank "${{NODE_RANK:?set NODE_RANK to this node index, 0..{int(hw.nodes) - 1}}}" \\\n'
            '    --rdzv_backend c10d --rdzv_id "${RDZV_ID:-zlayout}" '
            f'--rdzv_endpoint "${{MASTER_ADDR:?set MASTER_ADDR to node 0}}:${{MASTER_PORT:-{int(run.master_port)}}}" \\\n'
        )
    else:
        out += (
            f"exec torchrun --standalone --nproc_per_node {int(hw.gpus_per_node)} \\\n"
        )
    out += '    "$TRAIN_SCRIPT" --deepspeed_config "$DS_CONFIG" "$@"\n'
    return out


def slurm_script(profile: Profile) -> str:
    hw, run = profile.inputs.hardware, profile.run
    job = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "-" for c in profile.name)[:60]
    out = _header(profile, "Submit with `sbatch launch_slurm.sbatch`: srun starts one torchrun per node")
    out += (
        "# sbatch runs a copy of this file, so ds_config.json is found through the directory you\n"
        "# submit from: cd into the profile's directory first, or set DS_CONFIG=/path/ds_config.json.\n"
        f"#SBATCH --job-name={job}\n"
        f"#SBATCH --nodes={int(hw.nodes)}\n"
        "#SBATCH --ntasks-per-node=1\n"
        f"#SBATCH --gpus-per-node={int(hw.gpus_per_node)}\n"
        "#SBATCH --exclusive\n"
        "set -euo pipefail\n"
        'DS_CONFIG="${DS_CONFIG:-${SLURM_SUBMIT_DIR:-$PWD}/ds_config.json}"\n'
        + _default_train_script(profile) +
        "# sed, not head: head would close the pipe early and pipefail would end the job\n"
        'MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)"\n'
        f'MASTER_PORT="${{MASTER_PORT:-{int(run.master_port)}}}"\n'
        + _rank_environment(profile) + "\n"
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\\n"
        f'    torchrun --nnodes "$SLURM_NNODES" --nproc_per_node {int(hw.gpus_per_node)} \\\n'
        '    --rdzv_backend c10d --rdzv_id "$SLURM_JOB_ID" --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" \\\n'
        '    "$TRAIN_SCRIPT" --deepspeed_config "$DS_CONFIG" "$@"\n'
    )
    return out


def launch_scripts(profile: Profile) -> dict[str, str]:
    """File name -> script text, for every launcher."""
    return {
        DEEPSPEED_SCRIPT: deepspeed_script(profile),
        TORCHRUN_SCRIPT: torchrun_script(profile),
        SLURM_SCRIPT: slurm_script(profile),
    }

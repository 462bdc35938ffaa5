"""Run many `measure.py` layouts on one GPU machine, packing single-GPU runs side by side.

Each line of the batch file is `WORLD  measure.py flags...` (`#` starts a comment). Runs of
world 1 go two at a time on separate GPUs when the machine has two; wider runs take every GPU.
Each result line is appended to OUT as soon as it arrives, so a run cut short keeps what it had.

    python benchmarks/measurements/tools/measure_batch.py batch.txt $OUT/measure.jsonl --gpus 2 --timeout 150
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def launch(world: int, flags: list[str], gpus: list[int], port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)))
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={world}",
           f"--master_port={port}", str(HERE / "measure.py"), *flags]
    return subprocess.Popen(cmd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("batch")
    p.add_argument("out")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--timeout", type=float, default=150)
    p.add_argument("--deadline", type=float, default=540, help="stop launching after this many seconds")
    a = p.parse_args()
    jobs = []
    for line in Path(a.batch).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            world, *flags = line.split()
            jobs.append((int(world), flags))
    out, logdir = Path(a.out), Path(a.out).parent / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    start, free, running, port, n = time.time(), list(range(a.gpus)), [], 29500, 0
    while jobs or running:
        for proc, gpus, t0, log, flags in list(running):
            timed_out = time.time() - t0 > a.timeout
            if proc.poll() is None and not timed_out:
                continue
            if timed_out and proc.poll() is None:
                proc.kill()
            proc.wait()
            running.remove((proc, gpus, t0, log, flags))
            free += gpus
            text = log.read_text(errors="replace")
            rows = [ln[8:] for ln in text.splitlines() if ln.startswith("MEASURE ")]
            with out.open("a") as fh:
                if rows:
                    fh.write(rows[-1] + "\n")
                else:
                    oom = "out of memory" in text.lower()
                    fh.write(json.dumps({"failed": " ".join(flags), "oom": oom, "rc": proc.returncode,
                                         "timed_out": timed_out, "tail": text[-1500:]}) + "\n")
            print(f"[{time.time() - start:6.1f}s] done {' '.join(flags)} -> {'ok' if rows else 'FAILED'}",
                  flush=True)
        if jobs and time.time() - start < a.deadline:
            world, flags = jobs[0]
            if len(free) >= world:
                jobs.pop(0)
                gpus, free = free[:world], free[world:]
                n += 1
                log = logdir / f"run{n:02d}.log"
                port += 1
                running.append((launch(world, flags, gpus, port, log), gpus, time.time(), log, flags))
                print(f"[{time.time() - start:6.1f}s] start w{world} gpus{gpus} {' '.join(flags)}", flush=True)
                continue
        elif jobs and not running:
            print(f"deadline reached; {len(jobs)} runs not started", flush=True)
            break
        time.sleep(0.5)


if __name__ == "__main__":
    main()

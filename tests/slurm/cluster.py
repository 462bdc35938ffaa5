"""A real SLURM (munge, slurmctld, one slurmd per node) under a temporary directory.

Everything it writes (munge key and socket, slurm.conf, state and spool, logs) lives in that
directory; no system file is touched, so it runs beside a site's own SLURM. Two nodes run on
this one machine, each its own slurmd with its own NodeName and port: the host's name and
`localhost`, two names that both resolve here (torchrun's rendezvous meets on the first node's
name). Partitions: `debug` (the default: the first node only, the single-node suite), `two`
(both nodes: multi-node jobs), `short` (MaxTime 1 minute: a job asking more pends with
PartitionTimeLimit) and `closed` (State=DOWN: a job pends with PartitionDown, which an
administrator may clear). Each node carries two fake `gpu` GRES (links to /dev/null) so that
scripts requesting GPUs, like a profile's launch_slurm.sbatch, are accepted as they are.
Daemons run in the foreground and are stopped by their PIDs (recorded in `pids`, so that a
test process other than the one that started them can stop them).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo")
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
FAKE_GPUS = 2


SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # daemons live in sbin


def program(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def missing_programs() -> list[str]:
    return [name for name in PROGRAMS if program(name) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_name() -> str:
    """The host name slurmd registers as; it must resolve, since torchrun meets on it."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "localhost"


def _stop_pid(pid: int, proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after STOP_GRACE_S; `proc` when this process started it (reaped)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return
        if proc is None:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    if proc is not None:
        proc.wait()


@dataclass
class SlurmCluster:
    root: Path
    node: str = field(default_factory=_node_name)
    cpus: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))  # never more than slurmd finds
    second: str | None = field(default_factory=lambda: None)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)
    log_files: list = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.second is None and self.node != "localhost":
            self.second = "localhost"

    @property
    def nodes(self) -> list[str]:
        return [self.node] + ([self.second] if self.second else [])

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def write_config(self) -> None:
        r = self.root
        for sub in ("state", "spool", "dev"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        for index in range(FAKE_GPUS):  # a GRES file must be a device: point at /dev/null
            link = r / "dev" / f"gpu{index}"
            if not link.exists():
                link.symlink_to("/dev/null")
        memory_mib = max(1024, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024)
        self.conf.write_text(f"""\
ClusterName=zlayout-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge.sock
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MailProg=/bin/true
ReturnToService=2
StateSaveLocation={r}/state
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmdSpoolDir={r}/spool/%n
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
GresTypes=gpu
""" + "".join(
            f"NodeName={name} NodeAddr=127.0.0.1 Port={_free_port()} CPUs={self.cpus} "
            f"RealMemory={memory_mib} Gres=gpu:{FAKE_GPUS} State=UNKNOWN\n" for name in self.nodes) + f"""\
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
PartitionName=two Nodes={",".join(self.nodes)} MaxTime=INFINITE State=UP
PartitionName=short Nodes={self.node} MaxTime=1 State=UP
PartitionName=closed Nodes={self.node} MaxTime=INFINITE State=DOWN
""")
        for name in self.nodes:
            (r / "spool" / name).mkdir(parents=True, exist_ok=True)
        (r / "gres.conf").write_text("AutoDetect=off\n" + "".join(
            f"NodeName={name} Name=gpu File={r}/dev/gpu[0-{FAKE_GPUS - 1}]\n" for name in self.nodes))

    def _spawn(self, name: str, command: list[str]) -> None:
        log = (self.root / f"{name}.out").open("w")
        self.log_files.append(log)
        self.procs[name] = subprocess.Popen([program(command[0]) or command[0], *command[1:]],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=self.env())
        self.pids[name] = self.procs[name].pid

    def start(self) -> None:
        self.write_config()
        r = self.root
        subprocess.run([program("mungekey") or "mungekey", "--create", f"--keyfile={r}/munge.key"],
                       check=True, capture_output=True)
        # --force: munged refuses a socket under a world-writable /tmp otherwise
        self._spawn("munged", ["munged", "--foreground", "--force", f"--socket={r}/munge.sock",
                               f"--key-file={r}/munge.key", f"--pid-file={r}/munged.pid",
                               f"--seed-file={r}/munged.seed", f"--log-file={r}/munged.log"])
        self._wait_for(lambda: (r / "munge.sock").exists(), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        for name in self.nodes:
            self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name])
        self._wait_for(self._node_idle, f"nodes {', '.join(self.nodes)} idle in sinfo")

    def _node_idle(self) -> bool:
        proc = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True,
                              env=self.env())
        states = proc.stdout.split()  # one line per node and partition
        return proc.returncode == 0 and bool(states) and set(states) == {"idle"}

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited ({proc.returncode}) while waiting for "
                                       f"{what}:\n{self.logs()}")
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError(f"no {what} after {START_TIMEOUT_S:.0f} s:\n{self.logs()}")

    def logs(self) -> str:
        parts = []
        for path in sorted(self.root.glob("*.out")) + sorted(self.root.glob("*.log")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:]))
        return "\n".join(parts)

    def stop(self) -> None:
        """The slurmds, slurmctld, munged in that order, each by its PID: SIGTERM, then SIGKILL."""
        order = [n for n in self.pids if n.startswith("slurmd")] + ["slurmctld", "munged"]
        for name in order:
            pid = self.pids.pop(name, None)
            if pid is None:
                continue
            proc = self.procs.pop(name, None)
            _stop_pid(pid, proc)
        for pid in self._step_daemons():  # slurmstepd outlives a stopped slurmd
            _stop_pid(pid, None)
        for log in self.log_files:
            log.close()

    def _step_daemons(self) -> list[int]:
        """This cluster's slurmstepd processes: those working in its spool directory."""
        spool = str(self.root / "spool")
        found = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "comm").read_text().strip() == "slurmstepd" and \
                        os.readlink(proc / "cwd").startswith(spool):
                    found.append(int(proc.name))
            except OSError:
                continue
        return found

    def job(self, job_id: str) -> str:
        return subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                              text=True, env=self.env()).stdout

    def wait_job(self, job_id: str, timeout_s: float = 180.0) -> str:
        """Poll until SLURM records the job as ended; its `scontrol show job` line."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.job(job_id)
            state = next((w.split("=", 1)[1] for w in line.split() if w.startswith("JobState=")), "")
            if state and state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return line
            time.sleep(1)
        raise AssertionError(f"job {job_id} still not finished after {timeout_s:.0f} s: {self.job(job_id)}")

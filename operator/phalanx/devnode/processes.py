"""Container processes: spawn into their own process group with a log file, signal, reap."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from phalanx.devnode.containers import LocalCommand

POD_UID_ENV = "PHALANX_DEVNODE_POD_UID"


def log_path(logs_dir: Path, namespace: str, pod: str, container: str) -> Path:
    return logs_dir / f"{namespace}_{pod}_{container}.log"


@dataclass
class ContainerProcess:
    name: str
    process: subprocess.Popen[bytes]
    started_at: float = field(default_factory=time.time)

    def returncode(self) -> int | None:
        return self.process.poll()

    def signal_group(self, signum: int) -> None:
        """The whole group: launchers fork workers that must hear SIGTERM too."""
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass


def spawn(command: LocalCommand, log_file: Path, header: str) -> subprocess.Popen[bytes]:
    log_file.parent.mkdir(parents=True, exist_ok=True)
    Path(command.cwd).mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        log.write(f"--- {header} ---\n".encode())
        log.flush()
        return subprocess.Popen(
            command.argv,
            env=command.env,
            cwd=command.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _started_for(pid: int, pod_uid: str) -> bool:
    """Whether process `pid` carries the pod uid the agent put in its environment (pids get reused)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{POD_UID_ENV}={pod_uid}".encode() in environ


def kill_leftover_group(pid_file: Path, pod_uid: str) -> bool:
    """Kills the process group a previous agent run recorded, if it still runs; True if it did."""
    try:
        pgid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return False
    finally:
        pid_file.unlink(missing_ok=True)
    if not _started_for(pgid, pod_uid):
        return False
    try:
        os.killpg(pgid, signal.SIGKILL)
        return True
    except ProcessLookupError:
        return False

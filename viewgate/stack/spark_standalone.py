"""A Spark standalone cluster from the distribution the pyspark package ships: one master
and workers, each a JVM we start (`bin/spark-class`) and track by pid, on free ports, with
their work folders in a folder of our own."""

from __future__ import annotations

import os
import signal
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from viewgate.stack.errors import StackError
from viewgate.stack.process import ManagedProcess, free_port, wait_until

HOST = "127.0.0.1"


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class SparkStandalone:
    data_dir: Path
    workers: int = 2
    cores_per_worker: int = 1
    memory_per_worker: str = "1g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: list[ManagedProcess] = field(default_factory=list, init=False)

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def _process(self, name: str, main: str, *args: str) -> ManagedProcess:
        home = spark_home()
        return ManagedProcess(
            name, [str(home / "bin" / "spark-class"), main, *args],
            self.data_dir / f"{name}.log",
            env={"SPARK_HOME": str(home), "SPARK_LOCAL_IP": HOST,
                 # The daemons' own heap; executors get theirs from the application.
                 "SPARK_DAEMON_MEMORY": "256m", "SPARK_LOG_DIR": str(self.data_dir)})

    def start(self, timeout_s: float = 90.0) -> SparkStandalone:
        self.data_dir = self.data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            master = self._process("spark-master", "org.apache.spark.deploy.master.Master",
                                   "--host", HOST, "--port", str(self.port),
                                   "--webui-port", str(self.ui_port)).start()
            self.processes.append(master)
            wait_until(lambda: self.state() is not None, timeout_s=timeout_s,
                       what="the Spark master", alive=master.alive, log=master.log_path)
            for i in range(self.workers):
                work = self.data_dir / f"worker{i + 1}"
                self.processes.append(self._process(
                    f"spark-worker{i + 1}", "org.apache.spark.deploy.worker.Worker",
                    "--host", HOST, "--port", str(free_port()),
                    "--webui-port", str(free_port()), "--cores", str(self.cores_per_worker),
                    "--memory", self.memory_per_worker, "--work-dir", str(work),
                    self.master_url).start())
            wait_until(lambda: len(self.alive_workers()) == self.workers, timeout_s=timeout_s,
                       what=f"{self.workers} Spark workers to register")
        except BaseException:
            self.stop()
            raise
        return self

    def state(self) -> dict | None:
        """The master's JSON status page (workers, applications), None if it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=2) as r:
                return orjson.loads(r.read())
        except OSError:
            return None

    def alive_workers(self) -> list[dict]:
        state = self.state() or {}
        return [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` (1-based) and the executors it launched, as when its
        machine dies: they share its process group."""
        worker = self.processes[index]
        try:
            os.killpg(worker.pid, signal.SIGKILL)
        except ProcessLookupError as exc:
            raise StackError(f"Spark worker {index} was not running") from exc
        worker.popen.wait(timeout=30)

    def stop(self) -> None:
        # Workers first (each takes its executors down), then the master; then anything a
        # worker left in its process group.
        for process in reversed(self.processes):
            process.stop()
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.processes.clear()



"""A Spark standalone cluster on loopback ports, and the report submitted to it as docs/analytics.md says.

The commands are shell lines, run with ``bash -c`` as a user would type them
(docs/analytics.md shows the same lines, word for word: test_standalone.py
checks it). Their variables are the only difference between runs: free
ports, the worker's directory, the archive and the report directory.

* the master and one worker are pyspark's own ``spark-class`` (no download),
  each in a process group of its own; with ``SPARK_LOCAL_IP=127.0.0.1`` and
  ``--host 127.0.0.1`` every port and web UI binds to loopback (a worker left
  to pick its address registers under the machine's external interface);
* :meth:`StandaloneCluster.start` returns once the master's JSON lists the
  worker ALIVE at 127.0.0.1 with its cores, never after a sleep;
* :meth:`StandaloneCluster.stop` ends both process groups (TERM, then KILL),
  executors included (they are the worker's children, in its group).
"""
from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.processes import wait_for
from tests.redis_server import free_port

#: spark-class and spark-submit as pip installed them, beside the interpreter running the tests.
BIN = Path(sys.executable).parent
WORKER_CORES = 2

#: The master's REST submission server (on by default, on the fixed port 6066) is for cluster deploy mode only.
MASTER_OPTS = "-Dspark.master.rest.enabled=false"
#: Four short-lived JVMs (master, worker, driver, executor) on a few cores: the C1 compiler only, as a local report.
C1 = "-XX:TieredStopAtLevel=1"
MASTER = ('spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 '
          '--port "$MASTER_PORT" --webui-port "$MASTER_UI_PORT"')
WORKER = ('spark-class org.apache.spark.deploy.worker.Worker --host 127.0.0.1 '
          f'--port "$WORKER_PORT" --webui-port "$WORKER_UI_PORT" --cores {WORKER_CORES} --memory 1g '
          '--work-dir "$WORKER_DIR" "spark://127.0.0.1:$MASTER_PORT"')
ENTRY_POINT = "MAIN=$(python -c 'import celery_dlq.analytics.__main__ as m; print(m.__file__)')"
SUBMIT = ('spark-submit --master "spark://127.0.0.1:$MASTER_PORT" --deploy-mode client '
          f'--total-executor-cores {WORKER_CORES} --executor-memory 1g '
          f'--driver-java-options {C1} --conf spark.executor.extraJavaOptions={C1} '
          '--conf spark.driver.host=127.0.0.1 --conf spark.ui.enabled=false --conf spark.sql.shuffle.partitions=2 '
          '"$MAIN" --in "$ARCHIVE" --out "$REPORT" --as-of 2024-03-15T12:00:00Z')
#: Every line the test runs, in order (the master and the worker stay up while the report is submitted).
COMMANDS = ("export SPARK_LOCAL_IP=127.0.0.1", f"export SPARK_DAEMON_JAVA_OPTS={C1}",
            f"export SPARK_MASTER_OPTS='{MASTER_OPTS}'", MASTER, WORKER, ENTRY_POINT, SUBMIT)


def shell_env(extra: dict[str, str]) -> dict[str, str]:
    """The test's environment with this interpreter's bin first on PATH (``python``, ``spark-submit``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["SPARK_LOCAL_IP"] = "127.0.0.1"   # COMMANDS[0:3]
    env["SPARK_DAEMON_JAVA_OPTS"] = C1
    env["SPARK_MASTER_OPTS"] = MASTER_OPTS
    return {**env, **extra}


def json_of(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return json.load(answer)
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


def group_alive(pgid: int) -> list[int]:
    """Pids of the processes of group ``pgid`` that still run (zombies waiting for a reaper do not)."""
    alive = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return alive


@dataclass
class Daemon:
    """One of the cluster's JVMs: a shell line in a process group of its own, its output in ``log``."""

    what: str
    line: str
    log: Path
    proc: subprocess.Popen | None = None

    def start(self, env: dict[str, str]) -> Daemon:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(["bash", "-c", self.line], env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def alive(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, \
            f"the {self.what} exited:\n{self.log.read_text(errors='replace')[-4000:]}"

    def stop(self) -> None:
        """TERM the whole process group, KILL it after 15 s; reap the leader."""
        if self.proc is None:
            return
        pgid = self.proc.pid          # start_new_session: the leader's pid is the group's id
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + grace
            while group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not group_alive(pgid):
                break
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:   # pragma: no cover - the group was SIGKILLed
            pass


@dataclass
class StandaloneCluster:
    """A master and one worker on free loopback ports; ``dir`` holds their logs and the worker's files."""

    dir: Path
    ports: dict[str, int] = field(default_factory=lambda: {
        name: free_port() for name in ("MASTER_PORT", "MASTER_UI_PORT", "WORKER_PORT", "WORKER_UI_PORT")})
    #: More environment for every process (``TZ``: the tests run the JVMs and Python in America/New_York).
    extra_env: dict[str, str] = field(default_factory=dict)
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.ports['MASTER_PORT']}"

    @property
    def env(self) -> dict[str, str]:
        """The variables of COMMANDS (but ARCHIVE and REPORT, which a submission adds)."""
        return shell_env({**{k: str(v) for k, v in self.ports.items()}, "WORKER_DIR": str(self.dir / "work"),
                          **self.extra_env})

    def master_state(self) -> dict | None:
        """The master's JSON, if the master answering on our UI port is ours (its URL is ours)."""
        state = json_of(f"http://127.0.0.1:{self.ports['MASTER_UI_PORT']}/json/")
        return state if state is not None and state.get("url") == self.url else None

    def worker_state(self) -> dict | None:
        return json_of(f"http://127.0.0.1:{self.ports['WORKER_UI_PORT']}/json/")

    def start(self, timeout: float = 60) -> StandaloneCluster:
        (self.dir / "work").mkdir(parents=True, exist_ok=True)
        master = Daemon("master", MASTER, self.dir / "master.log").start(self.env)
        self.daemons.append(master)
        # The master answers its JSON once it is the leader (the worker would otherwise retry in 5-15 s).
        wait_for(lambda: master.alive() or (self.master_state() or {}).get("status") == "ALIVE",
                 timeout, "the master to lead", master.log, poll=0.1)
        worker = Daemon("worker", WORKER, self.dir / "worker.log").start(self.env)
        self.daemons.append(worker)
        wait_for(lambda: worker.alive() or master.alive() or self.registered(), timeout,
                 "the worker to register with the master", worker.log, poll=0.1)
        return self

    def registered(self) -> bool:
        """The master lists one worker, ALIVE, at 127.0.0.1 with all its cores, and the worker knows its master."""
        state = self.master_state() or {}
        workers = [w for w in state.get("workers", ()) if w.get("state") == "ALIVE"]
        if not (len(workers) == 1 and workers[0]["host"] == "127.0.0.1" and workers[0]["cores"] == WORKER_CORES):
            return False
        return (self.worker_state() or {}).get("masterurl") == self.url

    def listening(self) -> list[str]:
        """``ip:port`` of every socket the master's and the worker's processes listen on.

        The JVM listens on IPv6 sockets: 127.0.0.1 shows as ``::ffff:127.0.0.1``, given here as 127.0.0.1.
        """
        addresses = []
        for daemon in self.daemons:
            for pid in group_alive(daemon.proc.pid):
                for c in psutil.Process(pid).net_connections("inet"):
                    if c.status == psutil.CONN_LISTEN:
                        ip = ipaddress.ip_address(c.laddr.ip)
                        addresses.append(f"{getattr(ip, 'ipv4_mapped', None) or ip}:{c.laddr.port}")
        return addresses

    def submit(self, archive: Path, report: Path, timeout: float = 240) -> subprocess.CompletedProcess:
        """``ENTRY_POINT`` then ``SUBMIT`` in one shell: the report's driver here, its executors on the worker."""
        env = {**self.env, "ARCHIVE": str(archive), "REPORT": str(report)}
        return subprocess.run(["bash", "-c", f"{ENTRY_POINT}\n{SUBMIT}"], env=env, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def stop(self) -> list[int]:
        """Stop the worker, then the master; the pids of their groups still running (none, unless it failed)."""
        for daemon in reversed(self.daemons):
            daemon.stop()
        return [pid for d in self.daemons if d.proc is not None for pid in group_alive(d.proc.pid)]

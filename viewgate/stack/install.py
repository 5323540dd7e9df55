"""`viewgate setup`: install what is missing so the local stack can run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from schema.settings import Settings
from viewgate.stack import jars
from viewgate.stack.dashboard import build_dashboard
from viewgate.stack.errors import StackError
from viewgate.stack.kafka import KafkaBroker, java_executable
from viewgate.stack.process import free_port


def java_major_version() -> int:
    result = subprocess.run(
        [java_executable(), "-version"], capture_output=True, text=True, timeout=30
    )
    text = result.stderr + result.stdout
    for token in text.replace('"', " ").split():
        head = token.split(".")[0]
        if head.isdigit() and "." in token:
            return int(head)
    raise StackError(f"Could not read the Java version from: {text.strip()[:200]}")


def ensure_java() -> None:
    major = java_major_version()
    if major < 17:
        raise StackError(
            f"Java {major} found; Spark 4 and Kafka 4 need Java 17 or newer. "
            "Install openjdk-17-jre-headless and put it first on PATH."
        )


def ensure_redis_server(timeout_s: float = 900) -> None:
    apt_install("redis-server", "redis-server", timeout_s)


def apt_install(package: str, executable: str, timeout_s: float = 900) -> str:
    """The path of `executable`, installing Debian's `package` first if it is missing."""
    found = shutil.which(executable)
    if found:
        return found
    if os.geteuid() == 0:
        prefix: list[str] = []
    elif shutil.which("sudo"):
        prefix = ["sudo", "-n"]
    else:
        raise StackError(
            f"{executable} is missing and we are not root: run `apt-get install {package}`."
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", package]):
        result = subprocess.run(
            prefix + args, capture_output=True, text=True, timeout=timeout_s, env=env
        )
        if result.returncode != 0:
            raise StackError(
                f"`{' '.join(args)}` failed; install Debian's {package} by hand.\n"
                + result.stderr[-2000:]
            )
    found = shutil.which(executable)
    if not found:
        raise StackError(f"apt-get installed {package} but {executable} is not on PATH.")
    return found


def setup(settings: Settings, say=print) -> None:
    ensure_java()
    say("java: ok")
    ensure_redis_server()
    say(f"redis-server: {shutil.which('redis-server')}")
    # Debian's Compose: the tests check compose.yaml with its `config` (no Docker engine
    # needed). Nothing else needs it, so a machine without it still runs the stack.
    try:
        say(f"docker-compose: {apt_install('docker-compose', 'docker-compose')}")
    except StackError as error:
        say(f"docker-compose: not installed ({error}); compose.yaml's test will fail")
    for bundle in jars.BUNDLES:
        if bundle == "spark" and settings.spark_jars:
            say("spark jars: VIEWGATE_SPARK_JARS is set, nothing to resolve")
            continue
        folder = jars.resolve(settings.jar_dir, bundle, settings.maven_repository)
        say(f"{bundle} jars: {folder} ({len(list(folder.glob('*.jar')))} jars)")
    say(f"dashboard: {build_dashboard()}")
    say(f"spark class archive: {ensure_class_archive(settings)}")


def ensure_class_archive(settings: Settings) -> str:
    """Spark's JVM class-data archive (engine.class_archive), built once per machine, with
    a Kafka broker of its own for the warm-up's read (stopped before this returns)."""
    from engine.class_archive import archive_path, build_archive

    path = archive_path(settings)
    if path.is_file():
        return str(path)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="viewgate-cds-kafka-") as folder:
        broker = KafkaBroker(Path(folder), free_port(), settings.jar_dir / "kafka")
        bootstrap, without = None, ""
        try:
            broker.start(timeout_s=settings.startup_timeout_s)
            bootstrap = broker.bootstrap
        except StackError as error:  # the archive still helps without the read's classes
            without = f"; without a broker ({str(error).splitlines()[0]}), so without the read"
        try:
            built = build_archive(settings, kafka_bootstrap=bootstrap)
        finally:
            broker.stop()
    if built is None:
        return "could not be built; Spark starts without it (slower)"
    return f"{built} (built in {time.monotonic() - started:.0f} s{without})"

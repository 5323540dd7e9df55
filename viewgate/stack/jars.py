"""Resolve the JVM artifacts from Maven Central into the cache folder.

Two small poms under `viewgate/jvm/` name what we need: the Kafka broker with its
runtime dependencies, and Spark's Kafka connector plus Delta Lake. Maven copies
their runtime jars into `<cache_dir>/jars/<name>/`; a stamp of the pom's hash lets
later runs skip the work. Spark gets these jars through `spark.jars`, never by
resolving packages over the network at run time.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pyspark

from viewgate.stack.errors import StackError

POM_DIR = Path(__file__).resolve().parent.parent / "jvm"
BUNDLES = ("kafka", "spark", "s3proxy")
_STAMP = ".resolved"
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d+(\.\d+)+([.-][A-Za-z0-9]+)*\.jar$")


def _pom(bundle: str) -> Path:
    return POM_DIR / bundle / "pom.xml"


def _stamp(bundle: str) -> str:
    return hashlib.sha256(_pom(bundle).read_bytes()).hexdigest()


def is_resolved(jar_dir: Path, bundle: str) -> bool:
    stamp = jar_dir / bundle / _STAMP
    return stamp.exists() and stamp.read_text().strip() == _stamp(bundle)


def artifact_name(jar: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`."""
    match = _VERSIONED_JAR.match(jar)
    return match.group("artifact") if match else jar.removesuffix(".jar")


def _drop_jars_spark_ships(folder: Path) -> None:
    # pyspark's own jars (Scala, Jackson, Hadoop, Parquet, log4j) must win; a second
    # copy at another version on the classpath breaks Spark in subtle ways.
    shipped = {
        artifact_name(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")
    }
    for jar in folder.glob("*.jar"):
        if artifact_name(jar.name) in shipped:
            jar.unlink()


def _maven_settings(repository: str, folder: Path) -> Path:
    settings = folder / "settings.xml"
    settings.write_text(
        "<settings><mirrors><mirror><id>viewgate</id><mirrorOf>*</mirrorOf>"
        f"<url>{repository}</url></mirror></mirrors></settings>"
    )
    return settings


def resolve(
    jar_dir: Path,
    bundle: str,
    maven_repository: str | None = None,
    local_repository: Path | None = None,
    timeout_s: float = 900,
) -> Path:
    """Copy the bundle's runtime jars into `jar_dir/bundle`, unless already there."""
    target = jar_dir / bundle
    if is_resolved(jar_dir, bundle):
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            "Maven (`mvn`) was not found on PATH; it resolves the Kafka and Spark jars. "
            "Install it (Debian: `apt-get install maven`) or point VIEWGATE_SPARK_JARS at "
            "jars you already have."
        )
    jar_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=jar_dir, prefix=f".{bundle}-") as scratch:
        scratch_dir = Path(scratch)
        out = scratch_dir / "jars"
        args = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(_pom(bundle)),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={out}",
        ]
        if maven_repository:
            args += ["-s", str(_maven_settings(maven_repository, scratch_dir))]
        if local_repository:
            args.append(f"-Dmaven.repo.local={local_repository}")
        try:
            result = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise StackError(
                f"Maven did not finish resolving the {bundle} jars within {timeout_s:.0f}s. "
                "Check that Maven Central (or VIEWGATE_MAVEN_REPOSITORY) is reachable."
            ) from exc
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip().splitlines()
            raise StackError(
                f"Maven could not resolve the {bundle} jars from "
                f"{maven_repository or 'Maven Central'}. Check the network or proxy, or set "
                "VIEWGATE_MAVEN_REPOSITORY to a reachable mirror. Maven said:\n"
                + "\n".join(output[-15:])
            )
        if bundle == "spark":
            _drop_jars_spark_ships(out)
        shutil.rmtree(target, ignore_errors=True)
        out.rename(target)
    (target / _STAMP).write_text(_stamp(bundle))
    return target

"""S3Proxy (Maven Central's self-contained jar, resolved by `viewgate setup`): an S3-API
server over a local folder, the object storage of the tests and of the cluster profile.
Started and stopped by pid on a free port; its buckets are created on start."""

from __future__ import annotations

import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import SecretStr

from viewgate.stack.errors import StackError
from viewgate.stack.kafka import java_executable
from viewgate.stack.process import ManagedProcess, free_port, wait_until

HOST = "127.0.0.1"
IDENTITY = "viewgate"


@dataclass
class S3ProxyServer:
    data_dir: Path
    jar_dir: Path  # <cache>/jars/s3proxy
    buckets: tuple[str, ...] = ("viewgate",)
    port: int = field(default_factory=free_port)
    # A key of its own each time: the server listens on loopback for one run.
    credential: str = field(default_factory=lambda: secrets.token_hex(16))
    process: ManagedProcess | None = field(default=None, init=False)

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    def settings_update(self) -> dict[str, object]:
        """What Settings need to reach it (schema.object_store)."""
        return {"s3_endpoint": self.endpoint, "s3_access_key_id": IDENTITY,
                "s3_secret_access_key": SecretStr(self.credential)}

    def env(self) -> dict[str, str]:
        return {"VIEWGATE_S3_ENDPOINT": self.endpoint, "VIEWGATE_S3_ACCESS_KEY_ID": IDENTITY,
                "VIEWGATE_S3_SECRET_ACCESS_KEY": self.credential}

    def start(self, timeout_s: float = 60.0) -> S3ProxyServer:
        jars = sorted(self.jar_dir.glob("s3proxy-*.jar"))
        if not jars:
            raise StackError(f"S3Proxy's jar is missing in {self.jar_dir}: run `viewgate setup`")
        self.data_dir = self.data_dir.resolve()
        (self.data_dir / "blobs").mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "s3proxy.conf"
        config.write_text("\n".join([
            f"s3proxy.endpoint={self.endpoint}",
            "s3proxy.authorization=aws-v2-or-v4",
            f"s3proxy.identity={IDENTITY}",
            f"s3proxy.credential={self.credential}",
            "jclouds.provider=filesystem",
            f"jclouds.filesystem.basedir={self.data_dir / 'blobs'}",
            "",
        ]))
        self.process = ManagedProcess(
            "s3proxy", [java_executable(), "-Xmx256m", "-jar", str(jars[-1]),
                        "--properties", str(config)],
            self.data_dir / "s3proxy.log").start()
        try:
            wait_until(self._answers, timeout_s=timeout_s, what=f"S3Proxy on {self.endpoint}",
                       alive=self.process.alive, log=self.process.log_path)
            self._create_buckets()
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=1)
        except urllib.error.HTTPError:
            return True  # an S3 error answer (no credentials): it serves
        except OSError:
            return False
        return True

    def _create_buckets(self) -> None:
        import pyarrow.fs

        fs = pyarrow.fs.S3FileSystem(endpoint_override=self.endpoint, scheme="http",
                                     access_key=IDENTITY, secret_key=self.credential,
                                     region="us-east-1", allow_bucket_creation=True)
        for bucket in self.buckets:
            fs.create_dir(bucket)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

"""A classic Helm chart repository over HTTPS: a directory holding index.yaml and the chart
archives (what `./dev chart` writes to dist/charts/), served read-only with a serving certificate
from the simulator's CA, as a web server of a site would serve it. `helm repo add NAME URL
--ca-file <CA>` then `helm install NAME/gpu-operator` read it.

    with ChartRepo(directory, pki_dir) as repo:    # a thread of this process
        repo.url                                   # https://127.0.0.1:PORT

    python -m gpu_operator.sim.plane.chartrepo DIR PKI_DIR [PORT]   # the same, in the foreground
"""

from __future__ import annotations

import functools
import http.server
import ssl
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_operator.sim.plane import pki as pki_mod


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        sys.stderr.write(f"chart repo: {self.command} {self.path} -> {args[1] if len(args) > 1 else ''}\n")


@dataclass
class ChartRepo:
    """start() serves ``directory`` on 127.0.0.1 (``port`` 0: any free port); stop() ends it."""

    directory: Path
    pki_dir: Path
    port: int = 0
    server: http.server.ThreadingHTTPServer | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        if self.server is None:
            raise RuntimeError("the chart repository is not started")
        return f"https://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> ChartRepo:
        index = Path(self.directory) / "index.yaml"
        if not index.is_file():
            raise FileNotFoundError(
                f"{index} is missing: a chart repository needs index.yaml (`./dev chart` "
                "writes one, or `helm repo index DIR`)"
            )
        cert, key = pki_mod.issue_serving_cert(
            pki_mod.Pki(self.pki_dir),
            "chart-repo",
            "gpu-operator-sim-chart-repo",
            ["127.0.0.1"],
            ["localhost"],
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        handler = functools.partial(_QuietHandler, directory=str(self.directory))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, name="chart-repo", daemon=True).start()
        return self

    def stop(self) -> None:
        server, self.server = self.server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def __enter__(self) -> ChartRepo:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: python -m gpu_operator.sim.plane.chartrepo DIR PKI_DIR [PORT]\n")
        return 2
    repo = ChartRepo(Path(argv[0]), Path(argv[1]), int(argv[2]) if len(argv) == 3 else 0).start()
    print(f"serving {repo.url}", flush=True)
    threading.Event().wait()  # until signalled (`sim down`)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

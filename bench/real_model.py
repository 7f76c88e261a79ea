"""runbus against a real model server: SmolLM2-135M on the local llama.cpp server.

Same run, same server, same prompt and settings (temperature 0, a fixed seed, a fixed number of
tokens), alternating:
- direct: the OpenAI-compatible streaming request straight to the server (httpx);
- through runbus: a whole run (client → gateway → model router → server → deltas as run
  events → client), the six services in-process on a real nats-server.
First token = request sent → first text delta read; per token = (last delta - first delta) /
(deltas - 1). Then cancel-to-idle: a run generating, `runs.cancel`, until the server's /slots
shows no slot processing.
"""

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import nats
import uvloop
from tests.stack import start_stack

from bench.processes import OPEN_BUS_ALICE
from bench.results import RealModel, SectionNumbers
from runbus import ops
from runbus.client import RunbusClient
from runbus.embedded import EmbeddedNats
from runbus.local_model import MODEL_NAME, LocalModelServer, router_toml
from runbus.logs import configure_logging
from runbus.messages import ModelSettings, RunTextDelta
from runbus.messages.runs import RunCancel
from runbus_gateway.agents import AgentSpec
from runbus_model_router.config import parse_config

PROMPT = "Write a very long story about a dragon who learns to cook."
TOKENS = 32
ROUNDS = 6
CANCELS = 3
SETTINGS = ModelSettings(max_output_tokens=TOKENS, temperature=0, seed=7)


def latencies(sent: float, arrivals: list[float]) -> tuple[float, float, float]:
    """(first token, per token, whole reply) in seconds."""
    per_token = (arrivals[-1] - arrivals[0]) / max(1, len(arrivals) - 1)
    return arrivals[0] - sent, per_token, arrivals[-1] - sent


async def direct(http: httpx.AsyncClient, server: LocalModelServer) -> tuple[float, float, float]:
    body = {
        "model": MODEL_NAME,
        "messages": [
            {"role": "system", "content": "You are a storyteller."},
            {"role": "user", "content": PROMPT},
        ],
        "stream": True,
        "max_tokens": TOKENS,
        "temperature": 0,
        "seed": 7,
    }
    arrivals = []
    sent = time.perf_counter()
    async with http.stream("POST", f"{server.base_url}/chat/completions", json=body) as reply:
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                arrivals.append(time.perf_counter())
    return latencies(sent, arrivals)


async def through_runbus(client: RunbusClient, index: int) -> tuple[float, float, float]:
    arrivals = []
    sent = time.perf_counter()
    async for event in client.stream("story", PROMPT, session_id=f"bench-{index}"):
        if isinstance(event, RunTextDelta) and event.delta:
            arrivals.append(time.perf_counter())
    return latencies(sent, arrivals)


async def generating(http: httpx.AsyncClient, server: LocalModelServer) -> bool:
    slots = (await http.get(f"{server.url}/slots")).json()
    return any(slot["is_processing"] for slot in slots)


async def cancel_to_idle(
    client: RunbusClient, http: httpx.AsyncClient, server: LocalModelServer, index: int
) -> float:
    run_id = await client.start("endless", PROMPT, session_id=f"bench-cancel-{index}")
    async for item in client.follow(run_id):
        if isinstance(item.event, RunTextDelta):
            break
    cancelled = time.perf_counter()
    await client.call(ops.API_RUNS_CANCEL, RunCancel(run_id=run_id))
    # The server's /slots is the only way to see it idle: poll it.
    while True:
        if not await generating(http, server):
            break
        await asyncio.sleep(0.01)
    return time.perf_counter() - cancelled


def ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


async def run_benchmark() -> SectionNumbers:
    configure_logging("warning")
    agents = {
        "story": AgentSpec(
            name="story",
            model="local",
            instructions="You are a storyteller.",
            model_settings=SETTINGS,
        ),
        "endless": AgentSpec(
            name="endless",
            model="local",
            instructions="You are a storyteller.",
            model_settings=ModelSettings(max_output_tokens=2000, temperature=0, seed=7),
        ),
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedNats(Path(tmp) / "js") as nats_server,
        LocalModelServer(slots=1, threads=2) as server,
    ):
        print(f"runbus real-model bench — {MODEL_NAME} on llama.cpp {server.url}, {TOKENS} tokens")
        async with (
            start_stack(
                nats_server.url,
                data_dir=Path(tmp) / "data",
                agents=agents,
                router_config=parse_config(router_toml(server.base_url)),
            ),
            httpx.AsyncClient(timeout=60) as http,
        ):
            nc = await nats.connect(nats_server.url)
            client = RunbusClient(nc, token="dev-alice", identity=OPEN_BUS_ALICE)
            await direct(http, server)  # warm-up: the prompt is cached from here on for both
            await through_runbus(client, -1)
            print("  warmed up", flush=True)
            raw: dict[str, list[tuple[float, float, float]]] = {"direct": [], "runbus": []}
            for index in range(ROUNDS):
                raw["direct"].append(await direct(http, server))
                raw["runbus"].append(await through_runbus(client, index))
            print("  streamed", flush=True)
            cancels = [await cancel_to_idle(client, http, server, i) for i in range(CANCELS)]
            await nc.drain()
    first = {k: ms([f for f, _, _ in v]) for k, v in raw.items()}
    per_token = {k: ms([p for _, p, _ in v]) for k, v in raw.items()}
    whole = {k: ms([w for _, _, w in v]) for k, v in raw.items()}
    r = RealModel(
        first_token_ms=first,
        per_token_ms=per_token,
        first_token_ratio=round(first["runbus"] / first["direct"], 2),
        per_token_ratio=round(per_token["runbus"] / per_token["direct"], 2),
        whole_reply_ms=whole,
        whole_reply_ratio=round(whole["runbus"] / whole["direct"], 2),
        cancel_to_idle_ms=ms(cancels),
        cancel_to_idle_max_ms=round(max(cancels) * 1000, 2),
    )
    print(
        f"  first token   direct {first['direct']:8.1f} ms   runbus {first['runbus']:8.1f} ms"
        f"   ratio {r.first_token_ratio}"
    )
    print(
        f"  per token     direct {per_token['direct']:8.2f} ms   runbus "
        f"{per_token['runbus']:8.2f} ms   ratio {r.per_token_ratio}"
    )
    print(
        f"  whole reply   direct {whole['direct']:8.1f} ms   runbus {whole['runbus']:8.1f} ms"
        f"   ratio {r.whole_reply_ratio}"
    )
    print(
        f"  cancel → idle median {r.cancel_to_idle_ms} ms, max {r.cancel_to_idle_max_ms} ms"
        f" ({CANCELS} runs)"
    )
    return SectionNumbers(real_model=r)


if __name__ == "__main__":
    uvloop.run(run_benchmark())

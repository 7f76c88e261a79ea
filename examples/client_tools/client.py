"""A client with a tool of its own, on the OpenAI SDK: the agent's model calls `local_weather`,
this process runs it and sends the result back, and the same run answers.

    python examples/client_tools/client.py "Weather here?"
"""

import asyncio
import json
import os
import sys
from typing import Any

from openai import AsyncOpenAI

LOCAL_WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "local_weather",
        "description": "The weather where the user is, read from this device.",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        },
    },
}


def local_weather(unit: str = "celsius") -> str:
    """The tool itself: it runs here, on the client, never on the server."""
    return "18 degrees, light rain" if unit == "celsius" else "64 degrees, light rain"


async def ask(base_url: str, question: str, token: str = "dev-alice") -> str:
    """Ask the `device` agent; run every call it makes of our tool until it answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    async with AsyncOpenAI(base_url=base_url, api_key=token) as client:
        while True:
            completion = await client.chat.completions.create(
                model="device", messages=messages, tools=[LOCAL_WEATHER]
            )
            choice = completion.choices[0]
            if choice.finish_reason != "tool_calls":
                return choice.message.content or ""
            messages.append(choice.message.model_dump(exclude_none=True))
            for call in choice.message.tool_calls or []:
                assert call.type == "function"
                arguments = json.loads(call.function.arguments or "{}")
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": local_weather(**arguments)}
                )


if __name__ == "__main__":
    base = os.environ.get("RUNBUS_INGRESS_URL", "http://127.0.0.1:8080/v1")
    print(asyncio.run(ask(base, " ".join(sys.argv[1:]) or "Weather here?")))

"""The model router service: picks the backend for a route, streams deltas as run events, and
records the call as a gen_ai span."""

from pathlib import Path
from typing import Self

import msgspec
from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from runbus import subjects
from runbus.headers import RunContext
from runbus.messages import ModelRequest, ModelResponse, RunTextDelta
from runbus.messages.model import MODEL_REQUEST_DECODER
from runbus.service import Endpoint, Service
from runbus.settings import Settings

from .backends import ModelBackend
from .errors import UnknownRoute
from .offline import OfflineModel
from .scripted import ScriptedModel, Scripts, load_scripts


class ModelRouterService(Service):
    name = "model_router"
    description = "Chooses a model per call, streams deltas, records usage"

    def __init__(self, nc: NATS, routes: dict[str, ModelBackend], **kwargs: object) -> None:
        super().__init__(nc, **kwargs)  # type: ignore[arg-type]
        self.routes = routes

    @classmethod
    def from_settings(cls, nc: NATS, settings: Settings, tracer_provider: TracerProvider) -> Self:
        scripts = load_scripts(Path(settings.model_scripts)) if settings.model_scripts else {}
        return cls(
            nc,
            default_routes(scripts),
            tracer_provider=tracer_provider,
            request_timeout=settings.request_timeout,
        )

    def endpoints(self) -> list[Endpoint]:
        return [
            Endpoint("complete", subjects.MODEL_COMPLETE, MODEL_REQUEST_DECODER, self.on_complete)
        ]

    async def on_complete(self, ctx: RunContext, request: ModelRequest) -> ModelResponse:
        backend = self.routes.get(request.route)
        if backend is None:
            raise UnknownRoute(request.route, sorted(self.routes))
        stream_to = request.stream_to
        message_id = request.message_id

        async def on_delta(text: str) -> None:
            if stream_to:
                delta = RunTextDelta(run_id=ctx.run_id, message_id=message_id, delta=text)
                await self.bus.publish(stream_to, delta, ctx=ctx)

        with self.tracer.start_as_current_span(
            f"chat {backend.name}",
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": "runbus",
                "gen_ai.request.model": request.route,
            },
        ) as span:
            response = await backend.complete(request, on_delta)
            if message_id:
                response = msgspec.structs.replace(
                    response,
                    message=msgspec.structs.replace(response.message, message_id=message_id),
                )
            span.set_attributes(
                {
                    "gen_ai.response.model": response.model,
                    "gen_ai.response.finish_reasons": [response.finish_reason],
                    "gen_ai.usage.input_tokens": response.usage.input_tokens,
                    "gen_ai.usage.output_tokens": response.usage.output_tokens,
                }
            )
        return response


def default_routes(scripts: Scripts) -> dict[str, ModelBackend]:
    routes: dict[str, ModelBackend] = {"offline": OfflineModel()}
    for name, replies in scripts.items():
        routes[f"scripted/{name}"] = ScriptedModel(name, replies)
    return routes

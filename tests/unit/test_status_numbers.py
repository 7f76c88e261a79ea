"""What `runbus status` makes of the `$SRV` replies: replicas joined by instance id, numbers
summed over the replicas, the average over answered requests only."""

import msgspec

from runbus.commands.status import summarise
from runbus.discovery import from_replies


def stats_reply(instance: str, *, requests: int, answered: int, total_ns: int, error: str) -> bytes:
    return msgspec.json.encode(
        {
            "type": "io.nats.micro.v1.stats_response",
            "id": instance,
            "name": "model_router",
            "version": "0.1.0",
            "started": "2026-01-01T00:00:00.000Z",
            "metadata": {"host": f"pod-{instance}"},
            "endpoints": [
                {
                    "name": "complete",
                    "subject": "runbus.model.complete",
                    "queue_group": "model_router",
                    "num_requests": requests,
                    "num_errors": 1 if error else 0,
                    "last_error": error,
                    "processing_time": total_ns,
                    "average_processing_time": total_ns // answered if answered else 0,
                    "data": {"answered": answered},
                }
            ],
        }
    )


def test_the_average_is_over_answered_requests_summed_over_the_replicas() -> None:
    stats = [
        stats_reply("a", requests=2, answered=1, total_ns=300_000_000, error=""),
        stats_reply("b", requests=1, answered=1, total_ns=500_000_000, error="model_error: x"),
    ]
    pings = [msgspec.json.encode({"id": i, "name": "model_router"}) for i in ("a", "b")]

    status = summarise("nats://x", from_replies(pings, [], stats))

    (router,) = [s for s in status.services if s.name == "model_router"]
    (complete,) = router.endpoints
    assert (complete.requests, complete.answered, complete.errors) == (3, 2, 1)
    assert complete.average_ms == 400.0
    assert complete.last_error == "model_error: x"
    assert sorted(r.host for r in router.instances) == ["pod-a", "pod-b"]
    assert all(r.ready for r in router.instances)


def test_a_plain_nats_micro_service_without_a_runbus_count_averages_over_all_requests() -> None:
    reply = msgspec.json.decode(
        stats_reply("c", requests=4, answered=4, total_ns=400_000_000, error="")
    )
    del reply["endpoints"][0]["data"]

    status = summarise("nats://x", from_replies([], [], [msgspec.json.encode(reply)]))

    (complete,) = next(s for s in status.services if s.name == "model_router").endpoints
    assert (complete.requests, complete.answered, complete.average_ms) == (4, 4, 100.0)

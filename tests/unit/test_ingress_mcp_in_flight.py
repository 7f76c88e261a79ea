"""The MCP endpoint's record of calls in flight: a cancel names a JSON-RPC request id, which
only ever reaches the runs of the owner who sent it."""

from runbus_ingress.mcp_endpoint import InFlight

ALICE = ("acme", "alice")
BOB = ("acme", "bob")


def test_a_request_id_names_only_its_owners_runs_and_only_while_in_flight() -> None:
    in_flight = InFlight()

    with in_flight.holding(ALICE, 3, "r-alice"), in_flight.holding(BOB, 3, "r-bob"):
        seen = (in_flight.named(ALICE, 3), in_flight.named(BOB, 3), in_flight.named(ALICE, "3"))

    assert seen == ({"r-alice"}, {"r-bob"}, set())
    assert in_flight.named(ALICE, 3) == set()
    assert in_flight.runs == {}


def test_two_calls_of_one_owner_with_one_request_id_are_both_named() -> None:
    in_flight = InFlight()

    with in_flight.holding(ALICE, 1, "r-first"):
        with in_flight.holding(ALICE, 1, "r-second"):
            both = in_flight.named(ALICE, 1)
        first = in_flight.named(ALICE, 1)

    assert (both, first) == ({"r-first", "r-second"}, {"r-first"})

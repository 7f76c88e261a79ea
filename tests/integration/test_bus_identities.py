"""Per-user identities on NATS itself: a client connects with its bearer token, the auth
callout makes it a NATS user of its own, and a credential the bus does not accept is refused
at connect with one line that says what to do."""

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

import runbus.client
from runbus import subjects
from runbus.errors import Unauthenticated
from runbus.messages import RunCompleted
from runbus.messages.auth import Identity
from runbus.tokens import Principal, TokenVerifier, token_digest
from tests.helpers import refused_raw
from tests.stack import SecuredNats, Stack, secured_nats

RUNBUS = str(Path(sys.executable).parent / "runbus")


async def test_a_token_client_runs_and_replays_its_own_run(
    stack: Stack, nats_server: SecuredNats
) -> None:
    async with runbus.client.connect(nats_server.client_url, token="dev-bob") as bob:
        done = await bob.run("travel", "Weather in Sydney?", session_id="s-bob")
        replayed = [item.event async for item in bob.follow(done.run_id)]
        me = await bob.identity()

    assert isinstance(replayed[-1], RunCompleted)
    assert replayed[-1] == done
    assert me == Identity(
        tenant="acme",
        user_id="bob",
        inbox_prefix=subjects.client_inbox_prefix(token_digest("dev-bob")),
    )


@pytest.mark.parametrize("token", ["dev-mallory", "", "dev-expired"])
async def test_an_unknown_empty_or_expired_token_is_refused_at_connect_in_one_line(
    tmp_path: Path, token: str
) -> None:
    verifier = TokenVerifier(
        {
            "dev-alice": Principal("alice", "acme"),
            "dev-expired": Principal("eve", "acme", expires=time.time() - 1),
        }
    )
    async with secured_nats(tmp_path, verifier) as bus:
        started = time.monotonic()
        with pytest.raises(Unauthenticated) as refused:
            await runbus.client.open_connection(bus.client_url, token, patience=10)

    assert time.monotonic() - started < 5
    message = str(refused.value)
    assert "\n" not in message
    assert "refused the token" in message
    assert "RUNBUS_TOKEN" in message


@pytest.mark.parametrize(
    "options",
    [{}, {"token": "dev-mallory"}, {"user": "runbus-service", "password": "guess"}],
    ids=["none", "unknown-token", "guessed-password"],
)
async def test_a_raw_client_without_a_good_credential_gets_no_connection(
    nats_server: SecuredNats, options: dict[str, str]
) -> None:
    assert "Authorization Violation" in await refused_raw(nats_server.client_url, **options)


async def test_the_cli_with_a_wrong_token_says_what_to_do_in_one_line(
    nats_server: SecuredNats, tmp_path: Path
) -> None:
    process = await asyncio.create_subprocess_exec(
        RUNBUS,
        "sessions",
        "list",
        env={
            **os.environ,
            "RUNBUS_NATS_URL": nats_server.client_url,
            "RUNBUS_DATA_DIR": str(tmp_path),
            "RUNBUS_TOKEN": "dev-mallory",
        },
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 30)

    assert process.returncode != 0
    assert out == b""
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, err.decode()
    assert "refused the token" in lines[0]
    assert "RUNBUS_TOKEN" in lines[0]
    assert "Traceback" not in err.decode()


async def test_a_run_id_alice_used_is_carol_s_own_run_too_and_alice_s_resend_is_no_conflict(
    stack: Stack, nats_server: SecuredNats
) -> None:
    async with (
        runbus.client.connect(nats_server.client_url, token="dev-alice") as alice,
        runbus.client.connect(nats_server.client_url, token="dev-carol") as carol,
    ):
        done = await alice.run("travel", "Weather in Perth?", session_id="s-a", run_id="r-taken")
        hers = await carol.run("travel", "Weather in Hobart?", session_id="s-c", run_id="r-taken")
        # Alice re-sending her own request is no conflict.
        assert await alice.start("travel", "x", session_id="s-a", run_id="r-taken") == "r-taken"

    assert "Hobart" in hers.text
    assert isinstance(done, RunCompleted)

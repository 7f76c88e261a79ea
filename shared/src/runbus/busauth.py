"""Who may connect to the bus and as what: the per-stack NATS secrets, the server
configuration that turns on the auth callout, and the credentials a process connects with.

Three identities bypass the callout with a password of their own: the services (their whole
account), the auth service (the callout subject, in an account of its own) and the monitor
(`runbus status`: discovery only). Every other connection presents a bearer token, which the
auth service turns into a NATS user of the clients' account allowed only that user's subjects.
The nodes of a cluster route to each other with a route password of their own: a route sees
every account, so an unauthenticated one would bypass all of the above.

JetStream writes every message to disk before it acknowledges it (`sync_interval: always`):
an acknowledged run request, event or record survives a machine crash, not only a process
kill. `RUNBUS_NATS_SYNC=lazy` turns that off, with a warning at every start.

Clients live in an account of their own that imports exactly what they may reach: run
requests, API calls, whoami, deliveries into their inboxes, and consumer creation on the events
stream (through the auth service, which forwards one only if it delivers into an inbox of the
user whose events it reads). A reply subject a client makes up therefore names a subject of the
clients' account, never an internal one: a service's or JetStream's answer cannot be steered
onto a cancel, KV, stream or API subject. And as a client may subscribe only under its own
inbox prefix (secret, derived from its token), an answer steered anywhere in the clients'
account reaches nobody else either.
"""

import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, get_args

import nkeys
import structlog

from . import subjects

ACCOUNT: Final = "RUNBUS"
"""The services' account: JetStream, every runbus subject."""
CLIENT_ACCOUNT: Final = "CLIENTS"
"""Where the callout places client connections: only what the services' account exports."""
AUTH_ACCOUNT: Final = "AUTH"
"""The auth service's own account: the server's callout requests arrive there only."""
SERVICE_USER: Final = "runbus-service"
AUTH_USER: Final = "runbus-auth"
MONITOR_USER: Final = "runbus-monitor"
BYPASS_USERS: Final = (SERVICE_USER, AUTH_USER, MONITOR_USER)
"""The users that connect with a password of their own, not through the callout."""
ROUTE_USER: Final = "runbus-route"
"""What one node of a cluster presents to another on the route port (never a client)."""
SECRETS_DIR: Final = "secrets"
ISSUER_SEED_FILE: Final = "issuer.nk"
SERVER_CONFIG_FILE: Final = "nats.conf"

CLIENT_SERVICES: Final = (
    subjects.RUNS_ALL,
    subjects.API_ALL,
    f"$JS.FC.{subjects.EVENTS_STREAM}.>",
)
"""Subjects of the services' account a client may send to (each answered on its own inbox)."""
CLIENT_STREAMS: Final = (f"{subjects.CLIENT_INBOX_ROOT}.>",)
"""Subjects of the services' account a client may receive (permissions narrow them to the
user's own inbox): replies, and deliveries of a consumer it created (its live events)."""
CONSUMER_CREATE: Final = subjects.consumer_create(subjects.EVENTS_STREAM, ">")
"""JetStream's creation of a filtered consumer of the events stream: the auth service's to
call, for the clients (their consumers' deliver subjects checked first)."""
MONITOR_PUBLISH: Final = ("$SRV.>",)
MONITOR_SUBSCRIBE: Final = (f"{subjects.SERVICE_INBOX_PREFIX}.>", subjects.PROGRESS_ALL)

NatsSync = Literal["always", "lazy"]
"""When JetStream writes to disk: before each acknowledgement (`always`), or when the server
gets round to it, at the latest every two minutes (`lazy`, nats-server's own default)."""
SYNC_VARIABLE: Final = "RUNBUS_NATS_SYNC"
SYNC_ALWAYS: Final = "sync_interval: always"
"""The setting every NATS runbus starts or ships carries in its `jetstream` block."""
LAZY_SYNC_RISK: Final = (
    "JetStream acknowledges writes before they are on disk: a machine crash or power loss "
    "loses acknowledged runs, events and records, and can leave cluster replicas disagreeing"
)


def nats_sync(environ: Mapping[str, str] = os.environ) -> NatsSync:
    """The fsync policy `RUNBUS_NATS_SYNC` asks for (default `always`)."""
    value = environ.get(SYNC_VARIABLE, "always").strip().lower() or "always"
    if value not in get_args(NatsSync):
        raise ValueError(f"{SYNC_VARIABLE}={value!r}: expected 'always' (the default) or 'lazy'")
    return "lazy" if value == "lazy" else "always"


def warn_if_lazy(sync: NatsSync) -> None:
    """One warning line at start when fsync before acknowledgement is off."""
    if sync == "lazy":
        structlog.get_logger().warning(
            "nats_fsync_off", variable=SYNC_VARIABLE, value=sync, risk=LAZY_SYNC_RISK
        )


def jetstream_block(sync: NatsSync) -> str:
    """The `jetstream` block of a generated server configuration (store and port come from
    the command line); empty when fsync is off, which leaves nats-server's default."""
    if sync == "lazy":
        return f"# {SYNC_VARIABLE}=lazy: {LAZY_SYNC_RISK}.\n"
    return (
        "# Every write is on disk before it is acknowledged: an acknowledged run survives a\n"
        "# machine crash, not only a process kill.\n"
        f"jetstream {{\n  {SYNC_ALWAYS}\n}}\n"
    )


@dataclass(frozen=True)
class Credentials:
    """A user and password to connect with; the password never shows in a repr."""

    user: str
    password: str = field(repr=False)


def secrets_dir(data_dir: Path) -> Path:
    return data_dir / SECRETS_DIR


def password_file(data_dir: Path, user: str) -> Path:
    """Where the stack keeps the password of `user` (0600)."""
    return secrets_dir(data_dir) / f"{user}.password"


def write_secret(path: Path, value: bytes) -> None:
    # Created 0600 from the start: the secret is never readable by others, not even briefly.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(value)


def new_password() -> str:
    """A random password (256 bits) that nats-server reads back as it is from the environment.

    nats-server parses a variable's value as configuration: `-x…` or `1-2…` is refused and
    `true` is not a string, so `secrets.token_urlsafe` would now and then make a `nats.env`
    the server cannot start with. A letter, then hex digits, is always a plain string; it is
    URL-safe too, as the route password goes inside the route URLs as it is.
    """
    return "rb" + secrets.token_hex(32)


def _read_or_create(path: Path, make: bytes) -> bytes:
    if not path.exists():
        write_secret(path, make)
    path.chmod(0o600)
    return path.read_bytes().strip()


@dataclass(frozen=True, repr=False)
class StackSecrets:
    """The passwords of the three callout-bypassing users and the callout issuer's seed."""

    service_password: str
    auth_password: str
    monitor_password: str
    issuer_seed: bytes

    @classmethod
    def load_or_create(cls, data_dir: Path) -> "StackSecrets":
        """The secrets under `data_dir/secrets`, generated on first use (files 0600)."""
        folder = secrets_dir(data_dir)
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)

        def password(user: str) -> str:
            made = new_password().encode()
            return _read_or_create(password_file(data_dir, user), made).decode()

        seed = nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_ACCOUNT)
        return cls(
            service_password=password(SERVICE_USER),
            auth_password=password(AUTH_USER),
            monitor_password=password(MONITOR_USER),
            issuer_seed=_read_or_create(folder / ISSUER_SEED_FILE, seed),
        )

    @property
    def issuer_public_key(self) -> str:
        key: bytes = nkeys.from_seed(bytearray(self.issuer_seed)).public_key
        return key.decode()


def _quoted(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def server_config(stack: StackSecrets, sync: NatsSync | None = None) -> str:
    """nats-server configuration (accounts, users, auth callout, fsync before acknowledgement
    unless `sync` is `lazy`; default: `RUNBUS_NATS_SYNC`) of a secured stack.

    Listening address, port and JetStream store come from the command line. The text holds
    passwords: write it 0600.
    """
    head = "# Generated by runbus for this stack; holds secrets (0600). Regenerated at start.\n"
    return _config(
        head=head + jetstream_block(nats_sync() if sync is None else sync).rstrip("\n"),
        auth=f'"{stack.auth_password}"',
        service=f'"{stack.service_password}"',
        monitor=f'"{stack.monitor_password}"',
        issuer=f'"{stack.issuer_public_key}"',
    )


DEPLOY_VARIABLES: Final = (
    "NATS_RUNBUS_AUTH_PASSWORD",
    "NATS_RUNBUS_SERVICE_PASSWORD",
    "NATS_RUNBUS_MONITOR_PASSWORD",
    "NATS_RUNBUS_AUTH_ISSUER",
    "NATS_SYS_PASSWORD",
)


def deploy_config() -> str:
    """The same configuration for a deployment (deploy/nats/auth.conf): every secret read from
    the nats-server process's environment, plus a system account for operators."""
    return _config(
        head=(
            "# Who may connect and do what on the bus (generated by `runbus.busauth`; "
            "tests/deploy keeps\n# it equal). Include it from a server config, or run it alone: "
            "nats-server -js -c auth.conf.\n# Secrets come from the environment of the "
            "nats-server process (a Kubernetes Secret, a\n# compose `environment:`); "
            "nats-server refuses to start when one is missing:\n"
            + "\n".join(f"#   {variable}" for variable in DEPLOY_VARIABLES)
        ),
        auth="$NATS_RUNBUS_AUTH_PASSWORD",
        service="$NATS_RUNBUS_SERVICE_PASSWORD",
        monitor="$NATS_RUNBUS_MONITOR_PASSWORD",
        issuer="$NATS_RUNBUS_AUTH_ISSUER",
        system="$NATS_SYS_PASSWORD",
    )


def _config(
    *, head: str, auth: str, service: str, monitor: str, issuer: str, system: str = ""
) -> str:
    exports = "\n".join(
        [f'      {{ service: "{subject}" }}' for subject in (*CLIENT_SERVICES, CONSUMER_CREATE)]
        + [f'      {{ stream: "{subject}" }}' for subject in CLIENT_STREAMS]
    )
    client_api = subjects.consumer_create(subjects.EVENTS_STREAM, ">", subjects.CLIENT_JS_API)
    imports = "\n".join(
        [
            f'      {{ service: {{ account: {ACCOUNT}, subject: "{subject}" }} }}'
            for subject in CLIENT_SERVICES
        ]
        + [
            # Consumer creation as JetStream's API (under a prefix of its own: each account's
            # JetStream serves `$JS.API`), answered by the auth service, which checks it.
            f"      {{ service: {{ account: {AUTH_ACCOUNT}, "
            f'subject: "{subjects.CONSUMER_CHECKS}" }}, to: "{client_api}" }}',
            f"      {{ service: {{ account: {AUTH_ACCOUNT}, "
            f'subject: "{subjects.AUTH_WHOAMI}" }} }}',
        ]
        + [
            f'      {{ stream: {{ account: {ACCOUNT}, subject: "{subject}" }} }}'
            for subject in CLIENT_STREAMS
        ]
    )
    system_account = (
        f"  SYS {{\n    users: [ {{ user: admin, password: {system} }} ]\n  }}\n" if system else ""
    )
    bypass = [AUTH_USER, SERVICE_USER, MONITOR_USER, *(["admin"] if system else [])]
    return f"""\
{head}
accounts {{
  {AUTH_ACCOUNT} {{
    users: [ {{ user: "{AUTH_USER}", password: {auth} }} ]
    exports: [
      {{ service: "{subjects.AUTH_WHOAMI}" }}
      {{ service: "{subjects.CONSUMER_CHECKS}" }}
      {{ stream: "{subjects.progress("auth")}" }}
      # Discovery: the monitor's `$SRV` pings reach the auth service too (one reply each).
      {{ service: "$SRV.>", response_type: stream }}
    ]
    imports: [
      # What the auth service forwards of the clients' consumer creations.
      {{ service: {{ account: {ACCOUNT}, subject: "{CONSUMER_CREATE}" }}, to: "{client_api}" }}
    ]
  }}
  {ACCOUNT} {{
    jetstream: enabled
    users: [
      # The services are trusted with their whole account; clients are not in it as such.
      {{ user: "{SERVICE_USER}", password: {service} }}
      {{
        user: "{MONITOR_USER}", password: {monitor}
        permissions: {{
          publish: {_quoted(MONITOR_PUBLISH)}
          subscribe: {_quoted(MONITOR_SUBSCRIBE)}
        }}
      }}
    ]
    exports: [
{exports}
    ]
    imports: [
      {{ service: {{ account: {AUTH_ACCOUNT}, subject: "{subjects.AUTH_WHOAMI}" }} }}
      # The auth service's start-up progress, for `runbus up` and `runbus status`.
      {{ stream: {{ account: {AUTH_ACCOUNT}, subject: "{subjects.progress("auth")}" }} }}
      {{ service: {{ account: {AUTH_ACCOUNT}, subject: "$SRV.>" }} }}
    ]
  }}
  {CLIENT_ACCOUNT} {{
    imports: [
{imports}
    ]
  }}
{system_account}}}
{"system_account: SYS" + chr(10) if system else ""}authorization {{
  auth_callout {{
    issuer: {issuer}
    account: {AUTH_ACCOUNT}
    auth_users: {_quoted(tuple(bypass))}
  }}
}}
"""


def write_server_config(data_dir: Path, stack: StackSecrets) -> Path:
    """Write the server configuration of `stack` into the secrets folder (0600)."""
    path = secrets_dir(data_dir) / SERVER_CONFIG_FILE
    path.unlink(missing_ok=True)
    write_secret(path, server_config(stack).encode())
    return path


def in_url(url: str) -> bool:
    """True if a (comma-separated) NATS URL carries credentials of its own, which then win."""
    return any("@" in part for part in url.split(","))


def stack_credentials(data_dir: Path, user: str) -> Credentials | None:
    """The credentials of `user` that a local stack generated, if there is one."""
    path = password_file(data_dir, user)
    if not path.exists():
        return None
    return Credentials(user, path.read_text().strip())


CLUSTER_VARIABLES: Final = ("NATS_ROUTE_PASSWORD", "NATS_ROUTE_URLS")
"""What deploy/nats/cluster.conf reads besides auth.conf's: the route password, and every
node's route URL carrying it (nats-server reads no variable inside a string, so the URLs come
whole; compose.cluster.yaml and the Helm values build them from the password)."""


def write_deploy_env(data_dir: Path, stack: StackSecrets) -> Path:
    """`nats.env` beside the secrets: the variables deploy/nats/auth.conf reads, and the route
    password of deploy/nats/cluster.conf (0600), for a compose `env_file:` or a Kubernetes
    Secret."""

    def password(name: str) -> str:
        return _read_or_create(secrets_dir(data_dir) / name, new_password().encode()).decode()

    values = {
        "NATS_RUNBUS_AUTH_PASSWORD": stack.auth_password,
        "NATS_RUNBUS_SERVICE_PASSWORD": stack.service_password,
        "NATS_RUNBUS_MONITOR_PASSWORD": stack.monitor_password,
        "NATS_RUNBUS_AUTH_ISSUER": stack.issuer_public_key,
        "NATS_SYS_PASSWORD": password("sys.password"),
        "NATS_ROUTE_PASSWORD": password("route.password"),
    }
    path = secrets_dir(data_dir) / "nats.env"
    path.unlink(missing_ok=True)
    write_secret(path, "".join(f"{k}={v}\n" for k, v in values.items()).encode())
    return path

"""Which task at a remote A2A agent a run's call started, one KV record per call under the
run's owner (in the approvals bucket, as `<tenant>.<user_id>.<run_id>.a2a.<digest of call
id>`): a run resumed after its gateway died follows that task again instead of sending its
message a second time."""

from nats.js.kv import KeyValue

from runbus.kv import TypedBucket
from runbus.owners import Owner, digest

from .run.a2a_task import REMOTE_TASK_DECODER, RemoteTaskRef


def remote_task_key(owner: Owner, run_id: str, call_id: str) -> str:
    return owner.key(run_id, "a2a", digest(call_id))


class RemoteTasks:
    def __init__(self, kv: KeyValue) -> None:
        self.bucket = TypedBucket(kv, REMOTE_TASK_DECODER)

    async def get(self, owner: Owner, run_id: str, call_id: str) -> RemoteTaskRef | None:
        return await self.bucket.value(remote_task_key(owner, run_id, call_id))

    async def put(self, owner: Owner, run_id: str, call_id: str, ref: RemoteTaskRef) -> None:
        await self.bucket.put(remote_task_key(owner, run_id, call_id), ref)

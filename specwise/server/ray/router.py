"""Which replica takes a request: Ray Serve's request router hook, keeping a key's requests on one replica.

Why a request router rather than choosing in the ingress: the router is where Ray Serve keeps the
live set of replicas (grown and shrunk by autoscaling, a dead one dropped and its replacement
added) and their queue lengths, and where a request is sent on to another replica when the first
one refuses it (full at max_ongoing_requests) or dies before taking it. An ingress choosing among
handles would have to track all of that itself, and Ray Serve gives no handle to one replica of a
deployment. The router keeps a key on its home replica (rendezvous hashing over replica ids) while
that replica has a free place in its batch (`overflow_at`, the engine's max_batch), then prefers
less loaded replicas, least loaded first: a warm cache is worth a little queueing, not a full one.
A call with `replica=ID` goes to that replica only (the ingress scraping each replica's metrics).
"""

from __future__ import annotations

from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from specwise.server.affinity import rendezvous_order


class AffinityRouter(RequestRouter):
    """Each request to its key's home replica while it has room, else to a less loaded one (see the module)."""

    def initialize_state(self, overflow_at: int = 1) -> None:
        self.overflow_at = overflow_at

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        kwargs = pending_request.kwargs if pending_request is not None else {}
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        pinned = kwargs.get("replica")
        if pinned is not None:
            return [[by_id[pinned]]] if pinned in by_id else []
        key = kwargs.get("affinity")
        if key is None or len(by_id) < 2:
            return [list(candidate_replicas)]  # Serve takes the least loaded of those that accept
        home, *rest = (by_id[replica_id] for replica_id in rendezvous_order(key, by_id))
        if self._load(home) < self.overflow_at:
            return [[home], rest]
        lighter = sorted((r for r in rest if self._load(r) < self._load(home)), key=self._load)
        heavier = [r for r in rest if r not in lighter]
        return [rank for rank in (lighter, [home], heavier) if rank]

    def _load(self, replica: RunningReplica) -> int:
        """Requests on the replica as last reported (0 when unknown: then the home is tried first)."""
        return self.replica_queue_len_cache.get(replica.replica_id) or 0


def replica_ids(handle: DeploymentHandle) -> list[str]:
    """The replicas the handle's request router knows now ([] before the handle's first call). Ray Serve 2.60
    has no public way to list a deployment's replicas from a replica; its router's list is read here."""
    inner = getattr(getattr(handle, "_router", None), "_asyncio_router", None)
    router = getattr(inner, "request_router", None)
    return sorted(replica_id.unique_id for replica_id in list(router.curr_replicas)) if router else []

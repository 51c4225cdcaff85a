"""specwise on Ray Serve: replicas that each hold one specwise engine, behind one OpenAI-compatible API.

Optional (`pip install specwise[ray]`) and imported only when asked for (`specwise serve --replicas N`
or `--ray-address ADDR`, or `application()` from Python). One module a piece:

- `replica.py`, `Engine`, the replicas: each builds the app of a single server (`create_app`: a
  SpecDecoder with its batching scheduler, KV budget, prefix and suffix caches, per-tenant scopes and
  limits) and answers the HTTP requests the ingress forwards by running them through that app in
  process (specwise.server.relay). Every endpoint, check, error and limit is the single process's own.
- `ingress.py`, `Ingress`, behind Ray Serve's HTTP proxy: reads a request's affinity key
  (specwise.server.affinity), forwards it, relays the answer as it comes (streams included) and adds
  the header `x-specwise-replica`; `/metrics` and `/health` gather every replica's; faults, overload
  and the drain at shutdown.
- `router.py`, `AffinityRouter`, Ray Serve's request router hook, which picks the replica of each
  request.
- `deploy.py`: the application (`ReplicaSettings`, `application`, `deploy`) and `specwise serve` on
  Ray (`run_cli`: Ray started or joined, the signal that stops it, the drain before Serve stops).

This package imports nothing itself, so that naming it needs no Ray; import the module that holds
what you need.
"""

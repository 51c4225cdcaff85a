"""The Ray Serve application of specwise, and `specwise serve` on Ray: replicas, ingress, start and stop.

`application()` binds the engine replicas (replica.py, routed by router.py) behind the ingress
(ingress.py); `deploy()` starts Serve's HTTP proxy and the application; `run_cli()` is `specwise
serve --replicas N` (or `--ray-address ADDR`): Ray started or joined, serving until SIGTERM or
Ctrl-C, then the ingress drained before Serve stops.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.config import RequestRouterConfig

from specwise.server.ray.ingress import STALL_TIMEOUT, Ingress
from specwise.server.ray.replica import Engine
from specwise.server.ray.router import AffinityRouter

log = logging.getLogger("specwise.server")

APP_NAME = "specwise"
ENGINE = "specwise-engine"
INGRESS = "specwise-ingress"


@dataclass(frozen=True)
class ReplicaSettings:
    """How many replicas, how they scale, and what each may take (the `specwise serve` flags).

    replicas: a fixed number of replicas; with min_replicas or max_replicas, the number to start with.
    min_replicas, max_replicas, target_ongoing_requests: Ray Serve's autoscaling (either bound set
        turns it on); it aims at target_ongoing_requests requests per replica.
    threads_per_replica: torch threads (and Ray CPUs) of each replica.
    max_ongoing_requests: the requests a replica takes before Serve routes elsewhere or queues;
        above its engine's batch plus queue, so that the engine's own 429 comes first.
    overflow_at: requests on a key's home replica from which a less loaded replica is preferred.
    """

    replicas: int | None = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None
    threads_per_replica: int = 1
    max_ongoing_requests: int = 64
    overflow_at: int = 1
    health_check_period_s: float = 10.0
    graceful_shutdown_timeout_s: float = 25.0
    stall_timeout: float = STALL_TIMEOUT
    api_keys: tuple[str, ...] = field(default_factory=tuple)

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None or self.max_replicas is not None


def application(app_factory: Callable[[], FastAPI], settings: ReplicaSettings) -> serve.Application:
    """The Ray Serve application: engine replicas, each running app_factory() (a create_app app), and the
    ingress. app_factory runs in each replica, so it must be importable there (a module-level function,
    or a functools.partial of one)."""
    scaling: dict[str, Any]
    if settings.autoscaling:
        least = settings.min_replicas if settings.min_replicas is not None else 1
        config = {"min_replicas": least, "max_replicas": settings.max_replicas or max(least, settings.replicas or 1),
                  "initial_replicas": settings.replicas or least}
        if settings.target_ongoing_requests is not None:
            config["target_ongoing_requests"] = settings.target_ongoing_requests
        scaling = {"autoscaling_config": config}
    else:
        scaling = {"num_replicas": settings.replicas or 1}
    engine = serve.deployment(Engine).options(
        name=ENGINE, ray_actor_options={"num_cpus": settings.threads_per_replica},
        max_ongoing_requests=settings.max_ongoing_requests, max_queued_requests=4 * settings.max_ongoing_requests,
        health_check_period_s=settings.health_check_period_s,
        graceful_shutdown_timeout_s=settings.graceful_shutdown_timeout_s,
        request_router_config=RequestRouterConfig(
            request_router_class=f"{AffinityRouter.__module__}.{AffinityRouter.__qualname__}",
            request_router_kwargs={"overflow_at": settings.overflow_at}),
        **scaling)
    ingress = serve.deployment(serve.ingress()(Ingress)).options(name=INGRESS, ray_actor_options={"num_cpus": 0},
                                                max_ongoing_requests=100_000)
    return ingress.bind(engine.bind(app_factory, settings.threads_per_replica), list(settings.api_keys),
                        settings.stall_timeout)


def deploy(app: serve.Application, *, host: str, port: int, name: str = APP_NAME) -> str:
    """Start Serve's HTTP proxy on host:port (if Serve is not running yet) and the application; its URL."""
    serve.start(http_options={"host": host, "port": port})
    serve.run(app, name=name, route_prefix="/")
    return f"http://{host}:{port}"


def run_cli(args: argparse.Namespace, build_app: Callable[[argparse.Namespace], FastAPI],
            api_keys: list[str] | None) -> int:
    """`specwise serve` with replicas on Ray: a local Ray, or the cluster at --ray-address. build_app(args)
    makes a replica's app (specwise.server.cli's, passed in so that this module does not import the CLI)."""
    import ray

    if args.ray_address:
        ray.init(address=args.ray_address)
    else:
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        counts = [n for n in (args.replicas, args.max_replicas, args.min_replicas) if n]
        cores = int(ray.cluster_resources().get("CPU", os.cpu_count() or 1))
        threads = args.threads_per_replica or max(1, cores // max(counts or [1]))
        settings = ReplicaSettings(
            replicas=args.replicas, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            target_ongoing_requests=args.target_ongoing_requests, threads_per_replica=threads,
            max_ongoing_requests=args.max_batch + args.max_queue + 1, overflow_at=args.max_batch,
            graceful_shutdown_timeout_s=args.shutdown_grace, api_keys=tuple(api_keys or ()))
        replica_args = argparse.Namespace(**{**vars(args), "threads": threads})
        url = deploy(application(partial(build_app, replica_args), settings), host=args.host, port=args.port)
        print(f"specwise: serving on Ray Serve at {url}/v1 ({threads} threads per replica); SIGTERM or "
              "Ctrl-C stops it", flush=True)
        _wait_for_signal()
        _drain(args.shutdown_grace)
    finally:
        if args.ray_address:
            serve.delete(APP_NAME)  # the cluster's other applications stay
        else:
            serve.shutdown()
        ray.shutdown()
    return 0


def _drain(grace: float) -> None:
    """Drain the ingress (Ingress.drain) before Serve stops, which would cut every open connection."""
    log.info("stopping: new requests get 503; those in flight may finish for up to %g s", grace)
    try:
        left = serve.get_deployment_handle(INGRESS, APP_NAME).drain.remote(grace).result(timeout_s=grace + 30)
    except Exception as exc:  # Serve or the ingress is gone: nothing left to wait for
        log.warning("could not drain the ingress (%s); stopping now", type(exc).__name__)
        return
    if left:
        log.warning("ended %d requests still open after %g s", left, grace)


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass

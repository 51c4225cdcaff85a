"""`specwise serve`: load the target and drafter, then serve them over HTTP with uvicorn.

`add_serve_parser` adds the subcommand to the CLI's argparse subparsers and sets
`func` (called as `args.func(args)`, returning the exit code). The served model
name is the target as given (a registry name, by default the default target).
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys

from specwise.batching import DEFAULT_PREFILL_CHUNK
from specwise.cli_options import add_model_options, apply_threads, spec_from_args
from specwise.server.limits import (DEFAULT_BODY_TIMEOUT, DEFAULT_CLIENT_SHARE, DEFAULT_MAX_CONNECTIONS,
                                    DEFAULT_MAX_DRAFT_TOKENS, limit_problems)

DEFAULT_SHUTDOWN_GRACE = 25.0  # below the 30 s after which orchestrators (Kubernetes, Docker) kill
DEFAULT_READ_TIMEOUT = 30.0
DEFAULT_MAX_BATCH = 8


def add_serve_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "serve",
        help="serve a target and drafter through an OpenAI-compatible HTTP API",
        description="OpenAI-compatible server: POST /v1/completions and /v1/chat/completions "
                    "(stream or not), GET /v1/models, /health, /metrics (Prometheus). Requests may "
                    "choose drafter, verifier and block size with a 'speculative' object.",
    )
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1: this machine only; "
                             "another address exposes the server, so set --api-key too)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--max-queue", type=int, default=16,
                        help="requests that may wait beyond those being generated; more get 429 with "
                             "Retry-After (default 16)")
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH,
                        help="requests generated at once, their target passes batched into one per step (each "
                             "one's output is what it would be alone); 1 generates one request at a time "
                             f"(default {DEFAULT_MAX_BATCH})")
    parser.add_argument("--prefill-chunk", type=int, default=DEFAULT_PREFILL_CHUNK,
                        help="with --max-batch above 1, prompts are read this many tokens per step, between the "
                             f"other requests' steps, so that they keep streaming (default {DEFAULT_PREFILL_CHUNK})")
    parser.add_argument("--kv-budget-tokens", type=int, default=None,
                        help="KV cache, in tokens, that the requests being generated may hold together; each "
                             "reserves its prompt plus max_tokens and waits in the queue until that fits; one "
                             "larger than the whole budget gets 400 (default: the model's context window)")
    parser.add_argument("--prefix-cache-mb", type=int, default=None,
                        help="MiB of KV entries of earlier prompts and answers kept for reuse by requests that "
                             "start the same way, scoped like --sharing, least recently used evicted first; "
                             "inside the KV budget (cached entries are evicted to admit a request); 0: off "
                             "(default: as much as the KV budget leaves)")
    parser.add_argument("--shutdown-grace", type=float, default=DEFAULT_SHUTDOWN_GRACE,
                        help="on SIGTERM or SIGINT, seconds the requests in flight may take to finish while new "
                             "ones get 503; then streams end with an error event and waiting requests get 503 "
                             f"(default {DEFAULT_SHUTDOWN_GRACE:g})")
    parser.add_argument("--read-timeout", type=float, default=DEFAULT_READ_TIMEOUT,
                        help="seconds a client has to send a request's line and headers, and the longest its "
                             "body may stall; then the connection is closed (default "
                             f"{DEFAULT_READ_TIMEOUT:g})")
    parser.add_argument("--body-timeout", type=float, default=DEFAULT_BODY_TIMEOUT,
                        help="seconds a request's whole body may take to arrive, however steadily it trickles; "
                             f"then 408 and the connection is closed (default {DEFAULT_BODY_TIMEOUT:g})")
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                        help="connections open at once; one more is answered 503 and closed (default "
                             f"{DEFAULT_MAX_CONNECTIONS})")
    parser.add_argument("--max-draft-tokens", type=int, default=DEFAULT_MAX_DRAFT_TOKENS,
                        help="the most draft tokens a request's step may score: its k, adaptive k_max (the "
                             "larger of k and k_max for adaptive auto) or tree nodes; more get 400 (default "
                             f"{DEFAULT_MAX_DRAFT_TOKENS})")
    parser.add_argument("--client-share", type=float, default=DEFAULT_CLIENT_SHARE,
                        help="the fraction of the KV budget, the workers and the waiting line one client (API "
                             "key; without keys, bearer token and 'user') may hold while another client's "
                             f"request waits; 1: first come, first served (default {DEFAULT_CLIENT_SHARE:g})")
    parser.add_argument("--api-key", action="append", default=None,
                        help="require 'Authorization: Bearer KEY' on every endpoint but /health; repeat it "
                             "to give each tenant its own key (default: $SPECWISE_API_KEY, else no key)")
    parser.add_argument("--sharing", choices=("tenant", "global", "off"), default="tenant",
                        help="whose earlier requests the suffix drafter may draft from: tenant (default: the "
                             "same API key, and the same 'user' within it; without keys, the same bearer "
                             "token and 'user', which clients choose themselves), global (every request) "
                             "or off")
    add_replica_options(parser)
    add_model_options(parser)
    # No draft model unless the draft-model drafter is the default or one is named: a request
    # choosing draft-model must not load one mid-request.
    parser.set_defaults(func=cmd_serve, drafter_model=None)
    return parser


def add_replica_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "replicas on Ray Serve (pip install specwise[ray]; docs/SCALING.md)",
        "Each replica holds its own engine (the model, batching, KV budget, prefix and suffix caches) behind the "
        "same API; a tenant's or conversation's requests keep going to the same replica.")
    group.add_argument("--replicas", type=int, default=None,
                       help="serve with this many replicas on a local Ray (with --min-replicas or --max-replicas: "
                            "the number to start with)")
    group.add_argument("--ray-address", default=None,
                       help="run the replicas on the Ray cluster at this address (e.g. ray://head:10001 or auto) "
                            "instead of a local Ray")
    group.add_argument("--min-replicas", type=int, default=None,
                       help="autoscaling: the fewest replicas Ray Serve keeps")
    group.add_argument("--max-replicas", type=int, default=None,
                       help="autoscaling: the most replicas Ray Serve starts")
    group.add_argument("--target-ongoing-requests", type=float, default=None,
                       help="autoscaling: the requests in flight per replica that Ray Serve aims at (default: "
                            "Ray Serve's)")
    group.add_argument("--threads-per-replica", type=int, default=None,
                       help="torch threads (and Ray CPUs) of each replica, so that replicas on one machine do not "
                            "fight over cores (default: the cluster's cores // the most replicas)")


def uses_ray(args: argparse.Namespace) -> bool:
    """Whether the options ask for replicas on Ray Serve."""
    return any(getattr(args, name, None) is not None for name in
               ("replicas", "ray_address", "min_replicas", "max_replicas", "target_ongoing_requests",
                "threads_per_replica"))


def build_app(args: argparse.Namespace):
    """The FastAPI app `serve` runs: loads the models (slow), so errors come before listening."""
    from specwise.api import SpecDecoder
    from specwise.store.catalog import DEFAULT_DRAFTER
    from specwise.server.app import create_app
    from specwise.server.limits import ServerLimits

    apply_threads(args.threads)
    spec = spec_from_args(args)
    target = args.target
    # Only load the default draft model when it is the default drafter or asked for by name.
    drafter_model = args.drafter_model or (DEFAULT_DRAFTER if args.drafter == "draft-model" else None)
    # No bound of its own by default: create_app bounds the prefix cache by the KV budget.
    cache_bytes = sys.maxsize if args.prefix_cache_mb is None else args.prefix_cache_mb << 20
    decoder = SpecDecoder(target, spec, drafter_model=drafter_model, dtype=args.dtype, max_batch=args.max_batch,
                          prefill_chunk=args.prefill_chunk, prefix_cache_bytes=cache_bytes)
    return create_app({target: decoder}, default_spec=spec, max_queue=args.max_queue, api_key=api_keys(args),
                      sharing=args.sharing, kv_budget_tokens=args.kv_budget_tokens,
                      limits=ServerLimits(args.max_draft_tokens, args.client_share, args.body_timeout))


def api_keys(args: argparse.Namespace) -> list[str] | None:
    """The --api-key values, else $SPECWISE_API_KEY, else None (no key)."""
    if args.api_key:
        return list(args.api_key)
    return [os.environ["SPECWISE_API_KEY"]] if os.environ.get("SPECWISE_API_KEY") else None


def cmd_serve(args: argparse.Namespace) -> int:
    from specwise.errors import ModelError
    from specwise.server import lifecycle

    if not 0 <= args.port <= 65535:
        print(f"error: --port must be in [0, 65535]; got {args.port}", file=sys.stderr)
        return 2
    for problem in option_problems(args):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if not is_loopback(args.host) and not api_keys(args):
        print(f"warning: listening on {args.host} without --api-key: anyone who can reach this "
              "address can use the server", file=sys.stderr)
    if uses_ray(args):
        try:  # Ray Serve's proxy binds the port itself, later: a taken one is reported here, before Ray starts
            lifecycle.bind(args.host, args.port).close()
        except OSError as exc:
            return _port_taken(args, exc)
        # Read by Ray when imported: Ray reports nothing home unless asked to, and a local Ray serves this
        # machine only, its own servers on the loopback address (Ray's switch for one-machine clusters);
        # only --host, given to Ray Serve's HTTP proxy, is exposed.
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if args.ray_address is None:
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            from specwise.server.ray.deploy import run_cli
        except ImportError as exc:
            print(f"error: --replicas, --ray-address and the other replica options run specwise on Ray Serve, "
                  f"which cannot be imported here ({exc}); install it with: pip install specwise[ray]",
                  file=sys.stderr)
            return 2
        return run_cli(args, build_app, api_keys(args))
    try:  # the port first: one taken is reported before minutes of loading
        sock = lifecycle.bind(args.host, args.port)
    except OSError as exc:
        return _port_taken(args, exc)
    try:
        app = build_app(args)
    except (ValueError, OSError, ModelError) as exc:
        sock.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    lifecycle.serve(app, host=args.host, port=args.port, shutdown_grace=args.shutdown_grace,
                 read_timeout=args.read_timeout, max_connections=args.max_connections, sock=sock)
    return 0


def _port_taken(args: argparse.Namespace, exc: OSError) -> int:
    print(f"error: cannot listen on {args.host}:{args.port} ({exc.strerror or exc}); choose another --port "
          "or stop what holds it", file=sys.stderr)
    return 2


def option_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the server's own options, each with the fix."""
    problems = []
    if args.max_queue < 0:
        problems.append(f"--max-queue must be >= 0; got {args.max_queue}")
    if args.max_batch < 1:
        problems.append(f"--max-batch must be >= 1 (1: one request at a time); got {args.max_batch}")
    if args.prefill_chunk < 1:
        problems.append(f"--prefill-chunk must be >= 1; got {args.prefill_chunk}")
    if args.prefix_cache_mb is not None and args.prefix_cache_mb < 0:
        problems.append(f"--prefix-cache-mb must be >= 0 (0: no prefix cache); got {args.prefix_cache_mb}")
    if args.kv_budget_tokens is not None and args.kv_budget_tokens < 1:
        problems.append(f"--kv-budget-tokens must be >= 1 (or left out); got {args.kv_budget_tokens}")
    if not 0 <= args.shutdown_grace < float("inf"):
        problems.append(f"--shutdown-grace must be a number of seconds >= 0; got {args.shutdown_grace}")
    if not 0 < args.read_timeout < float("inf"):
        problems.append(f"--read-timeout must be a number of seconds > 0; got {args.read_timeout}")
    if args.max_connections < 1:
        problems.append(f"--max-connections must be >= 1; got {args.max_connections}")
    return problems + replica_problems(args) + limit_problems(args.max_draft_tokens, args.client_share,
                                                              args.body_timeout)


def replica_problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the replica options (Ray Serve), each with the fix."""
    problems = []
    for name in ("replicas", "min_replicas", "max_replicas", "threads_per_replica"):
        value = getattr(args, name, None)
        least = 0 if name == "min_replicas" else 1
        if value is not None and value < least:
            problems.append(f"--{name.replace('_', '-')} must be >= {least}; got {value}")
    low, high = getattr(args, "min_replicas", None), getattr(args, "max_replicas", None)
    if low is not None and high is not None and low > high:
        problems.append(f"--min-replicas ({low}) must not exceed --max-replicas ({high})")
    start = getattr(args, "replicas", None)
    if start is not None and ((low is not None and start < low) or (high is not None and start > high)):
        problems.append(f"--replicas ({start}) must lie between --min-replicas and --max-replicas when autoscaling")
    target = getattr(args, "target_ongoing_requests", None)
    if target is not None and not 0 < target < float("inf"):
        problems.append(f"--target-ongoing-requests must be a number > 0; got {target}")
    if target is not None and low is None and high is None:
        problems.append("--target-ongoing-requests steers autoscaling: give --min-replicas or --max-replicas too")
    return problems


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IP addresses (the server needs no API key there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

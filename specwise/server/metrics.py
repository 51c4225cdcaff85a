"""Prometheus metrics of one server app, in a registry of its own.

The speculative counters are sums of each generation's SpecStats (never
recomputed here), so that over any time window:
    α = rate(specwise_spec_draft_tokens_accepted_total) / rate(specwise_spec_draft_tokens_proposed_total)
    τ = 1 + rate(specwise_spec_draft_tokens_accepted_total) / rate(specwise_spec_steps_total)
    per-position acceptance i = rate(specwise_spec_accepted_at_position_total{position="i"})
                                / rate(specwise_spec_proposed_at_position_total{position="i"})
The prefix caches are read at each scrape (specwise_prefix_cache_*: lookups, hits,
hit tokens, stored and evicted blocks and tokens, bytes held and their bound), and
so are the gauges routers read under vLLM's names (vllm:num_requests_running,
vllm:num_requests_waiting, vllm:kv_cache_usage_perc and its older name
vllm:gpu_cache_usage_perc: reserved plus cached tokens over the KV budget).
The suffix drafter's store of earlier requests is read at each scrape:
specwise_suffix_store_tokens against its bound specwise_suffix_store_limit_tokens,
with its nodes, requests and sharing scopes, per model.
A generation stopped early by its client is counted as finish_reason
"cancelled" with the tokens it produced; its partial SpecStats are not
available, so it adds nothing to the speculative counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specwise.stats import SpecStats
from specwise.server.scheduler import Job, Message, Scheduler

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("specwise_requests", "HTTP requests by endpoint and status code",
                                ["endpoint", "status"], registry=r)
        self.errors = Counter("specwise_errors", "Errors returned to clients, by OpenAI error type and code",
                              ["type", "code"], registry=r)
        self.disconnects = Counter("specwise_client_disconnects",
                                   "Clients that went away before their generation finished", registry=r)
        self.generations = Counter("specwise_generations",
                                   "Generations ended, by reason (stop, length, cancelled, failed)",
                                   ["model", "finish_reason"], registry=r)
        self.prompt_tokens = Counter("specwise_prompt_tokens", "Prompt tokens of generations started",
                                     ["model"], registry=r)
        self.generated_tokens = Counter("specwise_generated_tokens", "Tokens generated (sent or not)",
                                        ["model"], registry=r)
        self.latency = Histogram("specwise_request_latency_seconds",
                                 "From receiving a generation request to its last token",
                                 ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specwise_time_to_first_token_seconds",
                              "From receiving a generation request to its first token",
                              ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.waiting = Gauge("specwise_queue_waiting", "Requests waiting for a worker", registry=r)
        self.running = Gauge("specwise_requests_running", "Requests being generated now", registry=r)
        self.kv_budget = Gauge("specwise_kv_budget_tokens", "KV cache the admitted requests may hold together",
                               registry=r)
        self.kv_used = Gauge("specwise_kv_used_tokens",
                             "KV cache reserved by admitted requests (prompt plus max_tokens each)", registry=r)
        self.kv_queued = Gauge("specwise_kv_queued_tokens", "KV cache that the waiting requests ask for",
                               registry=r)
        labels = ["model", "drafter"]
        self.steps = Counter("specwise_spec_steps", "Speculative steps (propose, score, verify, commit)",
                             labels, registry=r)
        self.proposed = Counter("specwise_spec_draft_tokens_proposed", "Draft tokens offered to the verifier",
                                labels, registry=r)
        self.accepted = Counter("specwise_spec_draft_tokens_accepted", "Draft tokens the verifier kept",
                                labels, registry=r)
        self.proposed_at = Counter("specwise_spec_proposed_at_position",
                                   "Steps that proposed at least `position` draft tokens",
                                   labels + ["position"], registry=r)
        self.accepted_at = Counter("specwise_spec_accepted_at_position",
                                   "Steps whose first `position` draft tokens were all accepted",
                                   labels + ["position"], registry=r)

    def watch(self, scheduler: Scheduler) -> None:
        """Read the queue and KV budget gauges from the scheduler at each scrape."""
        self.waiting.set_function(lambda: scheduler.waiting)
        self.running.set_function(lambda: scheduler.running)
        self.kv_budget.set_function(lambda: scheduler.kv_budget_tokens or 0)
        self.kv_used.set_function(lambda: scheduler.kv_used_tokens)
        self.kv_queued.set_function(lambda: scheduler.kv_queued_tokens)

    def watch_drafters(self, decoders: Mapping[str, Any]) -> None:
        """Report what the decoders' drafters keep of earlier requests (those with a `usage()`)."""
        self.registry.register(_StoreCollector(decoders))
        self.registry.register(_BatchCollector(decoders))
        self.registry.register(_PrefixCacheCollector(decoders))

    def watch_vllm_names(self, scheduler: Scheduler, models: Sequence[str]) -> None:
        """The scheduler's gauges under vLLM's names too, one sample per served model."""
        self.registry.register(_VLLMCollector(scheduler, list(models)))

    def error(self, type: str, code: str | None) -> None:
        self.errors.labels(type, code or "").inc()

    def record_finish(self, job: Job, message: Message, generated: int) -> None:
        """Scheduler callback (in a worker thread) when a job ends, however it ends."""
        if message.kind == "done":
            result = message.value
            reason = result.finish_reason
            self.record_stats(job.model, job.spec.drafter, result.stats)
            generated = len(result.token_ids)
        else:
            reason = message.kind
        if job.started:
            self.prompt_tokens.labels(job.model).inc(len(job.prompt_ids))
        self.generations.labels(job.model, reason).inc()
        self.generated_tokens.labels(job.model).inc(generated)

    def record_stats(self, model: str, drafter: str, stats: SpecStats) -> None:
        self.steps.labels(model, drafter).inc(stats.steps)
        self.proposed.labels(model, drafter).inc(stats.proposed)
        self.accepted.labels(model, drafter).inc(stats.accepted)
        for i, (proposed, accepted) in enumerate(zip(stats.proposed_at, stats.accepted_at), start=1):
            self.proposed_at.labels(model, drafter, str(i)).inc(proposed)
            self.accepted_at.labels(model, drafter, str(i)).inc(accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StoreCollector(Collector):
    """Gauges of the drafters' stores of earlier requests, summed per model, read at each scrape."""

    FIELDS = (("tokens", "Tokens of earlier requests the suffix drafter keeps"),
              ("limit", "The bound on those tokens (suffix_cache_tokens), oldest dropped first"),
              ("nodes", "Nodes of the suffix drafter's tries of earlier requests"),
              ("requests", "Earlier requests the suffix drafter keeps"),
              ("scopes", "Sharing scopes (tenants) with earlier requests kept"))

    def __init__(self, decoders: Mapping[str, Any]) -> None:
        self.decoders = decoders

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {field: GaugeMetricFamily(f"specwise_suffix_store_{field}" + ("_tokens" if field == "limit" else ""),
                                             text, labels=["model"]) for field, text in self.FIELDS}
        for model, decoder in self.decoders.items():
            drafters = decoder.drafters() if callable(getattr(decoder, "drafters", None)) else []
            # Drafters may share a store: each store counted once.
            usages = list({id(getattr(d, "store", d)): d.usage() for d in drafters
                           if callable(getattr(d, "usage", None))}.values())
            if usages:
                for field, _ in self.FIELDS:
                    families[field].add_metric([model], sum(getattr(u, field) for u in usages))
        yield from families.values()


class _BatchCollector(Collector):
    """What the decoders' batchers do (continuous batching), summed per model, read at each scrape."""

    def __init__(self, decoders: Mapping[str, Any]) -> None:
        self.decoders = decoders

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        members = GaugeMetricFamily("specwise_batch_members", "Generations sharing the target's passes now",
                                    labels=["model"])
        rows = GaugeMetricFamily("specwise_batch_last_pass_rows", "Rows (tokens of every generation) in the "
                                 "last batched target pass", labels=["model"])
        planned = GaugeMetricFamily("specwise_batch_planned_k", "Mean draft length the goodput rule planned "
                                    "for the generations of the next pass", labels=["model"])
        acceptance = GaugeMetricFamily("specwise_batch_acceptance", "Mean per-token draft acceptance the "
                                       "goodput rule estimates for the batched generations", labels=["model"])
        rounds = CounterMetricFamily("specwise_batch_passes", "Batched target passes (rounds)", labels=["model"])
        scored = CounterMetricFamily("specwise_batch_scored_rows", "Rows scored in batched target passes",
                                     labels=["model"])
        chunks = CounterMetricFamily("specwise_batch_prefill_chunks", "Prompt chunks read between passes",
                                     labels=["model"])
        for model, decoder in self.decoders.items():
            batchers = decoder.batchers() if callable(getattr(decoder, "batchers", None)) else []
            if not batchers:
                continue
            plans = [b.planner.snapshot() for b in batchers]
            members.add_metric([model], sum(b.members for b in batchers))
            rows.add_metric([model], sum(b.stats.last_rows for b in batchers))
            planned.add_metric([model], max(p["mean_planned_k"] for p in plans))
            acceptance.add_metric([model], max(p["mean_acceptance"] for p in plans))
            rounds.add_metric([model], sum(b.stats.rounds for b in batchers))
            scored.add_metric([model], sum(b.stats.scored_rows for b in batchers))
            chunks.add_metric([model], sum(b.stats.prefill_chunks for b in batchers))
        yield from (members, rows, planned, acceptance, rounds, scored, chunks)


class _PrefixCacheCollector(Collector):
    """The decoders' prefix caches (specwise.prefix_cache), per model, read at each scrape."""

    COUNTERS = (("lookups", "Prompts looked up in the prefix cache"),
                ("hits", "Prompts that found a cached prefix"),
                ("hit_tokens", "Prompt tokens whose KV entries came from the prefix cache"),
                ("stored_tokens", "Tokens of blocks stored in the prefix cache"),
                ("evictions", "Prefix cache blocks evicted (least recently used first)"),
                ("evicted_tokens", "Tokens of the prefix cache blocks evicted"))

    def __init__(self, decoders: Mapping[str, Any]) -> None:
        self.decoders = decoders

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        counters = {name: CounterMetricFamily(f"specwise_prefix_cache_{name}", text, labels=["model"])
                    for name, text in self.COUNTERS}
        held = GaugeMetricFamily("specwise_prefix_cache_bytes", "Bytes of KV entries the prefix cache holds",
                                 labels=["model"])
        tokens = GaugeMetricFamily("specwise_prefix_cache_tokens", "Tokens whose KV entries the prefix cache "
                                   "holds", labels=["model"])
        limit = GaugeMetricFamily("specwise_prefix_cache_limit_bytes", "The prefix cache's bound in bytes",
                                  labels=["model"])
        for model, decoder in self.decoders.items():
            cache = getattr(decoder, "prefix_cache", None)
            if cache is None:
                continue
            for name, _ in self.COUNTERS:
                counters[name].add_metric([model], getattr(cache.stats, name))
            held.add_metric([model], cache.bytes)
            tokens.add_metric([model], cache.tokens)
            limit.add_metric([model], cache.max_bytes)
        yield from (*counters.values(), held, tokens, limit)


class _VLLMCollector(Collector):
    """The scheduler's gauges under vLLM's names and label (model_name), for routers made for vLLM."""

    def __init__(self, scheduler: Scheduler, models: list[str]) -> None:
        self.scheduler = scheduler
        self.models = models

    def collect(self) -> Iterator[GaugeMetricFamily]:
        scheduler = self.scheduler
        running = GaugeMetricFamily("vllm:num_requests_running", "Requests being generated now",
                                    labels=["model_name"])
        waiting = GaugeMetricFamily("vllm:num_requests_waiting", "Requests waiting to be admitted",
                                    labels=["model_name"])
        usage = [GaugeMetricFamily(name, "KV cache usage: reserved plus prefix-cached tokens over the KV budget "
                                   "(1 means 100 percent)", labels=["model_name"])
                 for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")]
        budget = scheduler.kv_budget_tokens
        share = (min(1.0, (scheduler.kv_used_tokens + scheduler.kv_cached_tokens) / budget) if budget else 0.0)
        counts = scheduler.counts_by_model()
        for model in self.models:
            now, queued = counts.get(model, (0, 0))
            running.add_metric([model], now)
            waiting.add_metric([model], queued)
            for family in usage:  # one budget for every model the server holds
                family.add_metric([model], share)
        yield from (running, waiting, *usage)

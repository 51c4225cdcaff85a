"""One Prometheus text out of several replicas' `/metrics`: each sample labelled with its replica,
plus a total over the replicas (`replica="all"`).

Counters and histograms add up across replicas, and so do most gauges (requests running and
waiting, KV budgets, bytes held). Gauges that are ratios or means (a KV usage share, the planned
draft length, the estimated acceptance) do not: they get no total, only their per-replica samples.
A dashboard summing over replicas should select `replica!="all"`, or read the total directly.
`_created` samples (when each counter was made) are left out: they neither add up nor matter here.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

REPLICA_LABEL = "replica"
TOTAL = "all"
NOT_ADDITIVE = frozenset({"specwise_batch_planned_k", "specwise_batch_acceptance", "vllm:kv_cache_usage_perc",
                          "vllm:gpu_cache_usage_perc"})


def merge_metrics(texts: Mapping[str, str]) -> str:
    """The replicas' Prometheus texts (by replica id) as one text, labelled and totalled."""
    families: dict[str, tuple[str, str, list[tuple[str, dict[str, str], float]]]] = {}
    for replica, text in texts.items():
        for family in text_string_to_metric_families(text):
            _, _, samples = families.setdefault(family.name, (family.type, family.documentation, []))
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                samples.append((sample.name, {**sample.labels, REPLICA_LABEL: replica}, sample.value))
    lines = []
    for name, (kind, documentation, samples) in families.items():
        exposed = name + "_total" if kind == "counter" else name
        lines.append(f"# HELP {exposed} {_escape_help(documentation)}")
        lines.append(f"# TYPE {exposed} {kind}")
        lines.extend(_line(*sample) for sample in samples)
        if name not in NOT_ADDITIVE and kind in ("counter", "gauge", "histogram", "untyped", "unknown"):
            lines.extend(_line(*sample) for sample in _totals(samples))
    return "\n".join(lines) + "\n"


def _totals(samples: list[tuple[str, dict[str, str], float]]) -> list[tuple[str, dict[str, str], float]]:
    """The samples summed over replicas, one per name and other labels, in the order first seen."""
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for name, labels, value in samples:
        others = tuple((k, v) for k, v in labels.items() if k != REPLICA_LABEL)
        sums[(name, others)] = sums.get((name, others), 0.0) + value
    return [(name, {**dict(others), REPLICA_LABEL: TOTAL}, value) for (name, others), value in sums.items()]


def _line(name: str, labels: dict[str, str], value: float) -> str:
    shown = ",".join(f'{key}="{_escape_label(val)}"' for key, val in labels.items())
    return f"{name}{{{shown}}} {floatToGoString(value)}"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")

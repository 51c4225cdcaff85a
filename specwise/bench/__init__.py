"""specwise bench: Spec-Bench prompts, methods compared head to head, reports, and T(n) costs.

Modules, one job each: `prompts` (questions, tasks, turns), `methods` (HF
baselines and specwise configurations behind one interface), `harness`
(warm-up, interleaving, records, greedy identity check), `mismatch` (where two
outputs diverge and whether rounding explains it), `report` and `plots`
(aggregation, summary.md, PNGs), `cost` (T(n) tables), `cli`.
"""

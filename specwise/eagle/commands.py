"""`specwise train-drafter`: record the target's features over a corpus, train a head, save it.

Everything lands in one directory: data/ (recorded shards), checkpoint.pt, run.json
(the head's settings and its target), head.pt (the drafter: `--drafter eagle
--drafter-option head=DIR`), history.json, loss.png and acceptance.png. `--resume`
continues an interrupted or finished run for another `--minutes`.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specwise.eagle.data import corpus_files, draft_vocabulary, iter_chunks, record_corpus
from specwise.eagle.head import EagleHead, HeadConfig, config_for_target
from specwise.eagle.io import default_head_dir, save_head, target_fingerprint
from specwise.eagle.train import Evaluation, History, TrainOptions, plot_history, train_head
from specwise.store.loading import LoadedModel


@dataclass(frozen=True)
class DataOptions:
    corpus: tuple[str, ...] = ()  # files or directories; empty: the Python standard library
    chunk_tokens: int = 256
    max_tokens: int = 200_000
    top_k: int = 64
    heldout_every: int = 20
    data_fraction: float = 0.5  # share of a time budget that recording may use
    draft_vocab: int = 32_000
    intermediate_size: int | None = None
    runner: str = "auto"


@dataclass
class TrainReport:
    head: Path
    plots: list[Path]
    history: History
    final: Evaluation | None


def train_drafter(target: LoadedModel, out: str | Path, data_options: DataOptions, options: TrainOptions,
                  resume: bool = False, progress: bool = True) -> TrainReport:
    """Record features (resumable), choose the draft vocabulary, train, save head and plots."""
    out = Path(out)
    started = time.monotonic()
    if not resume and ((out / "checkpoint.pt").exists() or (out / "data").exists()):
        raise ValueError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    if target.tokenizer is None:
        raise ValueError(f"target {target.name!r} has no tokenizer to read a corpus with")
    out.mkdir(parents=True, exist_ok=True)
    fingerprint = target_fingerprint(target.model)
    run_file = out / "run.json"
    run = json.loads(run_file.read_text()) if run_file.exists() else None
    if run is not None and run["target"]["fingerprint"] != fingerprint:
        raise ValueError(f"{out} trains a head for target {run['target']['name']!r} "
                         f"(weights {run['target']['fingerprint']}), not {target.name!r} (weights {fingerprint})")
    torch.manual_seed(options.seed)
    config = (HeadConfig(**run["config"]) if run else
              config_for_target(target.model, draft_vocab_size=data_options.draft_vocab,
                                intermediate_size=data_options.intermediate_size))
    runner = target.runner(data_options.runner)
    data_deadline = None if options.minutes is None else started + options.minutes * 60 * data_options.data_fraction
    chunks = iter_chunks(target.tokenizer, corpus_files(data_options.corpus), data_options.chunk_tokens, options.seed)
    data = record_corpus(runner, chunks, config.feature_layers, data_options.top_k, out / "data",
                         max_chunks=max(1, data_options.max_tokens // data_options.chunk_tokens),
                         deadline=data_deadline, progress=progress)
    train, heldout = data.split(data_options.heldout_every)
    if len(train) == 0:
        train, heldout = data, data.select(torch.arange(0))
    if run is None:
        vocab = draft_vocabulary(train, config.target_vocab_size, config.draft_vocab_size)
        run = {"target": {"name": target.name, "fingerprint": fingerprint}, "config": config.to_dict(),
               "draft_to_target": vocab.tolist(), "data": asdict(data_options)}
        run_file.write_text(json.dumps(run))
    head = EagleHead(config, torch.tensor(run["draft_to_target"]))
    head.init_from_target(target.model.get_output_embeddings().weight)
    if options.minutes is not None:  # training gets what recording left of the budget
        left = options.minutes - (time.monotonic() - started) / 60
        options = TrainOptions(**{**asdict(options), "minutes": max(left, 0.0)})
    embeddings = target.model.get_input_embeddings().weight
    history = train_head(head, train, heldout if len(heldout) else None, embeddings, options,
                         checkpoint=out / "checkpoint.pt", resume=resume, progress=progress)
    final = None
    if history.eval_steps:
        final = Evaluation(history.eval_losses[-1], history.eval_acceptance[-1])
    path = save_head(out, head, target.name, fingerprint,
                     {"steps": history.steps[-1] if history.steps else 0, "seconds": history.seconds,
                      "heldout_acceptance": final.acceptance if final else None,
                      "train_chunks": len(train), "heldout_chunks": len(heldout)})
    (out / "history.json").write_text(json.dumps(asdict(history)))
    plots = []
    try:
        plots = plot_history(history, out)
    except ImportError:  # matplotlib is an optional extra
        pass
    return TrainReport(path, plots, history, final)


def add_train_drafter_parser(sub) -> None:
    from specwise.store.catalog import DEFAULT_TARGET

    parser = sub.add_parser("train-drafter", help="train an EAGLE-style draft head for a target",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--target", default=DEFAULT_TARGET,
                        help="the model: registry name, HF model directory or .gguf file")
    parser.add_argument("--corpus", nargs="+", default=[], metavar="PATH",
                        help="text files or directories (default: this Python's standard library sources)")
    parser.add_argument("--out", default=None,
                        help="directory for data, checkpoints, plots and head.pt (default: "
                             "$SPECWISE_HOME/heads/<target>/, where `--drafter eagle` finds it without head=)")
    parser.add_argument("--minutes", type=float, default=None, help="time budget for recording and training")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many training steps")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out")
    parser.add_argument("--chunk-tokens", type=int, default=256, help="tokens per teacher-forced prefill")
    parser.add_argument("--max-tokens", type=int, default=200_000, help="most corpus tokens to record")
    parser.add_argument("--top-k", type=int, default=64, help="target probabilities kept per token")
    parser.add_argument("--draft-vocab", type=int, default=32_000, help="draft vocabulary size (most frequent tokens)")
    parser.add_argument("--intermediate-size", type=int, default=None, help="head MLP width (default: the target's)")
    parser.add_argument("--ttt-steps", type=int, default=3, help="draft steps unrolled in training")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", help="target dtype; bfloat16 also autocasts training")
    parser.add_argument("--train-dtype", default="auto", choices=["auto", "float32", "bfloat16"],
                        help="matmul precision of training (weights stay float32); auto: bfloat16 only for a "
                             "bfloat16 target on a CPU with native bfloat16 (AVX-512 BF16, AMX) or a GPU")
    parser.add_argument("--runner", default="auto", choices=["auto", "hf", "lean"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(func=cmd_train_drafter)


def _train_bf16(choice: str, target: LoadedModel) -> bool:
    from specwise.eagle.train import native_bf16

    if choice != "auto":
        return choice == "bfloat16"
    on_gpu = next(target.model.parameters()).device.type != "cpu"
    return target.dtype == torch.bfloat16 and (on_gpu or native_bf16())


def cmd_train_drafter(args: argparse.Namespace) -> int:
    from specwise.cli_options import apply_threads
    from specwise.store.loading import load_model

    if args.minutes is None and args.max_steps is None:
        raise ValueError("give --minutes (a time budget) or --max-steps")
    apply_threads(args.threads)
    target = load_model(args.target, args.dtype)
    out = args.out or default_head_dir(target.name)
    data = DataOptions(corpus=tuple(args.corpus), chunk_tokens=args.chunk_tokens, max_tokens=args.max_tokens,
                       top_k=args.top_k, draft_vocab=args.draft_vocab, intermediate_size=args.intermediate_size,
                       runner=args.runner)
    options = TrainOptions(minutes=args.minutes, max_steps=args.max_steps, batch_size=args.batch_size, lr=args.lr,
                           ttt_steps=args.ttt_steps, seed=args.seed, bf16=_train_bf16(args.train_dtype, target))
    report = train_drafter(target, out, data, options, resume=args.resume, progress=not args.no_progress)
    print(f"head: {report.head}")
    for plot in report.plots:
        print(f"plot: {plot}")
    if report.final:
        per_position = ", ".join(f"{a:.2f}" for a in report.final.acceptance)
        print(f"held-out top-1 agreement per draft position: {per_position}; "
              f"estimated acceptance length {report.final.acceptance_length:.2f}")
    where = "" if args.out is None else f" --drafter-option head={args.out}"
    print(f"use it: specwise generate --target {args.target} --drafter eagle{where}")
    return 0

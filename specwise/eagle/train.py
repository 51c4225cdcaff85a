"""Training the head to match the target's next-token distribution (EAGLE-3's objective).

The loss at each position is the cross-entropy from the target's recorded top-k
distribution, restricted to the draft vocabulary, to the head's; it is taken at
every training-time test step (the head consuming its own states for `ttt_steps`
draft positions, see EagleHead.forward_unrolled), step j weighted by
`step_decay ** j`. Held-out acceptance is measured the same way: per draft step,
how often the head's top token equals the target's (a teacher-forced estimate of
greedy acceptance), and from it the expected acceptance length of a chain of
`ttt_steps` drafts.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from specwise.eagle.data import FeatureData
from specwise.eagle.head import EagleHead


@dataclass(frozen=True)
class TrainOptions:
    minutes: float | None = None  # time budget (None: until max_steps)
    max_steps: int | None = None
    batch_size: int = 4
    lr: float = 5e-4
    weight_decay: float = 0.01
    warmup: int = 20
    grad_clip: float = 1.0
    ttt_steps: int = 3
    step_decay: float = 0.8
    eval_every: int = 50
    eval_chunks: int = 16  # held-out chunks per evaluation (the first ones: the same every time)
    checkpoint_every: int = 100
    seed: int = 0
    bf16: bool = False  # autocast matmuls to bfloat16 (weights and optimizer stay float32)

    def __post_init__(self) -> None:
        if self.minutes is None and self.max_steps is None:
            raise ValueError("give a time budget (minutes) or max_steps")
        if self.ttt_steps < 1:
            raise ValueError(f"ttt_steps must be >= 1; got {self.ttt_steps}")


@dataclass
class Evaluation:
    loss: float
    acceptance: list[float]  # per draft step: head's top token == target's top token

    @property
    def acceptance_length(self) -> float:
        """Expected tokens per step of a chain of len(acceptance) drafts, if positions were independent."""
        return 1.0 + sum(math.prod(self.acceptance[:j + 1]) for j in range(len(self.acceptance)))


@dataclass
class History:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_losses: list[float] = field(default_factory=list)
    eval_acceptance: list[list[float]] = field(default_factory=list)
    eval_tau: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def add_eval(self, step: int, evaluation: Evaluation) -> None:
        self.eval_steps.append(step)
        self.eval_losses.append(evaluation.loss)
        self.eval_acceptance.append(evaluation.acceptance)
        self.eval_tau.append(evaluation.acceptance_length)


def unrolled_loss(head: EagleHead, batch: FeatureData, embeddings: torch.Tensor, target_to_draft: torch.Tensor,
                  steps: int, step_decay: float = 0.8) -> tuple[torch.Tensor, list[float], list[float]]:
    """The loss averaged over `steps` draft steps (step j weighted step_decay ** j), and per step
    its mean loss and top-1 agreement."""
    tokens = batch.tokens
    embeds = embeddings[tokens[:, 1:]]  # [B, T, H]: head position p reads c_{p+1}
    hidden = batch.hidden[:, :-1]  # [B, T, layers, H]: and the target's states after c_p
    top_ids = batch.top_ids[:, 1:].long()  # [B, T, K]: the target's distribution after c_{p+1}
    top_probs = batch.top_probs[:, 1:].float()
    mapped = target_to_draft[top_ids]  # [B, T, K], -1 outside the draft vocabulary
    inside = mapped >= 0
    total = torch.zeros(())
    losses, agreement = [], []
    for step, logits in enumerate(head.forward_unrolled(embeds, hidden, steps)):
        logp = logits.float().log_softmax(dim=-1)[:, step:]  # positions p >= step are real drafts
        gathered = logp.gather(-1, mapped[:, step:].clamp(min=0))
        loss = -(top_probs[:, step:] * gathered * inside[:, step:]).sum(-1).mean()
        total = total + step_decay ** step * loss
        losses.append(float(loss.detach()))
        choice = head.draft_to_target[logits[:, step:].argmax(dim=-1)]
        agreement.append(float((choice == top_ids[:, step:, 0]).float().mean()))
    return total / sum(step_decay ** j for j in range(steps)), losses, agreement


@torch.no_grad()
def evaluate(head: EagleHead, data: FeatureData, embeddings: torch.Tensor, steps: int,
             batch_size: int = 8, bf16: bool = False) -> Evaluation:
    """Loss (the mean over draft steps) and per-step top-1 agreement over all of `data`."""
    was_training = head.training
    head.eval()
    target_to_draft = head.target_to_draft()
    loss_sum, agree_sum, count = 0.0, [0.0] * steps, 0
    for start in range(0, len(data), batch_size):
        batch = data.select(torch.arange(start, min(start + batch_size, len(data))))
        with _autocast(bf16):
            _, losses, agreement = unrolled_loss(head, batch, embeddings, target_to_draft, steps)
        weight = len(batch)
        loss_sum += sum(losses) / len(losses) * weight
        agree_sum = [a + b * weight for a, b in zip(agree_sum, agreement)]
        count += weight
    head.train(was_training)
    return Evaluation(loss_sum / max(count, 1), [a / max(count, 1) for a in agree_sum])


def native_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX-512 BF16 or AMX). Without it PyTorch's
    bfloat16 matmuls on many rows are several times slower than float32 ones (docs/BENCHMARKS.md:
    700 x 1536 x 8960 takes 1.27 s in bfloat16, 0.25 s in float32 on our AVX2 machine)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as handle:
            flags = next((line for line in handle if line.startswith("flags")), "")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else nullcontext()


def train_head(head: EagleHead, train: FeatureData, heldout: FeatureData | None, embeddings: torch.Tensor,
               options: TrainOptions, checkpoint: Path | None = None, resume: bool = False,
               progress: bool = True) -> History:
    """Train in place with AdamW; checkpoints (head, optimizer, history, step) let a run resume."""
    from tqdm.auto import tqdm

    embeddings = embeddings.detach()  # rows are cast to the head's dtype per batch, never the whole table
    head.float().train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=options.lr, weight_decay=options.weight_decay)
    history, step = History(), 0
    generator = torch.Generator().manual_seed(options.seed)
    if resume and checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location="cpu", weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        history = History(**state["history"])
        step = state["step"]
        generator.set_state(state["generator"])
    target_to_draft = head.target_to_draft()
    deadline = None if options.minutes is None else time.monotonic() + options.minutes * 60
    started = time.monotonic() - history.seconds
    stop_step = None if options.max_steps is None else step + options.max_steps

    def save() -> None:
        if checkpoint is None:
            return
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        history.seconds = time.monotonic() - started
        tmp = checkpoint.with_name(checkpoint.name + ".tmp")
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "history": asdict(history),
                    "step": step, "generator": generator.get_state()}, tmp)
        tmp.replace(checkpoint)

    if heldout is not None:
        heldout = heldout.select(torch.arange(min(len(heldout), options.eval_chunks)))
    if heldout is not None and len(heldout) and not history.eval_steps:
        history.add_eval(step, evaluate(head, heldout, embeddings, options.ttt_steps, bf16=options.bf16))
    bar = tqdm(total=options.max_steps, desc="training eagle head", unit="step", disable=not progress)
    while (stop_step is None or step < stop_step) and (deadline is None or time.monotonic() < deadline):
        rows = torch.randint(0, len(train), (options.batch_size,), generator=generator)
        for group in optimizer.param_groups:
            group["lr"] = options.lr * min(1.0, (step + 1) / max(options.warmup, 1))
        with _autocast(options.bf16):
            loss, losses, agreement = unrolled_loss(head, train.select(rows), embeddings, target_to_draft,
                                                    options.ttt_steps, options.step_decay)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), options.grad_clip)
        optimizer.step()
        step += 1
        history.steps.append(step)
        history.losses.append(float(loss.detach()))
        bar.update(1)
        bar.set_postfix(loss=f"{history.losses[-1]:.3f}", top1=f"{agreement[0]:.2f}")
        if heldout is not None and len(heldout) and step % options.eval_every == 0:
            history.add_eval(step, evaluate(head, heldout, embeddings, options.ttt_steps, bf16=options.bf16))
        if step % options.checkpoint_every == 0:
            save()
    bar.close()
    if heldout is not None and len(heldout) and (not history.eval_steps or history.eval_steps[-1] != step):
        history.add_eval(step, evaluate(head, heldout, embeddings, options.ttt_steps, bf16=options.bf16))
    save()
    head.eval()
    return history


def plot_history(history: History, directory: Path) -> list[Path]:
    """loss.png (training and held-out loss) and acceptance.png (held-out acceptance per draft step
    and the estimated acceptance length) under `directory`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(history.steps, history.losses, lw=0.8, alpha=0.6, label="training (over draft steps)")
    if history.eval_steps:
        ax.plot(history.eval_steps, history.eval_losses, "o-", label="held-out (mean over draft steps)")
    ax.set(xlabel="step", ylabel="cross-entropy to the target", title="EAGLE head: loss")
    ax.legend()
    fig.tight_layout()
    paths.append(directory / "loss.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    if history.eval_steps:
        for j in range(len(history.eval_acceptance[0])):
            ax.plot(history.eval_steps, [a[j] for a in history.eval_acceptance], "o-", label=f"draft position {j + 1}")
        twin = ax.twinx()
        twin.plot(history.eval_steps, history.eval_tau, "k--", label="estimated τ")
        twin.set_ylabel("estimated acceptance length τ")
        twin.legend(loc="lower right")
    ax.set(xlabel="step", ylabel="held-out top-1 agreement", ylim=(0, 1), title="EAGLE head: held-out acceptance")
    if history.eval_steps:
        ax.legend(loc="upper left")
    fig.tight_layout()
    paths.append(directory / "acceptance.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths

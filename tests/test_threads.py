"""The thread governor (specwise/threads.py): fewer threads while other programs hold cores, never another token.

- the rule, on measurements given to it (fake clocks and idle counts): an idle machine keeps the user's
  thread count; threads that ran a low share of their time drop to the cores they got; spare cores bring
  them back after two calm windows, or, without an idle count, a retry now and then; a thread count the
  user sets is the new ceiling; `fixed_threads` and SPECWISE_FIXED_THREADS turn it off;
- in a real pass: the native pass and the batched pass run with the governor's count, torch's count is
  the user's again afterwards, and logits are bitwise the same at one thread and two.
"""

from __future__ import annotations

import pytest
import torch

from specwise import threads as governor_module
from specwise.runners.lean import LeanRunner
from specwise.runners.ragged import Block, score_together
from specwise.testing import tiny_gguf_loaded
from specwise.threads import CALM_WINDOWS, LOW_SHARE, RETRY_WINDOWS, WINDOW_S, ThreadGovernor, fixed_threads


class Machine:
    """Clocks and /proc/stat counts a test moves by hand: passes of `pass_s` seconds each."""

    def __init__(self, cores: int = 2) -> None:
        self.wall = self.cpu = 0.0
        self.idle = self.total = 0.0
        self.cores = cores
        self.has_stat = True

    def governor(self) -> ThreadGovernor:
        return ThreadGovernor(clock=lambda: self.wall, cpu_clock=lambda: self.cpu,
                              idle_ticks=lambda: (self.idle, self.total) if self.has_stat else None, cores=self.cores)

    def run(self, governor: ThreadGovernor, share: float, spare_cores: float = 0.0, pass_s: float = 0.05) -> int:
        """One pass whose threads ran `share` of their time, with `spare_cores` idle meanwhile; its thread count."""
        with governor.pass_scope() as threads:
            assert torch.get_num_threads() == threads
            self.wall += pass_s
            self.cpu += pass_s * threads * share
            self.idle += pass_s * spare_cores * 100
            self.total += pass_s * self.cores * 100
        return threads

    def window(self, governor: ThreadGovernor, share: float, spare_cores: float = 0.0) -> list[int]:
        """Passes enough to close one measurement window; their thread counts."""
        return [self.run(governor, share, spare_cores) for _ in range(int(WINDOW_S / 0.05) + 1)]


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_an_idle_machine_keeps_the_users_thread_count(two_threads):
    machine = Machine()
    governor = machine.governor()
    for _ in range(20):
        assert set(machine.window(governor, share=0.97)) == {2}
    assert governor.decisions == []
    assert torch.get_num_threads() == 2


def test_descheduled_threads_drop_to_the_cores_they_got_and_the_users_count_comes_back_after(two_threads):
    machine = Machine()
    governor = machine.governor()
    machine.window(governor, share=0.62)  # one core of two taken by another program
    assert machine.run(governor, share=1.0) == 1
    assert torch.get_num_threads() == 2  # outside a pass, the user's count
    assert governor.decisions == [(2, 1, 0.62)]
    # Just above the threshold is not a drop.
    fresh = machine.governor()
    machine.window(fresh, share=LOW_SHARE + 0.01)
    assert machine.run(fresh, share=1.0) == 2


def test_spare_cores_bring_the_threads_back_after_calm_windows(two_threads):
    machine = Machine()
    governor = machine.governor()
    machine.window(governor, share=0.6)
    for _ in range(10):  # the other program still runs: no spare core
        assert set(machine.window(governor, share=1.0, spare_cores=0.1)) == {1}
    for _ in range(CALM_WINDOWS - 1):
        assert set(machine.window(governor, share=1.0, spare_cores=0.98)) == {1}
    machine.window(governor, share=1.0, spare_cores=0.98)  # the last calm window
    assert machine.run(governor, share=1.0) == 2
    assert governor.decisions[-1][:2] == (1, 2)
    # A busy window between calm ones starts the count again.
    machine.window(governor, share=0.6)
    machine.window(governor, share=1.0, spare_cores=0.98)
    machine.window(governor, share=1.0, spare_cores=0.2)
    machine.window(governor, share=1.0, spare_cores=0.98)
    assert machine.run(governor, share=1.0) == 1


def test_without_an_idle_count_it_tries_the_users_count_again_now_and_then(two_threads):
    machine = Machine()
    machine.has_stat = False
    governor = machine.governor()
    machine.window(governor, share=0.6)
    for _ in range(RETRY_WINDOWS - 1):
        assert set(machine.window(governor, share=1.0)) == {1}
    machine.window(governor, share=1.0)
    assert machine.run(governor, share=1.0) == 2
    machine.window(governor, share=0.6)  # still busy: down again
    assert machine.run(governor, share=1.0) == 1


def test_a_thread_count_the_user_sets_is_the_new_ceiling(two_threads):
    machine = Machine(cores=4)
    governor = machine.governor()
    machine.window(governor, share=0.6)
    assert machine.run(governor, share=1.0) == 1
    torch.set_num_threads(3)
    assert machine.run(governor, share=1.0) == 3
    assert torch.get_num_threads() == 3
    machine.window(governor, share=0.7)  # 2.1 cores' worth of three threads
    assert machine.run(governor, share=1.0) == 2


def test_one_thread_is_never_governed_and_fixed_threads_turns_it_off(two_threads, monkeypatch):
    machine = Machine()
    torch.set_num_threads(1)
    governor = machine.governor()
    machine.window(governor, share=0.3)
    assert machine.run(governor, share=0.3) == 1 and governor.decisions == []
    torch.set_num_threads(2)
    monkeypatch.setattr(governor_module, "GOVERNOR", governor)
    with fixed_threads():
        machine.window(governor, share=0.5)
        assert machine.run(governor, share=0.5) == 2
    assert governor.decisions == []
    monkeypatch.setenv("SPECWISE_FIXED_THREADS", "1")
    off = machine.governor()
    machine.window(off, share=0.5)
    assert machine.run(off, share=0.5) == 2 and off.decisions == []


def test_the_idle_count_reads_this_machines_cpus():
    ticks = governor_module.cpu_idle_ticks()
    if ticks is None:
        pytest.skip("no /proc/stat here")
    idle, total = ticks
    assert 0 <= idle <= total


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_gguf_loaded(tmp_path_factory.mktemp("target"), seed=0)


def test_passes_run_with_the_governors_count_and_give_the_same_logits_at_one_thread_and_two(
        target, two_threads, monkeypatch):
    governor = ThreadGovernor()
    monkeypatch.setattr(governor_module, "GOVERNOR", governor)
    seen: list[int] = []
    runners = {}
    for name in ("two", "one", "batched", "batched-other"):
        runner = runners[name] = LeanRunner(target.model)
        run, ragged = runner.decoder_pass.run, runner.decoder_pass.run_ragged
        runner.decoder_pass.run = lambda *a, _run=run, **k: (seen.append(torch.get_num_threads()), _run(*a, **k))[1]
        runner.decoder_pass.run_ragged = (
            lambda *a, _run=ragged, **k: (seen.append(torch.get_num_threads()), _run(*a, **k))[1])
    prompt, block = [7, 8, 9, 10, 11], [5, 9, 14, 5, 9]
    logits = {}
    for name, count in (("two", 2), ("one", 1)):
        governor.threads()  # the ceiling read (2); then, as after a busy window, `count` threads
        governor.current = count
        seen.clear()
        runners[name].forward(prompt, logits=False)
        logits[name] = runners[name].forward(block)
        assert seen == [count, count] and torch.get_num_threads() == 2
    assert torch.equal(logits["one"], logits["two"])
    governor.current = 1
    seen.clear()
    for name in ("batched", "batched-other"):
        runners[name].forward(prompt, logits=False)
    together = score_together([runners["batched"], runners["batched-other"]], [Block(block), Block(block[:3])])
    assert seen[-1] == 1 and torch.get_num_threads() == 2
    assert torch.equal(together[0], logits["two"])

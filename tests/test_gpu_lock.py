"""One GPU per process: concurrent processes never share a GPU, a killed holder frees its GPU,
torchrun's ranks are left alone, CUDA_VISIBLE_DEVICES is respected. No GPU needed: the number of
GPUs and the lock folder are injected ($ABLATION_LAB_GPU_COUNT, $ABLATION_LAB_GPU_LOCKS)."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
import torch

from pipeline.training import gpu_lock
from pipeline.training.device import Cluster, resolve_device
from pipeline.training.gpu_lock import claim_gpu, visible_gpus

# fork: the children start in milliseconds (a fresh interpreter importing torch takes seconds on a
# busy 2-core machine) and use nothing of torch.
FORK = mp.get_context("fork")


@pytest.fixture(autouse=True)
def fake_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "4")
    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    yield tmp_path / "locks"
    gpu_lock.release()


def _hold(barrier, results, waiting, others: int) -> None:
    """Claim a GPU; a process that took one at once holds it until `others` processes have said
    they wait (events, not a hold long enough for a loaded machine to start them all in)."""
    barrier.wait()
    lines = []

    def log(line: str) -> None:
        if not lines and "are taken" in line:  # this process's first pass found every GPU taken
            with waiting.get_lock():
                waiting.value += 1
        lines.append(line)

    claim = claim_gpu(poll_s=0.02, log=log)
    acquired = time.time()
    deadline = time.monotonic() + 60
    while waiting.value < others and time.monotonic() < deadline:
        time.sleep(0.02)
    results.put({"id": claim.id, "index": claim.index, "acquired": acquired, "released": time.time(),
                 "waited_s": claim.waited_s, "log": lines})
    # exits holding the lock: the kernel releases it, after the `released` stamp


@pytest.mark.multiprocess
def test_eight_processes_on_four_gpus_never_share_one_and_the_extra_four_wait(fake_gpus):
    barrier, results, waiting = FORK.Barrier(8), FORK.Queue(), FORK.Value("i", 0)
    procs = [FORK.Process(target=_hold, args=(barrier, results, waiting, 4)) for _ in range(8)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    by_gpu = {}
    for r in got:
        by_gpu.setdefault(r["id"], []).append((r["acquired"], r["released"]))
        assert r["index"] == int(r["id"])  # no mask: cuda:i is GPU i
    # Every GPU used, eight claims in all; not two each: a waiter that gets a GPU releases it at once,
    # so under load one GPU can serve three waiters while another serves one (seen in CI).
    assert sorted(by_gpu) == ["0", "1", "2", "3"] and sum(len(v) for v in by_gpu.values()) == 8
    for spans in by_gpu.values():
        spans = sorted(spans)
        assert all(r0 <= a1 for (_, r0), (a1, _) in zip(spans, spans[1:])), "two processes held one GPU at once"
    waited = [r for r in got if r["log"][0].startswith("gpu: all 4 visible GPUs are taken")]
    assert waiting.value == len(waited) == 4  # the four that found every GPU taken
    for r in waited:
        assert "waiting" in r["log"][0] and r["waited_s"] > 0
        assert "waited" in r["log"][-1]
    assert {p.name for p in fake_gpus.iterdir()} == {f"gpu-{i}.lock" for i in range(4)}


def _claim_and_sleep(ready) -> None:
    claim_gpu(poll_s=0.02, log=lambda _: None)
    ready.set()
    time.sleep(60)


def _claim_and_report(results, forget_parents_claim: bool = False) -> None:
    if forget_parents_claim:
        gpu_lock._held.clear()  # a fork copies the parent's claim; this child is another process
    lines = []
    claim = claim_gpu(poll_s=0.02, log=lines.append)
    results.put({"id": claim.id, "acquired": time.time(), "log": lines})


@pytest.mark.multiprocess
@pytest.mark.kill
def test_a_sigkilled_holder_frees_its_gpu(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "1")
    ready, results = FORK.Event(), FORK.Queue()
    holder = FORK.Process(target=_claim_and_sleep, args=(ready,))
    holder.start()
    assert ready.wait(10)
    waiter = FORK.Process(target=_claim_and_report, args=(results,))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # waiting: the only GPU is held
    os.kill(holder.pid, signal.SIGKILL)
    killed = time.time()
    got = results.get(timeout=10)  # no cleanup ran in the killed process: the kernel dropped its lock
    waiter.join(timeout=10)
    holder.join(timeout=10)
    assert got["id"] == "0" and got["acquired"] >= killed
    assert f"pid {holder.pid}" in got["log"][0]  # the waiting message names the holder


def test_torchrun_ranks_take_local_rank_and_no_lock(fake_gpus, monkeypatch, pretend_cuda):
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "1")  # torchrun --nproc_per_node 1 sets both too
    assert resolve_device("auto") == torch.device("cuda", 3)
    assert gpu_lock.claimed().lock is None and "LOCAL_RANK" in gpu_lock.claimed().why
    assert resolve_device("cuda", Cluster(rank=1, world=2, local_rank=1)) == torch.device("cuda", 1)
    assert not fake_gpus.exists()  # no lock folder, no lock file


@pytest.mark.multiprocess
def test_resolve_device_takes_the_first_free_gpu(fake_gpus, pretend_cuda):
    ready = FORK.Event()
    holder = FORK.Process(target=_claim_and_sleep, args=(ready,))
    holder.start()
    try:
        assert ready.wait(10)
        assert resolve_device("auto") == torch.device("cuda", 1)  # GPU 0 is the holder's
        assert resolve_device("auto") == torch.device("cuda", 1)  # one claim per process
        claim = gpu_lock.claimed()
        assert claim.id == "1" and claim.lock == str(fake_gpus / "gpu-1.lock") and "first free of 4" in claim.why
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=10)


@pytest.mark.multiprocess
def test_cuda_visible_devices_are_the_candidates(fake_gpus, monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,5")
    assert visible_gpus() == ["2", "5"]
    first = claim_gpu(log=lambda _: None)
    assert (first.index, first.id) == (0, "2") and "CUDA_VISIBLE_DEVICES=2,5" in first.why
    results = FORK.Queue()
    child = FORK.Process(target=_claim_and_report, args=(results, True))
    child.start()
    assert results.get(timeout=10)["id"] == "5"  # the other visible one, as cuda:1
    child.join(timeout=10)
    assert {p.name for p in fake_gpus.iterdir()} == {"gpu-2.lock", "gpu-5.lock"}


@pytest.mark.parametrize(("mask", "expected"), [(None, ["0", "1", "2", "3"]), ("", []), ("3,1", ["3", "1"]),
                                                ("1,9,2", ["1"]), ("GPU-abc", [])])
def test_the_mask_is_read_as_cuda_reads_it(monkeypatch, mask, expected):
    env = {"ABLATION_LAB_GPU_COUNT": "4", **({"CUDA_VISIBLE_DEVICES": mask} if mask is not None else {})}
    assert visible_gpus(env) == expected  # CUDA stops at the first entry that names no GPU


def test_no_visible_gpu_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"^train.device: a GPU was requested but none is visible"):
        claim_gpu()


@pytest.fixture
def pretend_cuda(monkeypatch):
    """resolve_device on a machine with CUDA, as far as the choice of device goes."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32  # set by resolve_device
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


# Several small runs per GPU: k slot locks per GPU (train.runs_per_gpu).

def _hold_slot(barrier, results, hold_s: float, slots: int) -> None:
    barrier.wait()
    claim = claim_gpu(poll_s=0.02, log=lambda _: None, slots=slots)
    acquired = time.time()
    time.sleep(hold_s)
    results.put({"id": claim.id, "slot": claim.slot, "slots": claim.slots, "acquired": acquired,
                 "released": time.time()})


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in spans] + [(r, -1) for _, r in spans])  # a release sorts first at a tie
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


@pytest.mark.multiprocess
def test_k_slots_per_gpu_admit_at_most_k_runs_on_each_and_spread_first(fake_gpus, monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "2")
    n, k, hold_s = 9, 3, 1.0
    barrier, results = FORK.Barrier(n), FORK.Queue()
    procs = [FORK.Process(target=_hold_slot, args=(barrier, results, hold_s, k)) for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    by_gpu: dict[str, list] = {}
    for r in got:
        by_gpu.setdefault(r["id"], []).append(r)
        assert r["slots"] == k and 0 <= r["slot"] < k
    assert sorted(by_gpu) == ["0", "1"]
    for runs in by_gpu.values():
        assert _most_at_once([(r["acquired"], r["released"]) for r in runs]) <= k
    first = sorted(got, key=lambda r: r["acquired"])[:2 * k]  # the six that found a free slot at once
    assert sorted(r["id"] for r in first) == ["0"] * k + ["1"] * k
    names = {p.name for p in fake_gpus.iterdir()}
    assert names == {"gpu-0.lock", "gpu-1.lock", "gpu-0.1.lock", "gpu-1.1.lock", "gpu-0.2.lock", "gpu-1.2.lock"}


def _claim_slots_and_sleep(ready, slots: int) -> None:
    claim_gpu(poll_s=0.02, log=lambda _: None, slots=slots)
    ready.set()
    time.sleep(60)


def _claim_slots_and_report(results, slots: int) -> None:
    claim = claim_gpu(poll_s=0.02, log=lambda _: None, slots=slots)
    results.put({"slot": claim.slot, "acquired": time.time()})


@pytest.mark.multiprocess
@pytest.mark.kill
def test_a_sigkilled_holder_frees_its_slot(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "1")
    holders = []
    for _ in range(2):
        ready = FORK.Event()
        holders.append(FORK.Process(target=_claim_slots_and_sleep, args=(ready, 2)))
        holders[-1].start()
        assert ready.wait(10)
    results = FORK.Queue()
    waiter = FORK.Process(target=_claim_slots_and_report, args=(results, 2))
    waiter.start()
    time.sleep(0.3)
    assert waiter.is_alive()  # both slots of the only GPU are held
    os.kill(holders[1].pid, signal.SIGKILL)
    killed = time.time()
    got = results.get(timeout=10)
    assert got["slot"] == 1 and got["acquired"] >= killed  # the killed holder's slot
    os.kill(holders[0].pid, signal.SIGKILL)
    for p in (*holders, waiter):
        p.join(timeout=10)


@pytest.mark.multiprocess
def test_one_slot_and_k_slots_exclude_each_other_on_slot_zero(monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_COUNT", "1")
    ready = FORK.Event()
    holder = FORK.Process(target=_claim_slots_and_sleep, args=(ready, 4))
    holder.start()
    try:
        assert ready.wait(10)
        claim = claim_gpu(poll_s=0.02, log=lambda _: None, slots=2)  # slot 0 is the holder's
        assert (claim.slot, claim.slots) == (1, 2) and "slot 1" in claim.why
        assert claim.record()["slot"] == 1 and claim.record()["slots"] == 2  # what train.json / eval.json keep
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(timeout=10)


def test_torchrun_takes_no_slot_whatever_runs_per_gpu_says(fake_gpus, monkeypatch, pretend_cuda):
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    asked = []
    assert resolve_device("cuda", slots=lambda gpus: asked.append(gpus) or (4, "")) == torch.device("cuda", 1)
    assert gpu_lock.claimed().lock is None and gpu_lock.claimed().slots == 1
    assert not asked and not fake_gpus.exists()  # not even asked how many


GiB = 2**30


@pytest.mark.parametrize(("run_bytes", "gpu_bytes", "cores", "gpus", "k"), [
    (31e6, 141 * GiB, 16, 1, 16),  # a 0.8M-parameter model on an H200: the cores decide
    (31e6, 141 * GiB, 64, 1, 16),  # ... and with more cores, the cap
    (31e6, 141 * GiB, 16, 8, 2),  # eight GPUs share 16 cores
    (8 * GiB, 80 * GiB, 32, 1, 8),  # 0.9 x 80 / (8 + 1)
    (30 * GiB, 24 * GiB, 8, 1, 1),  # too big for one: still one (its own OOM says why)
])
def test_auto_runs_per_gpu_from_memory_cores_and_the_cap(run_bytes, gpu_bytes, cores, gpus, k):
    got, why = gpu_lock.runs_per_gpu("auto", run_bytes, gpu_bytes, cores, gpus)
    assert got == k and why.startswith(f"{k} (train.runs_per_gpu auto")
    assert gpu_lock.runs_per_gpu(3, run_bytes, gpu_bytes, cores, gpus) == (3, "3 (train.runs_per_gpu)")


def test_auto_slots_use_the_run_estimate_and_the_gpu_memory(fake_gpus, monkeypatch):
    monkeypatch.setenv("ABLATION_LAB_GPU_MEMORY", str(12 * GiB))
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(64)), raising=False)
    run = gpu_lock.estimated_run_bytes(124_000_000, 768, 3072, 12, 50304, 12 * 1024)  # GPT-2 small, 12 x 1024
    assert 4 * GiB < run < 16 * GiB
    claim = claim_gpu(log=lambda _: None, slots=gpu_lock.gpu_slots("auto", 2 * GiB))
    assert claim.slots == int(0.9 * 12 // 3) and "by memory" in claim.why
    assert gpu_lock.gpu_slots(5, run) == 5

"""Run tasks (dag.Task) as `dvc repro --single-item` processes, up to `jobs` at once, each as soon as
the stages it needs are done.

DVC lets go of its repository lock while a stage's command runs, so each process waits for it
(`--wait-for-lock`); one that still fails on a lock (DVC's rwlock file has its own 3 s lock; DVC
issues 9805, 10465) is started again after a short random wait, up to MAX_ATTEMPTS times, and DVC
reruns what it did not record. Any other failure is the stage's own: the stages after it are
skipped, the independent ones go on.
"""
from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.grid import signals
from pipeline.grid.dag import Task
from pipeline.grid.eta import eta, kind, steady
from pipeline.grid.lifeline import end_groups
from pipeline.io.progress import clock
from pipeline.warm.auto import SETTING as AUTO_WARM

MAX_ATTEMPTS = 8
LOCK_ERRORS = ("Unable to acquire lock", "is busy, it is being blocked by")
RUNNING = re.compile(r"^Running stage '([^']+)'")
FAILED = re.compile(r"failed to reproduce '([^']+)'")
DVC = [sys.executable, "-m", "dvc", "--wait-for-lock"]  # this interpreter's DVC, whatever PATH says


@dataclass
class Process:
    task: Task
    proc: subprocess.Popen
    log: Path
    started: float
    reader: threading.Thread
    lines: list[str] = field(default_factory=list)  # this attempt's output
    marks: list[tuple[float, str]] = field(default_factory=list)  # (time, stage) of "Running stage"


@dataclass
class Outcome:
    done: set[str] = field(default_factory=set)
    failed: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # stage -> (log, last lines)
    skipped: list[str] = field(default_factory=list)
    spans: dict[str, list[float]] = field(default_factory=dict)  # stage -> [start, end] since launch
    retries: int = 0


def _read(p: Process, echo: bool) -> None:
    with open(p.log, "a", encoding="utf-8") as log:
        for line in p.proc.stdout:
            log.write(line)
            log.flush()
            if echo:  # the serial run, timed: its output as `dvc repro` shows it
                sys.stdout.write(line)
                sys.stdout.flush()
            p.lines.append(line.rstrip("\n"))
            m = RUNNING.match(line)
            if m:
                p.marks.append((time.monotonic(), m.group(1)))


class Launcher:
    def __init__(self, jobs: int, log_dir: Path, cores: int, threads_env: str | None, say=None, lifeline=None,
                 prior: dict[tuple[str, ...], float] | None = None):
        self.jobs, self.log_dir, self.cores, self.threads_env = jobs, log_dir, cores, threads_env
        self.prior = prior or {}  # each kind's seconds in the last study, for the ETA (eta.read_prior)
        self.timed: dict[tuple[str, ...], list[float]] = {}  # seconds of the tasks DVC ran, by kind
        self.shown_end: float | None = None  # the end the last ETA printed (eta.steady)
        self.stage_s: dict[str, list[float]] = {}  # this call's ended stages' seconds by family (eta.from_stages)
        self.say = say or (lambda msg: print(msg, flush=True))
        self.lifeline = lifeline  # lifeline.Lifeline: told each process group, so a killed launcher's end them
        self.t0 = time.monotonic()
        self.out = Outcome()
        self.running: list[Process] = []

    def signal_all(self, signum: int) -> None:
        """Pass a signal to every process running (Ctrl-Z, fg): each is a session of its own."""
        for p in self.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.proc.pid, signum)

    def stop(self, signum: int = signal.SIGTERM, grace_s: float = 3.0) -> None:
        """End the processes still running (Ctrl-C, SIGTERM, SIGHUP, an error here): `signum` to
        each one's group (SIGINT as a terminal's Ctrl-C would send it), SIGKILL after `grace_s`."""
        end_groups({p.proc.pid for p in self.running}, grace_s, signals.children_signal(signum),
                   reap=lambda: [p.proc.poll() for p in self.running])
        for p in self.running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(timeout=1)
            self._ended(p)
        self.running.clear()

    def _ended(self, p: Process) -> None:
        if self.lifeline is not None:
            self.lifeline.ended(p.proc.pid)

    def start(self, task: Task, command: list[str], threads: int | None, echo: bool = False,
              direct: bool = False) -> Process:
        task.attempts += 1
        log = self.log_dir / (task.stages[0].replace("/", "_") + ".log")
        env = dict(os.environ)
        env[AUTO_WARM] = "0"  # the launcher decides warm or cold, not each stage (pipeline/warm/auto.py)
        if threads and self.threads_env and self.threads_env not in os.environ:
            env[self.threads_env] = str(threads)
        if not direct:  # a direct run's output is the terminal's, not a log's
            with open(log, "w" if task.attempts == 1 else "a", encoding="utf-8") as f:
                f.write(f"$ {' '.join(command)}  # attempt {task.attempts}\n")
        # A session of its own: a Ctrl-C here reaches the launcher, which ends the stages (stop).
        out = {} if direct else {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "bufsize": 1}
        with signals.held():  # started, named to the lifeline and listed for stop() at once
            proc = subprocess.Popen(command, env=env, start_new_session=True, **out)
            if self.lifeline is not None:
                self.lifeline.group(proc.pid)
            p = Process(task, proc, log, time.monotonic(), threading.Thread(target=lambda: None))
            self.running.append(p)
        if not direct:
            p.reader = threading.Thread(target=_read, args=(p, echo), daemon=True)
        p.reader.start()
        return p

    def _finish_marks(self, p: Process, end: float) -> None:
        """Stages of the task that DVC ran, each from its "Running stage" line to the next one."""
        for (t, name), (t_next, _) in zip(p.marks, p.marks[1:] + [(end, "")]):
            self.out.spans[name] = [round(t - self.t0, 2), round(t_next - self.t0, 2)]

    def run_one(self, task: Task, command: list[str], echo: bool = False) -> bool:
        """Run one task alone (the shared stages; the serial run, its output shown); True if it succeeded."""
        return self.run([task], lambda t: command, echo)

    def run(self, tasks: list[Task], command_of, echo: bool = False) -> bool:
        """Run `tasks` (command_of(task) -> argv), at most self.jobs at once; True if all succeeded."""
        pending, running = list(tasks), self.running
        self.names = {s for t in tasks for s in t.stages}
        self.shown_end, self.stage_s = None, {}  # these tasks' end and stages, not the last call's
        total = len(self.names)
        bad: set[str] = set()
        while pending or running:
            for task in [t for t in pending if t.needs & bad]:
                pending.remove(task)
                bad |= set(task.stages)
                self.out.skipped += task.stages
            now = time.monotonic()
            ready = [t for t in pending if t.needs <= self.out.done and t.not_before <= now]
            # What follows a finished stage (a knock-out after its seed's baseline) before a new run:
            # it would otherwise wait in dvc.yaml's order behind every train and lengthen the tail.
            ready.sort(key=lambda t: not t.needs)
            while ready and len(running) < self.jobs:
                task = ready.pop(0)
                pending.remove(task)
                in_flight = min(self.jobs, len(running) + 1 + len(ready))
                self.start(task, command_of(task), max(1, self.cores // in_flight), echo)  # now in running
                self.say(f"grid: start {' '.join(task.stages)}"
                         + (f" (attempt {task.attempts})" if task.attempts > 1 else "")
                         + f"  [{len(running)} running, {clock(now - self.t0)} elapsed]")
            time.sleep(0.1)
            for p in list(running):
                for _, name in list(p.marks):  # an earlier stage of the task is done once the next starts
                    if name in p.task.stages:
                        self.out.done |= set(p.task.stages[:p.task.stages.index(name)])
                if p.proc.poll() is None:
                    continue
                running.remove(p)
                self._ended(p)
                p.reader.join()
                end = time.monotonic()
                self._finish_marks(p, end)
                self._settle(p, end, pending, bad, total)
        return not self.out.failed and not self.out.skipped

    def _settle(self, p: Process, end: float, pending: list, bad: set, total: int) -> None:
        task, took = p.task, end - p.started
        if p.proc.returncode == 0:
            self.out.done |= set(task.stages)
            if {name for _, name in p.marks} >= set(task.stages):  # not a task DVC found up to date
                self.timed.setdefault(kind(task), []).append(took)
                spans = [b - a for a, b in (self.out.spans[name] for name in task.stages)]
                for family, seconds in zip(kind(task), spans):
                    self.stage_s.setdefault(family, []).append(seconds)
                self.stage_s.setdefault("", []).append(max(took - sum(spans), 0.0))  # DVC's start, around them
            left = eta([(r.task, end - r.started) for r in self.running], pending, self.timed, self.jobs,
                       self.prior, self.stage_s) if pending or self.running else None
            if left is not None:
                self.shown_end = steady(self.shown_end, end, end + left)
                left = self.shown_end - end
            eta_text = "" if left is None else f", ETA {clock(left)}"
            self.say(f"grid: done  {' '.join(task.stages)} in {took:.1f} s  "
                     f"[{len(self.out.done & self.names)}/{total} stages, {clock(end - self.t0)} elapsed{eta_text}]")
            return
        errors = [line for line in p.lines if line.startswith("ERROR")]
        if any(m in line for line in errors for m in LOCK_ERRORS) and task.attempts < MAX_ATTEMPTS:
            self.out.retries += 1
            wait = random.uniform(0.5, 1.5) * min(task.attempts, 5)
            task.not_before = time.monotonic() + wait
            pending.insert(0, task)
            self.say(f"grid: retry {' '.join(task.stages)} in {wait:.1f} s: DVC's lock was taken "
                     f"(attempt {task.attempts} of {MAX_ATTEMPTS})")
            return
        failed = next((FAILED.search(line).group(1) for line in reversed(errors) if FAILED.search(line)), None)
        failed = failed or (p.marks[-1][1] if p.marks else task.stages[0])
        at = task.stages.index(failed) if failed in task.stages else 0
        self.out.done |= set(task.stages[:at])
        self.out.failed[failed] = (str(p.log), p.lines[-15:])
        bad |= set(task.stages[at:])
        self.out.skipped += task.stages[at + 1:]
        self.say(f"grid: FAILED {failed} after {took:.1f} s (exit {p.proc.returncode}; log {p.log})")

"""Memory a step frees is kept for the next (pipeline/training/allocator.py): a stage set up as the
train stage sets itself up reuses its freed pages, where glibc alone hands them back and faults
them in again every step."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pipeline.training.allocator import _glibc
from tests.tiny_project import ROOT

pytestmark = pytest.mark.multiprocess  # the allocator's thresholds are per process: each case its own

# Ten "steps", each holding one 48 MiB tensor (a large language model's logits, say) beside a
# dozen of 64 KiB, all written (as activations are), then freed as a backward frees them. glibc on
# its own serves a block above 32 MiB (its mmap threshold's ceiling) with a new mapping each time:
# every page faults in again, every step. The last four steps' faults are what later steps pay:
# the first few may each place the block anew while the heap settles (what Python and torch
# allocate between steps can split a freed block): step 1 in most runs here, step 2 once on CI.
STEPS = """
import json, resource, sys
import pipeline
from pipeline.training.device import set_up_cpu
import torch
set_up_cpu(1)
faults = []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    held = [torch.ones(12 << 20)] + [torch.ones(16 << 10) for _ in range(12)]
    del held
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""
PAGES = (48 << 20) // 4096  # the large tensor's pages: 12,288


def later_steps_faults(keep: str) -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ABLATION_LAB_KEEP_FREED": keep}
    out = subprocess.run([sys.executable, "-c", STEPS], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])[-4:]


@pytest.mark.skipif(_glibc() is None, reason="glibc's malloc only")
def test_a_stage_reuses_the_pages_its_last_step_freed():
    assert sum(later_steps_faults("1")) < PAGES // 10  # over four steps


@pytest.mark.skipif(_glibc() is None, reason="glibc's malloc only")
def test_without_it_every_step_faults_its_pages_in_again():
    # the control: glibc's own thresholds hand the freed blocks back (the setting turned off)
    assert min(later_steps_faults("0")) >= PAGES

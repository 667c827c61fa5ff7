"""How a stage's process ends (pipeline/warm/exit.py): as Python's exit would, less the teardown of
the imported modules, and every stage module ends that way."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

STAGE = """
import atexit, sys, threading, time
from pipeline.warm.exit import run_main

held = open(sys.argv[1] + ".held", "w")  # open for the process's life, never closed: teardown flushed it

def main():
    held.write("flushed at exit")
    atexit.register(lambda: open(sys.argv[1] + ".atexit", "w").write("ran"))
    threading.Thread(target=lambda: (time.sleep(0.2), open(sys.argv[1] + ".thread", "w").write("ran"))).start()
    print("on stdout", end="")  # no newline: buffered until the exit flushes it
    how = sys.argv[2]
    if how == "message":
        sys.exit("stage: one line naming the problem")
    if how == "raise":
        raise ValueError("boom")
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "code":
        sys.exit(3)

if __name__ == "__main__":
    run_main(main)
"""


@pytest.mark.multiprocess
@pytest.mark.parametrize("how, code, stderr", [
    ("return", 0, ""), ("code", 3, ""), ("message", 1, "stage: one line naming the problem\n"),
    ("raise", 1, "ValueError: boom"), ("interrupt", -2, "KeyboardInterrupt")])
def test_a_stage_exits_as_python_does_with_its_files_flushed(tmp_path, how, code, stderr):
    script = tmp_path / "stage.py"
    script.write_text(STAGE)
    stem = str(tmp_path / "f")
    done = subprocess.run([sys.executable, str(script), stem, how], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == code, done.stderr
    assert done.stdout == "on stdout"
    assert (done.stderr == stderr) if how in ("return", "code", "message") else (stderr in done.stderr)
    for suffix, text in ((".held", "flushed at exit"), (".atexit", "ran"), (".thread", "ran")):
        assert Path(stem + suffix).read_text() == text, suffix


def test_every_stage_module_ends_with_the_fast_exit():
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values()
    modules = {"pipeline." + s["cmd"].split()[s["cmd"].split().index("-m") + 2] for s in stages}
    for module in modules:
        last = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text()).body[-1]
        assert isinstance(last, ast.If) and "run_main(main)" in ast.unparse(last), f"{module} does not end with run_main"

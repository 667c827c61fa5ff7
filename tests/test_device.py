"""CPU threads chosen from the cores that are free, and the CPU's MFU denominator measured once."""
from __future__ import annotations

import json

import pytest

from pipeline.training import device
from pipeline.training.device import choose_threads, cpu_peak_flops


@pytest.mark.parametrize(("cores", "busy", "expected"), [(2, 0, 2), (2, 1, 1), (2, 5, 1), (8, 2, 6), (1, 0, 1)])
def test_auto_threads_take_the_cores_the_other_running_processes_leave(cores, busy, expected):
    threads, why = choose_threads(0, cores=cores, busy=busy)
    assert threads == expected
    assert why.startswith(f"{expected} (train.threads: 0 = auto: {cores} cores") and f"{busy} other" in why


def test_a_fixed_thread_count_is_kept_whatever_is_free():
    assert choose_threads(3, cores=2, busy=2) == (3, "3 (train.threads)")


def test_the_grid_launchers_share_caps_a_fixed_count_and_decides_auto(monkeypatch):
    monkeypatch.setenv(device.THREADS_ENV, "1")
    threads, why = choose_threads(2, cores=2, busy=0)
    assert threads == 1 and "capped" in why  # two stages side by side on 2 cores: one thread each
    assert choose_threads(0, cores=2, busy=0)[0] == 1
    monkeypatch.setenv(device.THREADS_ENV, "4")
    assert choose_threads(2, cores=8, busy=0) == (2, "2 (train.threads)")  # a share above the ask: the ask
    assert device.grid_share() == 4
    monkeypatch.delenv(device.THREADS_ENV)
    assert device.grid_share() is None  # outside the launcher (train.json grid_share: null)


def test_auto_threads_read_this_machine_without_failing():
    threads, _ = choose_threads(0)
    assert threads >= 1


def test_the_cpu_peak_is_measured_once_per_machine_and_then_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "_machine_busy", lambda: False)
    calls = []
    monkeypatch.setattr(device, "measured_matmul_flops", lambda: calls.append(1) or 1e10 * len(calls))
    first, source = cpu_peak_flops(tmp_path)
    second, _ = cpu_peak_flops(tmp_path)
    assert first == second == 1e10 and len(calls) == 1  # a second run divides by the same number
    assert "measured once" in source
    (key,) = json.loads((tmp_path / "cpu_peak_flops.json").read_text())
    assert "threads" in key and "torch" in key


def test_pinned_and_torchs_products_keep_their_own_peak(tmp_path, monkeypatch):
    """The cost plan measured torch's products (unpinned) under the key the pinned train stage then
    read, so every MFU after it divided by the wrong kernel's peak."""
    from pipeline import cpu_numerics

    monkeypatch.setattr(device, "_machine_busy", lambda: False)
    peaks = iter([3e10, 9e10])
    monkeypatch.setattr(device, "measured_matmul_flops", lambda: next(peaks))
    monkeypatch.setattr(cpu_numerics, "engaged", lambda: True)
    assert cpu_peak_flops(tmp_path)[0] == 3e10
    monkeypatch.setattr(cpu_numerics, "engaged", lambda: False)
    assert cpu_peak_flops(tmp_path)[0] == 9e10
    keys = json.loads((tmp_path / "cpu_peak_flops.json").read_text())
    assert sorted(k.rsplit("|", 1)[1] for k in keys) == ["pinned products shared by rows", "torch's products"]


def test_a_corrupt_cache_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "_machine_busy", lambda: False)
    (tmp_path / "cpu_peak_flops.json").write_text("{not json")
    monkeypatch.setattr(device, "measured_matmul_flops", lambda: 5e9)
    assert cpu_peak_flops(tmp_path)[0] == 5e9
    assert list(json.loads((tmp_path / "cpu_peak_flops.json").read_text()).values()) == [5e9]


def test_a_peak_measured_beside_other_processes_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "_machine_busy", lambda: True)
    monkeypatch.setattr(device, "measured_matmul_flops", lambda: 3e10)
    value, source = cpu_peak_flops(tmp_path)
    assert value == 3e10 and "not cached" in source
    assert not (tmp_path / "cpu_peak_flops.json").exists()


def test_the_cpu_is_named_with_its_family_and_model(tmp_path):
    """Under KVM an EPYC calls itself "AMD EPYC": the family and model tell a Zen 3 from a Zen 4
    (run.json and the peak cache's key name the CPU by this)."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
                    "model name\t: AMD EPYC\n\nprocessor\t: 1\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: other\n")
    assert device._cpu_model(str(info)) == "AMD EPYC (family 25 model 1)"
    info.write_text("processor\t: 0\nmodel name\t: Some CPU\n")
    assert device._cpu_model(str(info)) == "Some CPU"
    assert device._cpu_model(str(tmp_path / "missing"))  # no /proc: the platform's word, never empty

"""The report's training-cost table: tokens, steps, FLOPs, wall time, throughput, MFU and the
machine's load, per variant; timings taken under contention are marked (pipeline.planning reads
the mark: such a timing is no measure of the code)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from pipeline.reporting.formatting import MISSING, fmt, fmt_int, fmt_range, fmt_sci
from pipeline.reporting.inputs import number, values_by_seed
from pipeline.reporting.render import Block, Heading, Table

CONTENDED = "⚠"


def beside_siblings(train: Mapping | None) -> bool:
    """Whether the grid launcher (python -m pipeline.grid) ran this run beside other stages of the
    study: train.json's grid_share, the cores it gave each of them."""
    return bool((train or {}).get("grid_share"))


def load_peak(train: Mapping | None) -> float | None:
    """The higher of the 1-minute load averages train.json recorded at the start and end of training."""
    load = (train or {}).get("load") if isinstance((train or {}).get("load"), dict) else {}
    values = [number(load.get(k) if isinstance(load.get(k), dict) else None, "loadavg_1m") for k in ("start", "end")]
    values = [v for v in values if v is not None]
    return max(values) if values else None


# Other processes' share of the machine's CPU time during a run (train.json load.others_cpu_share)
# above which its timing is marked: kernel threads and DVC's own bookkeeping stay well below it.
OTHERS_SHARE = 0.10


def others_share(train: Mapping | None) -> float | None:
    load = (train or {}).get("load")
    return number(load, "others_cpu_share") if isinstance(load, dict) else None


def contended(train: Mapping | None) -> bool | None:
    """Whether a run's timing was taken under contention: other processes used more than
    OTHERS_SHARE of the machine's CPU time while it trained. Runs recorded before that measure: a
    load average above the cores the run used (train.json threads), which also counts the run's
    own threads and the previous stage's tail, so it marks some quiet runs too. None if neither."""
    share = others_share(train)
    if share is not None:
        return share > OTHERS_SHARE
    peak, cores = load_peak(train), number(train, "threads")
    return None if peak is None or cores is None else peak > cores


def mean_batch(trains) -> str:
    """'24.3 × (17.1 + 19)': the mean padded batch over seeds, rows × (source + target) (target alone
    for a language model); MISSING where no train.json records it."""
    shapes = [t["batch_shape_mean"] for t in trains if t.get("batch_shape_mean")]
    if not shapes:
        return MISSING
    rows, src, tgt = np.mean(shapes, axis=0)
    return f"{fmt(rows, 3)} × ({fmt(src, 3)} + {fmt(tgt, 3)})" if src else f"{fmt(rows, 3)} × {fmt(tgt, 3)}"


def cost_blocks(runs, variants: Sequence[str], seeds: Sequence[int]) -> list[Block]:
    """Tokens, steps, wall time, throughput and MFU: mean over seeds with a train.json; timings taken
    under contention (see `contended`) are marked, as they understate what the code does."""
    def mean(v: str, key: str) -> float | None:
        vals = list(values_by_seed(runs, v, seeds, "train", key).values())
        return float(np.mean(vals)) if vals else None

    def counts(v: str, key: str) -> str:  # a mean of step counts (112 from 111 and 113) is no run's
        return fmt_range(list(values_by_seed(runs, v, seeds, "train", key).values()))

    rows, marked, siblings, every_train = [], [], False, []
    for v in variants:
        trains = {s: runs[(v, s)].train for s in seeds if runs[(v, s)].train}
        every_train += trains.values()
        devices = sorted({str(t.get("device")) for t in trains.values()})
        busy = [s for s, t in trains.items() if contended(t)]
        siblings = siblings or any(beside_siblings(trains[s]) for s in busy)
        peaks = [p for t in trains.values() if (p := load_peak(t)) is not None]
        mark = f" {CONTENDED}" if busy else ""
        if busy:
            marked.append(f"{v} (seed{'s' if len(busy) > 1 else ''} {', '.join(map(str, busy))})")
        rows.append([
            v, counts(v, "tokens_trained"), counts(v, "steps"), fmt_sci(mean(v, "flops_per_token")),
            fmt_sci(mean(v, "flops_trained")), fmt(mean(v, "wall_time_s")) + mark,
            fmt_int(mean(v, "tokens_per_s")) + mark, fmt(mean(v, "mfu"), 3), fmt(mean(v, "padding_ratio"), 3),
            mean_batch(trains.values()), ", ".join(devices) or MISSING, fmt_range(list(values_by_seed(runs, v, seeds, "train", "threads").values())),
            fmt(max(peaks), 3) if peaks else MISSING,
            f"{max(shares):.0%}" if (shares := [s for t in trains.values() if (s := others_share(t)) is not None])
            else MISSING,
        ])
    notes = ["Load: the highest 1-minute load average (/proc/loadavg) train.json recorded at the start and end "
             "of a seed's training; cores: the CPU threads the run used (train.json threads); others' CPU: the "
             "largest share of the machine's CPU time that other processes used during a seed's training "
             "(train.json load.others_cpu_share, from /proc/stat less the run's own CPU time). Mean batch: rows x "
             "(source + target length), padded, over the micro-batches trained (train.json batch_shape_mean); "
             "pipeline.plan's CPU time model is calibrated on it."]
    notes.append(f"{CONTENDED} timed under contention: other processes used more than {OTHERS_SHARE:.0%} of the "
                 "machine's CPU time (runs recorded before that measure: the load exceeded the cores the run used), "
                 "so wall time and tokens/s understate this code's speed: " + "; ".join(marked) + "."
                 + (" Runs the grid launcher trained side by side (python -m pipeline.grid; train.json grid_share) "
                    "count the study's own sibling stages as other processes: each had its share of the cores "
                    "(cores column), and its timing is a measure of the study, not of this code alone."
                    if siblings else "") if marked else
                 "No timing here was taken under contention (others' CPU at most "
                 f"{OTHERS_SHARE:.0%}, or where not recorded, load at or below the cores each run used)."
                 if any(row[-2] != MISSING for row in rows) else
                 "Machine load not recorded (train.json files from before it was), so contention is unknown.")
    notes.append(numerics_note(every_train))
    return [Heading("Training cost"), Table(
        ["variant", "tokens trained", "steps", "FLOPs / target token", "FLOPs trained", "wall time (s)", "tokens/s",
         "MFU", "padding ratio", "mean batch", "device", "cores", "load (max)", "others' CPU (max)"],
        rows, "Training cost (train.json): tokens and steps as min–max over seeds (one value when all "
              "seeds agree), the other columns mean over seeds", notes,
    )]


def numerics_note(trains: Sequence[dict]) -> str:
    """Whether the CPU runs' kernels were pinned to one code path (train.json cpu_numerics), so that
    another x86-64 CPU trains the same bits (pipeline/cpu_numerics.py)."""
    cpu = [t for t in trains if str(t.get("device", "cpu")).startswith("cpu")]
    if not cpu:
        return "CPU numerics: no run trained on the CPU (CUDA kernels are not pinned; a GPU run's bits are that GPU's)."
    seen = [t.get("cpu_numerics") for t in cpu]
    if any(n is None for n in seen):
        return ("CPU numerics: not recorded (train.json files from before pipeline/cpu_numerics.py), so whether "
                "another CPU model would train the same bits is unknown.")
    if all(n["pinned"] for n in seen):
        products = sorted({n.get("matmul") or "MKL" for n in seen})
        return ("CPU numerics: pinned in every CPU run (ATen's AVX2 code; matrix products and square roots on "
                f"{', '.join(products)}; pipeline/cpu_numerics.py): the same params train the same bits on any "
                "x86-64 CPU with AVX2 and the same packages (constraints.txt), with any number of threads; "
                "checked on the CPU models docs/training-engine.md names.")
    own = sorted({f"{n['machine']}, ATen {n['aten_capability']}" for n in seen if not n["pinned"]})
    # train.json names why since the pinning could be lost unasked (a linked venv); older ones do not
    why = sorted({n.get("why") or "ABLATION_LAB_PIN_CPU=0, not x86-64 with AVX2, or not recorded"
                  for n in seen if not n["pinned"]})
    return (f"CPU numerics: not pinned in {sum(not n['pinned'] for n in seen)} of {len(seen)} CPU runs ("
            f"{'; '.join(own)}; why: {'; '.join(why)}): their numbers are this machine's, and "
            "another CPU model can move them in the last bits and, through training, beyond.")

"""The engine of `python -m pipeline.plan` (not a DVC stage: no stage loads it).

estimate     parameters, FLOPs, tokens, steps, runs, time and peak memory of each variant
calibration  the CPU time model, fitted to the committed studies' measured walls
study        every stage of a study, its fixed cost as the committed studies measured it, scheduled on --jobs slots
"""

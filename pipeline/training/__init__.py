"""The training engine of the train and evaluate stages (both depend on this folder, nothing else does).

trainer     the loop every variant runs: fixed budgets, evaluation, checkpoints, divergence stop
batching    deterministic batches: length-bucketed seq2seq, packed LM windows, shard reading
optim       AdamW with decay on matrices only, and the learning-rate schedules
checkpoint  resumable checkpoints, written atomically, valid for one config and code hash
device      CPU/GPU choice, threads, precision and autocast, peak FLOP/s for MFU, and the DDP process group
gpu_lock    GPUs for processes on one machine: up to train.runs_per_gpu runs per GPU, under slot lock files
"""

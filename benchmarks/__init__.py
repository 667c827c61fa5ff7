"""Speed measurements that print JSON, each against a reference timed in the same run (never in tests).

model_speed  our encoder-decoder step vs torch.nn.Transformer; written-out vs fused attention
gpt_step     our decoder-only step vs a nanoGPT-style GPT at equal shape
train_loop   what the training loop adds to the model's step, and whether data loading keeps up
cpu_precision  bf16 autocast, fused AdamW and torch.compile on CPU against the float32 eager step
gpu          `bash run.sh gpu`: the GPU tests, the 124M MFU benchmark and a preset on the GPU
stage_times  wall time per DVC stage of a `dvc repro`
cpu_numerics what pinning the CPU kernels' code path costs a step, and torch's own thread facts

Each measures the code path the stages run: the CPU kernels pinned (pipeline/cpu_numerics.py).
"""
import pipeline  # noqa: F401  (before torch: the stages' pinned CPU code path, ABLATION_LAB_PIN_CPU=0 for the native one)

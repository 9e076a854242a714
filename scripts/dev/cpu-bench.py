#!/usr/bin/env python3
"""meshtrain's training step vs plain PyTorch on the same model.

Runs `meshtrain bench` on a config and the same model written in PyTorch
(scripts/dev/torch-anchor-model.py: pre-norm RMSNorm, half-split RoPE, tanh-GELU,
tied embeddings, MHA or MLA, a dense MLP or capacity-dispatched MoE with
shared experts and the aux loss; per-token cross-entropy, global-norm
clipping, AdamW over decay / no-decay groups), both on the CPU with the same
number of threads, and prints the tokens/s and parameter count of each
(meshtrain's from `plan --json`). Usage (from the repo root, after
scripts/build.sh):

  $(scripts/dev/setup-pyenv.sh | tail -1) scripts/dev/cpu-bench.py [--config configs/tiny.json]
      [--threads 1] [--steps 10] [--warmup 2] [--bin build/meshtrain] [--set key=value ...]

`--torch-only --device cuda [--compile]` times only the PyTorch model, on the
GPU, as the anchors of scripts/gpu/gpu-check.sh: the config's model_dtype
bfloat16 becomes autocast to bf16 over fp32 weights (meshtrain's precision
policy), AdamW is the fused one, attention is SDPA (flash on H100), and
`--compile` wraps the loss in torch.compile (the anchor llm.c compares to).
It prints one JSON line: {"anchor": "eager"|"compile", "tokens_per_sec": ...,
"pytorch_params": ...}. `--params-only` only counts the PyTorch model's
parameters, built on the meta device (any size, nothing allocated).
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time


def load_config(path, sets):
    with open(path) as f:
        cfg = json.load(f)
    for s in sets:
        key, value = s.split("=", 1)
        node = cfg
        parts = key.split(".")
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = json.loads(value)
    return cfg


def prepare_data(binary, work):
    corpus = os.path.join(work, "corpus")
    os.makedirs(corpus)
    src = "/usr/share/games/fortunes"
    for f in ("computers", "cookie", "definitions"):
        with open(os.path.join(src, f), "rb") as i, open(os.path.join(corpus, f), "wb") as o:
            o.write(i.read())
    data = os.path.join(work, "data")
    subprocess.run([binary, "prepare-data", "--input", corpus, "--output", data, "--vocab-size", "320"],
                   check=True, capture_output=True)
    return data


def meshtrain_tokens_per_sec(binary, cfg, data, threads, steps, warmup, work):
    cfg = json.loads(json.dumps(cfg))
    cfg["data_config"]["data_dir"] = data
    cfg["model_config"]["vocab_size"] = max(cfg["model_config"]["vocab_size"], 320)
    cfg["device_config"]["device"] = "cpu"
    cfg["torch_threads"] = threads
    path = os.path.join(work, "bench.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run([binary, "bench", "--config", path, "--steps", str(steps), "--warmup", str(warmup)],
                         check=True, capture_output=True, text=True, env=env).stdout
    row = [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]
    return row["tokens_per_sec"]


def anchor_model():
    """scripts/dev/torch-anchor-model.py, loaded by its path (a hyphenated name is no module name)."""
    spec = importlib.util.spec_from_file_location(
        "torch_anchor_model", os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch-anchor-model.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # torch.compile and pickling look the module up by name
    spec.loader.exec_module(module)
    return module


def torch_model(cfg, device, bf16=False):
    """The PyTorch model of cfg (scripts/dev/torch-anchor-model.py): params and the
    summed loss of one microbatch (cross-entropy + alpha-weighted aux loss)."""
    import torch
    model = anchor_model()

    why = model.unsupported(cfg)
    if why:
        sys.exit(f"cpu-bench: {why}")
    T = cfg["data_config"]["T"]
    B = cfg["data_config"]["train_batch_size"]
    mb = cfg["data_config"].get("micro_batch_size", 0) or B
    # meshtrain's loss: sum(ce) / (B * T) + alpha * sum over layers and
    # microbatches of the per-sequence-mean aux loss * (mb / B).
    aux_weight = cfg.get("alpha", 0.0) * mb * T
    V = max(cfg["model_config"]["vocab_size"], 320)
    return model.build(cfg, V, device, torch.bfloat16 if bf16 else torch.float32, aux_weight)


def torch_tokens_per_sec(cfg, threads, steps, warmup, device="cpu", compile_model=False):
    """(tokens/s, parameter count) of the PyTorch model's training step."""
    import contextlib
    import torch

    torch.set_num_threads(threads)
    cuda = device == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    bf16 = cuda and cfg["model_config"].get("model_dtype", "float32") == "bfloat16"
    V, T = max(cfg["model_config"]["vocab_size"], 320), cfg["data_config"]["T"]
    B = cfg["data_config"]["train_batch_size"]
    mb = cfg["data_config"].get("micro_batch_size", 0) or B
    params, forward = torch_model(cfg, device, bf16)
    g = torch.Generator().manual_seed(1)

    loss_fn = torch.compile(forward) if compile_model else forward
    decay = [v for v in params.values() if v.dim() >= 2]
    no_decay = [v for v in params.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, fused=cuda)
    tokens = torch.randint(0, V, (B, T), generator=g).to(device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        for s in range(0, B, mb):
            with autocast:
                loss = loss_fn(tokens[s:s + mb], tokens[s:s + mb]) / (B * T)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(list(params.values()), 1.0)
        opt.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    return B * T * steps / (time.perf_counter() - t0), sum(v.numel() for v in params.values())


def meshtrain_params(binary, cfg, work):
    """meshtrain's own parameter count of cfg (`plan --json`'s total_params)."""
    cfg = json.loads(json.dumps(cfg))
    cfg["model_config"]["vocab_size"] = max(cfg["model_config"]["vocab_size"], 320)
    path = os.path.join(work, "plan.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    out = subprocess.run([binary, "plan", "--config", path, "--json"], check=True, capture_output=True,
                         text=True).stdout
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")][-1]["total_params"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(root, "configs", "tiny.json"))
    ap.add_argument("--bin", default=os.path.join(root, "build", "meshtrain"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], help="override a config key: model_config.n_head=4")
    ap.add_argument("--torch-only", action="store_true", help="time only the PyTorch model (the GPU anchors)")
    ap.add_argument("--params-only", action="store_true",
                    help="only count the PyTorch model's parameters (built on the meta device: any size)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--compile", action="store_true", help="torch.compile the PyTorch model")
    a = ap.parse_args()
    cfg = load_config(a.config, a.set)
    name = os.path.basename(a.config)
    if a.params_only:
        params, _ = torch_model(cfg, "meta")
        print(json.dumps({"pytorch_params": sum(v.numel() for v in params.values()), "config": name}))
        return
    if a.torch_only:
        pt, n = torch_tokens_per_sec(cfg, a.threads, a.steps, a.warmup, a.device, a.compile)
        print(json.dumps({"anchor": "compile" if a.compile else "eager", "device": a.device,
                          "tokens_per_sec": pt, "pytorch_params": n, "config": name}))
        return
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"cpu-bench: no meshtrain binary at {a.bin} (build it with scripts/build.sh meshtrain)")
    with tempfile.TemporaryDirectory() as work:
        data = prepare_data(a.bin, work)
        mt = meshtrain_tokens_per_sec(a.bin, cfg, data, a.threads, a.steps, a.warmup, work)
        mt_params = meshtrain_params(a.bin, cfg, work)
    pt, pt_params = torch_tokens_per_sec(cfg, a.threads, a.steps, a.warmup)
    print(f"config {name}, {a.threads} thread(s), {a.steps} steps after {a.warmup} warm-up")
    print(f"  meshtrain (C++)   {mt:12.1f} tokens/s   {mt_params:12d} parameters")
    print(f"  PyTorch eager     {pt:12.1f} tokens/s   {pt_params:12d} parameters")
    print(f"  ratio             {mt / pt:12.3f}")
    print(json.dumps({"meshtrain_tokens_per_sec": mt, "pytorch_tokens_per_sec": pt, "threads": a.threads,
                      "meshtrain_params": mt_params, "pytorch_params": pt_params}))


if __name__ == "__main__":
    main()

"""The Hugging Face side of tests/e2e/hf.sh (run with the venv of scripts/dev/setup-pyenv.sh).

  compare DIR CLASS DATA_VAL B STEPS T VAL_LOSS PROMPT N GEN_FILE
      load DIR with AutoModelForCausalLM (stock class CLASS, no remote code),
      evaluate the first STEPS batches of B sequences of T+1 tokens of the val
      shard as meshtrain does, and greedy-decode N tokens after PROMPT with the
      exported tokenizer.json: the loss must match VAL_LOSS (1e-5 relative) and
      the text GEN_FILE (what `meshtrain generate` printed).
  make KIND DIR TOKENIZER   a random stock model (llama | deepseek_v3) saved by transformers
  same A B                  the safetensors tensors of dirs A and B are identical
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, DeepseekV3Config, LlamaConfig


def shard_tokens(folder):
    """Every shard of a prepare-data folder, in the data loader's (sorted) order."""
    out = []
    for name in sorted(f for f in os.listdir(folder) if f.endswith(".bin")):
        path = os.path.join(folder, name)
        header = np.fromfile(path, dtype=np.int32, count=256)
        assert header[0] in (20240520, 20240801), f"{path}: not a meshtrain shard"
        dtype = np.uint16 if header[0] == 20240520 and header[1] == 1 else np.uint32
        out.append(np.fromfile(path, dtype=dtype, offset=256 * 4, count=int(header[2])).astype(np.int64))
    return out


def batches(shards, B, T, steps):
    """The batches of meshtrain's DataLoader (one process): B contiguous windows of
    T+1 tokens, stride T; a batch that does not fit starts the next shard."""
    shard, pos = 0, 0
    for _ in range(steps):
        if pos + B * T + 1 > len(shards[shard]):
            pos, shard = 0, (shard + 1) % len(shards)
        toks = torch.from_numpy(shards[shard])
        yield torch.stack([toks[pos + i * T: pos + (i + 1) * T + 1] for i in range(B)])
        pos += B * T


def compare(d, cls, val_dir, B, steps, T, want_loss, prompt, n, gen_file):
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert type(model).__name__ == cls, f"loaded {type(model).__name__}, expected {cls}"
    model.eval()
    ce, count = 0.0, 0
    with torch.no_grad():
        for seqs in batches(shard_tokens(val_dir), B, T, steps):
            logits = model(seqs[:, :-1]).logits.double()
            ce += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), seqs[:, 1:].reshape(-1),
                                                    reduction="sum").item()
            count += seqs[:, 1:].numel()
    loss = ce / count
    rel = abs(loss - want_loss) / abs(want_loss)
    print(f"{cls}: transformers val loss {loss:.8f}, meshtrain {want_loss:.8f}, relative difference {rel:.2e}")
    ok = rel < 1e-5

    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    ids = tok.encode(prompt, add_special_tokens=False).ids
    ids = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
    n_prompt = len(tok.encode(prompt, add_special_tokens=False).ids)
    text = prompt + tok.decode(ids[0, n_prompt:].tolist(), skip_special_tokens=False)
    want = open(gen_file).read().rstrip("\n")
    if text != want:
        print(f"greedy text differs:\n  transformers: {text!r}\n  meshtrain:    {want!r}")
        ok = False
    else:
        print(f"greedy text equal: {text!r}")
    return ok


def make(kind, d, tokenizer):
    torch.manual_seed(0)
    vocab = Tokenizer.from_file(tokenizer).get_vocab_size()
    common = dict(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
                  initializer_range=0.05, bos_token_id=vocab - 1, eos_token_id=vocab - 1)
    if kind == "llama":
        cfg = LlamaConfig(intermediate_size=96, num_key_value_heads=1, hidden_act="silu", **common)
    else:
        cfg = DeepseekV3Config(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4,
                               num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1,
                               first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                               q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                               v_head_dim=16, num_key_value_heads=4, rope_interleave=True, hidden_act="silu",
                               rope_scaling=None, **common)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))  # not all ones, so a swapped norm shows
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.05 * torch.randn_like(b))  # steers the selection
    model.save_pretrained(d, safe_serialization=True)
    os.system(f"cp '{tokenizer}' '{d}/tokenizer.json'")
    return True


def tensors(d):
    index = os.path.join(d, "model.safetensors.index.json")
    files = set(json.load(open(index))["weight_map"].values()) if os.path.exists(index) else {"model.safetensors"}
    out = {}
    for f in files:
        out.update(load_file(os.path.join(d, f)))
    return out


def same(a, b):
    ta, tb = tensors(a), tensors(b)
    ok = True
    if set(ta) != set(tb):
        print(f"tensor names differ: only in {a}: {sorted(set(ta) - set(tb))}, only in {b}: {sorted(set(tb) - set(ta))}")
        ok = False
    for k in sorted(set(ta) & set(tb)):
        if ta[k].shape != tb[k].shape or not torch.equal(ta[k].float(), tb[k].float()):
            print(f"{k}: differs (max abs {(ta[k].float() - tb[k].float()).abs().max().item() if ta[k].shape == tb[k].shape else 'shape'})")
            ok = False
    print(f"{len(ta)} tensors {'identical' if ok else 'DIFFER'}")
    return ok


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "compare":
        d, cls, val, B, steps, T, loss, prompt, n, gen = args
        ok = compare(d, cls, val, int(B), int(steps), int(T), float(loss), prompt, int(n), gen)
    elif cmd == "make":
        ok = make(*args)
    elif cmd == "same":
        ok = same(*args)
    else:
        raise SystemExit(f"unknown command {cmd}")
    sys.exit(0 if ok else 1)

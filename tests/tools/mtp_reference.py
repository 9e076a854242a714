"""DeepSeek-V3's multi-token prediction written from the report's equations
(arXiv 2412.19437, section 2.2), not from meshtrain's code, on stock
transformers' DeepSeek-V3 decoder layers; compared with meshtrain's dump
(tests/unit/mtp_test.cpp: Hugging Face-named weights and gradients, the batch,
the losses).

  h'^k_i = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]    (the published checkpoint's order:
                                                                eh_proj reads [enorm(emb), hnorm(h)])
  h^k_{1:T-k} = TRM_k(h'^k_{1:T-k})
  P^k_{i+k+1} = OutHead(shared_head.norm(h^k_i))
  L^k = -(1/T) sum_i log P^k_i[t_i]   over the positions with a target in the same document
  L = L_main + lambda / D * sum_k L^k

Each depth runs on its truncated sequence (T - k positions), as the equations
have it; meshtrain runs all T positions and masks. h^0 is the main model's last
layer output before the final norm. Usage: mtp_reference.py DUMP TOLERANCE
"""
import json
import sys

import torch
from safetensors import safe_open
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3DecoderLayer, DeepseekV3ForCausalLM, DeepseekV3RMSNorm)


def main(path, tol):
    torch.manual_seed(0)
    with safe_open(path, "pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    cfg = DeepseekV3Config(**json.loads(meta["config"]))
    cfg._attn_implementation = "eager"
    lam, eot = float(meta["mtp_loss_weight"]), int(meta["eot"])
    L, D, d = cfg.num_hidden_layers, cfg.num_nextn_predict_layers, cfg.hidden_size
    weights = {k[len("weight/"):]: v for k, v in t.items() if k.startswith("weight/")}
    grads = {k[len("grad/"):]: v for k, v in t.items() if k.startswith("grad/")}

    model = DeepseekV3ForCausalLM(cfg).float()
    mtp = torch.nn.ModuleList()
    for j in range(D):
        m = torch.nn.Module()
        m.enorm = DeepseekV3RMSNorm(d, cfg.rms_norm_eps)
        m.hnorm = DeepseekV3RMSNorm(d, cfg.rms_norm_eps)
        m.eh_proj = torch.nn.Linear(2 * d, d, bias=False)
        m.block = DeepseekV3DecoderLayer(cfg, layer_idx=L + j)
        m.shared_head = torch.nn.Module()
        m.shared_head.norm = DeepseekV3RMSNorm(d, cfg.rms_norm_eps)
        mtp.append(m)
    # Every parameter and buffer from the dump, by its Hugging Face name.
    named = {}
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        named[name] = p
    for j, m in enumerate(mtp):
        pre = f"model.layers.{L + j}."
        for name, p in list(m.named_parameters()) + list(m.named_buffers()):
            named[pre + name.replace("block.", "", 1)] = p
    for name, p in named.items():
        if name.endswith("rotary_emb.inv_freq") or name.endswith(".original_inv_freq"):
            continue
        assert name in weights, f"the dump has no weight {name}"
        with torch.no_grad():
            p.copy_(weights[name])

    inputs, targets = t["inputs"].long(), t["targets"].long()
    B, T = inputs.shape
    seq = torch.cat([inputs, targets[:, -1:]], 1)  # t_0..t_T
    ends = (seq == eot).long()
    doc = ends.cumsum(1) - ends  # an eot belongs to the document it ends

    captured = {}

    def keep_input(module, args, out):  # returns None: the norm's output stays
        captured["h"] = args[0]

    model.model.norm.register_forward_hook(keep_input)
    logits = model(input_ids=inputs).logits
    main = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1))
    h = captured["h"]
    emb = model.model.embed_tokens
    losses = []
    for k in range(1, D + 1):
        m = mtp[k - 1]
        n = T - k  # positions i = 0..T-k-1 have a target t_{i+k+1}
        h = h[:, :n]
        x = m.eh_proj(torch.cat([m.enorm(emb(seq[:, k:k + n])), m.hnorm(h)], -1))
        pos = torch.arange(n).unsqueeze(0)
        cos_sin = model.model.rotary_emb(x, pos)
        mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
        h = m.block(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        if isinstance(h, tuple):
            h = h[0]
        logp = torch.log_softmax(model.lm_head(m.shared_head.norm(h)), -1)
        target = seq[:, k + 1:k + 1 + n]
        same_doc = (doc[:, :n] == doc[:, k + 1:k + 1 + n]).float()
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        losses.append((nll * same_doc).sum() / (B * T))
    total = main + lam / D * sum(losses)
    total.backward()

    worst = 0.0
    report = [("main", main.item(), t["loss_main"].item()), ("total", total.item(), t["loss_total"].item())]
    report += [(f"mtp depth {k + 1}", l.item(), t[f"loss_mtp_{k + 1}"].item()) for k, l in enumerate(losses)]
    for what, ref, ours in report:
        print(f"{what}: reference {ref:.8f} meshtrain {ours:.8f} difference {abs(ref - ours):.2e}")
        worst = max(worst, abs(ref - ours))
    gworst, gname, compared = 0.0, "", 0
    for name, p in named.items():
        if not isinstance(p, torch.nn.Parameter):
            continue
        # The MTP layers' embed_tokens / shared_head.head are copies of the shared tensors.
        assert name in grads, f"the dump has no gradient {name}"
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        diff = (g - grads[name]).abs().max().item()
        compared += 1
        if diff > gworst:
            gworst, gname = diff, name
    print(f"max gradient difference {gworst:.2e} ({gname}) over {compared} tensors")
    ok = worst <= tol and gworst <= tol
    print("OK" if ok else f"FAIL: above {tol}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], float(sys.argv[2])))

"""meshtrain's model written in plain PyTorch: the anchor of scripts/dev/cpu-bench.py.

Mirrors src/model (docs/models.md, docs/JAXFORMER.md) for meshtrain-layout
configs: pre-norm RMSNorm, tied embeddings, half-split RoPE, tanh-GELU, and
  attention "mha": q, k, v, wo (d x d each), rope on every head dim;
  attention "mla": w_dkv, w_dq (d -> latent_dim), w_uq, w_uk, w_uv
      (latent_dim -> H * hd), decoupled rope w_qr (latent_dim -> H * dhR) and
      w_kr (d -> dhR, one key shared by the heads), wo; each block's last layer
      without rope (mla_last_layer_no_rope, the default);
  ffn "dense": w_in, w_out (mlp_hidden, default 4d);
  ffn "moe": an fp32 router, softmax top-k gates renormalised over the k,
      capacity ceil(capacity_factor * T * k / E) slots per expert and sequence
      (position-major priority, the overflow dropped), the kept assignments
      scattered into [E, B * C] slots, two batched GEMMs, gathered back with
      their gates; n_shared shared experts as one GELU MLP of n_shared * h
      hidden units; the Switch load-balancing loss per sequence (weight alpha).
Dropout (dropout_rate) as meshtrain places it: on the embedding, inside
attention, and on each sublayer's output before its residual add.
The same FLOPs and parameters as meshtrain, not bit parity (other draws).
Options outside this list are refused by name (unsupported()).
"""
import math

import torch
import torch.nn.functional as F

# model_config keys this model does not implement, with the value it assumes.
ASSUMED = {"linear_bias": False, "norm_bias": False, "tie_embeddings": True, "mlp_activation": "gelu",
           "n_kv_head": 0, "mla_latent_norm": False, "mla_rope_input": "split", "mla_last_layer_no_rope": True,
           "moe_layers": "all", "first_k_dense": 0, "shared_expert": "mlp", "router_score": "softmax",
           "router_bias": False, "router_z_loss": 0.0, "routed_scaling_factor": 1.0, "n_group": 1}


def unsupported(cfg):
    """The first model_config setting this model cannot express, as a message; None if all can be."""
    m = cfg["model_config"]
    if m.get("architecture", "auto") == "jaxformer" or ("latent_dim" in m and "attention" not in m and "ffn" not in m):
        return "model_config.architecture jaxformer (the Jaxformer layout) is not in the PyTorch anchor model"
    for key, value in ASSUMED.items():
        if m.get(key, value) != value:
            return f"model_config.{key}={m[key]!r} is not in the PyTorch anchor model (it assumes {value!r})"
    if m.get("attention", "mha") not in ("mha", "mla"):
        return f"model_config.attention={m['attention']!r} is not in the PyTorch anchor model"
    if m.get("ffn", "dense") not in ("dense", "moe"):
        return f"model_config.ffn={m['ffn']!r} is not in the PyTorch anchor model"
    if m.get("ffn") == "moe" and m.get("capacity_factor", 1.25) <= 0:
        return "model_config.capacity_factor <= 0 (dropless MoE) is not in the PyTorch anchor model"
    return None


def build(cfg, vocab, device="cpu", compute_dtype=torch.float32, aux_weight=0.0):
    """Parameters (name -> fp32 Parameter) and forward(tokens, targets) -> the
    summed cross-entropy plus aux_weight times the summed load-balancing loss.
    device "meta" allocates nothing (parameter counts of big shapes)."""
    m = cfg["model_config"]
    d, H, V = m["model_dimension"], m["n_head"], vocab
    L = m["blocks"] * m["layers_per_block"]
    hidden = m.get("mlp_hidden", 0) or 4 * d
    hd, T = d // H, cfg["data_config"]["T"]
    std = m.get("init_std", 0.02)
    theta = m.get("rope_theta", 10000.0)
    p_drop = m.get("dropout_rate", 0.0)
    mla, moe = m.get("attention", "mha") == "mla", m.get("ffn", "dense") == "moe"
    E, k, n_shared = m.get("n_experts", 0), m.get("k", 2), m.get("n_shared", 0)
    latent, dhR = m.get("latent_dim", 0), m.get("dhR", 0)
    dense_model = not mla and not moe

    # The dense model draws on the CPU as before; the MoE/MLA one (1.1B
    # parameters for moe1b) on the device, where it is fast.
    gen_device = "cpu" if dense_model or device == "meta" else device
    g = torch.Generator(device=gen_device).manual_seed(0)

    def p(*shape, s=std):
        if device == "meta":
            return torch.nn.Parameter(torch.empty(*shape, device="meta"))
        return torch.nn.Parameter((torch.randn(*shape, generator=g, device=gen_device) * s).to(device))

    def ones(n):
        return torch.nn.Parameter(torch.ones(n, device=device))

    res_std = std / math.sqrt(2 * L)
    layer_dhR = [0 if (i % m["layers_per_block"]) == m["layers_per_block"] - 1 else dhR for i in range(L)]
    params = {"embed": p(V, d)}
    for i in range(L):
        params.update({f"{i}.n1": ones(d), f"{i}.n2": ones(d)})
        if mla:
            params.update({f"{i}.w_dkv": p(latent, d), f"{i}.w_dq": p(latent, d), f"{i}.w_uq": p(H * hd, latent),
                           f"{i}.w_uk": p(H * hd, latent), f"{i}.w_uv": p(H * hd, latent)})
            if layer_dhR[i] > 0:
                params.update({f"{i}.w_qr": p(H * layer_dhR[i], latent), f"{i}.w_kr": p(layer_dhR[i], d)})
            params[f"{i}.wo"] = p(d, H * hd, s=res_std)
        else:
            params.update({f"{i}.wq": p(d, d), f"{i}.wk": p(d, d), f"{i}.wv": p(d, d), f"{i}.wo": p(d, d, s=res_std)})
        if moe:
            params.update({f"{i}.router": p(E, d), f"{i}.e_in": p(E, hidden, d), f"{i}.e_out": p(E, d, hidden, s=res_std)})
            if n_shared > 0:
                params.update({f"{i}.s_in": p(n_shared * hidden, d), f"{i}.s_out": p(d, n_shared * hidden, s=res_std)})
        else:
            params.update({f"{i}.win": p(hidden, d), f"{i}.wout": p(d, hidden, s=res_std)})
    params["nf"] = ones(d)

    def rope_tables(dim):
        inv = theta ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)
        return torch.cat([ang.cos()] * 2, -1).to(device), torch.cat([ang.sin()] * 2, -1).to(device)

    tables = {dim: rope_tables(dim) for dim in {hd} | ({dhR} if mla and dhR > 0 else set())}

    def rope(x, keep_dtype=False):  # [..., T, dim]
        cos, sin = tables[x.shape[-1]]
        if keep_dtype:  # bf16 in, bf16 out: no fp32 q and k for SDPA to cast back
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def drop(x):
        return F.dropout(x, p_drop, training=True) if p_drop > 0 else x

    def mha(x, i):
        b = x.shape[0]
        q, k_, v = (F.linear(x, params[f"{i}.w{n}"]).view(b, T, H, hd).transpose(1, 2) for n in "qkv")
        o = F.scaled_dot_product_attention(rope(q), rope(k_), v, dropout_p=p_drop, is_causal=True)
        return F.linear(o.transpose(1, 2).reshape(b, T, d), params[f"{i}.wo"])

    def heads(t, dim):
        return t.view(t.shape[0], T, -1, dim).transpose(1, 2)

    def mla_attention(x, i):
        b, r = x.shape[0], layer_dhR[i]
        c, cq = F.linear(x, params[f"{i}.w_dkv"]), F.linear(x, params[f"{i}.w_dq"])
        q = heads(F.linear(cq, params[f"{i}.w_uq"]), hd)
        k_ = heads(F.linear(c, params[f"{i}.w_uk"]), hd)
        v = heads(F.linear(c, params[f"{i}.w_uv"]), hd)
        if r > 0:
            q = torch.cat([q, rope(heads(F.linear(cq, params[f"{i}.w_qr"]), r), True)], -1)
            k_rope = rope(F.linear(x, params[f"{i}.w_kr"]), True)  # [b, T, r]: one rope key for all heads
            k_ = torch.cat([k_, k_rope.unsqueeze(1).expand(-1, H, -1, -1)], -1)
        # Flash attention wants one head size for q, k and v: v padded with
        # zero columns (their outputs are zero and cut), as meshtrain does on GPUs.
        pad = r > 0 and q.is_cuda
        o = F.scaled_dot_product_attention(q, k_, F.pad(v, (0, r)) if pad else v, dropout_p=p_drop, is_causal=True)
        if pad:
            o = o[..., :hd]
        return F.linear(o.transpose(1, 2).reshape(b, T, H * hd), params[f"{i}.wo"])

    def moe_ffn(x, i):
        """Routed experts by capacity (static shapes) plus the shared experts; also the aux loss."""
        b = x.shape[0]
        N = b * T
        C = math.ceil(m.get("capacity_factor", 1.25) * T * k / E)
        S = b * C
        xf = x.reshape(N, d)
        # The router in fp32, as meshtrain's (bf16 scores flip near-ties in top-k).
        with torch.autocast(x.device.type, enabled=False):
            probs = F.linear(xf.float(), params[f"{i}.router"]).softmax(-1)  # [N, E]
        top, idx = probs.topk(k, -1)
        gate = top / top.sum(-1, keepdim=True)
        # Slot of each assignment: a running count per expert along the
        # sequence's position-major [T * k] order (1-based); over C is dropped.
        onehot = F.one_hot(idx.view(b, T * k), E)  # [b, T*k, E]
        slot = (onehot.cumsum(1) * onehot).sum(-1).view(N * k)
        a = torch.arange(N * k, device=x.device)
        token, seq = a // k, a // (T * k)
        row = torch.where(slot <= C, idx.view(-1) * S + seq * C + slot - 1, E * S)  # E * S: the spare row
        xs = xf.to(compute_dtype)
        buf = xs.new_zeros(E * S + 1, d).index_copy(0, row, xs.index_select(0, token))
        hid = F.gelu(torch.bmm(buf[:E * S].view(E, S, d), params[f"{i}.e_in"].transpose(1, 2)), approximate="tanh")
        out = torch.bmm(hid, params[f"{i}.e_out"].transpose(1, 2)).reshape(E * S, d)
        rows = torch.cat([out, out.new_zeros(1, d)])  # dropped assignments read zeros
        each = rows.index_select(0, row) * gate.view(N * k, 1).to(out.dtype)
        y = out.new_zeros(N, d).index_add(0, token, each).view(b, T, d)
        if n_shared > 0:
            y = y + F.linear(F.gelu(F.linear(x, params[f"{i}.s_in"]), approximate="tanh"), params[f"{i}.s_out"])
        # Switch load balancing per sequence: f counts assignments before capacity.
        f = onehot.float().sum(1) / (T * k)  # [b, E]
        P = probs.view(b, T, E).mean(1)
        return y, (E * (f * P).sum(-1)).mean()

    def dense_ffn(x, i):
        return F.linear(F.gelu(F.linear(x, params[f"{i}.win"]), approximate="tanh"), params[f"{i}.wout"])

    attention = mla_attention if mla else mha

    def forward(tokens, targets):
        h = drop(F.embedding(tokens, params["embed"]))
        aux = 0.0
        for i in range(L):
            h = h + drop(attention(rms(h, params[f"{i}.n1"]), i))
            x = rms(h, params[f"{i}.n2"])
            if moe:
                y, a = moe_ffn(x, i)
                aux = aux + a
            else:
                y = dense_ffn(x, i)
            h = h + drop(y)
        z = F.linear(rms(h, params["nf"]), params["embed"])
        ce = F.cross_entropy(z.view(-1, V).float(), targets.view(-1), reduction="sum")
        return ce + aux_weight * aux if moe else ce

    return params, forward


def count(params):
    return sum(v.numel() for v in params.values())

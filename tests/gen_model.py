#!/usr/bin/env python3
"""Make a tiny model that no test was tuned on, with its reference logits.

    python3 tests/gen_model.py OUT_DIR [--seed N] [--conv-L L] [--no-conv-bias] [--tied]
    python3 tests/gen_model.py OUT_DIR --arch llama|qwen3 [--attention-bias] [--mlp-bias] [--tied]

Writes OUT_DIR/{config.txt, config.json, model.safetensors, reference.txt,
NAME.logits.f32} in the format of tests/data/* (tests/data/README.md), with random
weights. By default: conv_bias true, conv_L 4, five layers (conv, full_attention, conv,
conv, full_attention), hidden 128, 4 heads / 2 kv heads of 32, which none of the
shipped models has. --arch llama: four full-attention layers with Llama's names, theta
10000; qwen3: the same with q/k RMSNorm; both may have Hugging Face's attention_bias (q,
k, v, o_proj.bias) and Llama's mlp_bias (gate, up, down_proj.bias). The reference
logits come from the float64 numpy forward below, a cache-free implementation of the
README's math written apart from examples/tinylm.c (every row of a fresh forward over
the whole sequence). Hugging Face's Lfm2ShortConv adds conv.bias inside the depthwise
convolution, in_proj.bias to B|C|x and out_proj.bias to the output; with --tied there
is no lm_head.weight (tie_word_embeddings: the logits use the embedding matrix). Needs
only numpy; takes about two seconds.
"""
import argparse
import json
import os
import struct

import numpy as np

H, HEADS, KV, VOCAB, INTER = 128, 4, 2, 256, 256
HD = H // HEADS
TYPES = ["conv", "full_attention", "conv", "conv", "full_attention"]  # --arch llama, qwen3: 4 full
THETA, EPS = 1000000.0, 1e-5  # --arch llama, qwen3: theta 10000
QK_NORM = True
# Hugging Face's names per architecture (model.layers.N.<name>.weight and the final norm)
LFM2 = dict(attn_norm="operator_norm", mlp_norm="ffn_norm", q="self_attn.q_proj", k="self_attn.k_proj",
            v="self_attn.v_proj", o="self_attn.out_proj", q_norm="self_attn.q_layernorm",
            k_norm="self_attn.k_layernorm", gate="feed_forward.w1", up="feed_forward.w3", down="feed_forward.w2",
            final="model.embedding_norm.weight")
LLAMA = dict(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm", q="self_attn.q_proj",
             k="self_attn.k_proj", v="self_attn.v_proj", o="self_attn.o_proj", q_norm="self_attn.q_norm",
             k_norm="self_attn.k_norm", gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj",
             final="model.norm.weight")
N = LFM2


def make_weights(rng, conv_L, conv_bias, tied, attn_bias=False, mlp_bias=False):
    """Hugging Face names -> float64 arrays (Linear weights [out, in])."""
    def lin(o, i):  # std 1/sqrt(in) keeps activations O(1); 1.5x gives O(1) logit gaps
        return rng.standard_normal((o, i)) * (1.5 / np.sqrt(i))

    def norm(n):
        return 1.0 + 0.2 * rng.standard_normal(n)

    def bias(n):
        return 0.3 * rng.standard_normal(n)

    w = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, H)), N["final"]: norm(H)}
    w["model.embed_tokens.weight"][0] = 0  # the pad token: a zero row, as in lfm2-tiny
    if not tied:
        w["lm_head.weight"] = lin(VOCAB, H)
    for l, t in enumerate(TYPES):
        p = "model.layers.%d." % l
        w[p + N["attn_norm"] + ".weight"] = norm(H)
        w[p + N["mlp_norm"] + ".weight"] = norm(H)
        w[p + N["gate"] + ".weight"] = lin(INTER, H)
        w[p + N["up"] + ".weight"] = lin(INTER, H)
        w[p + N["down"] + ".weight"] = lin(H, INTER)
        if mlp_bias:
            w[p + N["gate"] + ".bias"], w[p + N["up"] + ".bias"] = bias(INTER), bias(INTER)
            w[p + N["down"] + ".bias"] = bias(H)
        if t == "conv":
            w[p + "conv.in_proj.weight"] = lin(3 * H, H)
            w[p + "conv.conv.weight"] = rng.standard_normal((H, 1, conv_L)) / np.sqrt(conv_L)
            w[p + "conv.out_proj.weight"] = lin(H, H)
            if conv_bias:
                w[p + "conv.in_proj.bias"] = bias(3 * H)
                w[p + "conv.conv.bias"] = bias(H)
                w[p + "conv.out_proj.bias"] = bias(H)
        else:
            w[p + N["q"] + ".weight"] = lin(HEADS * HD, H)
            w[p + N["k"] + ".weight"] = lin(KV * HD, H)
            w[p + N["v"] + ".weight"] = lin(KV * HD, H)
            w[p + N["o"] + ".weight"] = lin(H, HEADS * HD)
            if QK_NORM:
                w[p + N["q_norm"] + ".weight"] = norm(HD)
                w[p + N["k_norm"] + ".weight"] = norm(HD)
            if attn_bias:
                w[p + N["q"] + ".bias"], w[p + N["k"] + ".bias"] = bias(HEADS * HD), bias(KV * HD)
                w[p + N["v"] + ".bias"], w[p + N["o"] + ".bias"] = bias(KV * HD), bias(H)
    return w


def proj(w, name, x):  # a Linear: x W^T + b (b only where the model has one)
    return x @ w[name + ".weight"].T + w.get(name + ".bias", 0)


def qk_norm(w, p, q, k):
    if not QK_NORM:
        return q, k
    return rmsnorm(q, w[p + N["q_norm"] + ".weight"]), rmsnorm(k, w[p + N["k_norm"] + ".weight"])


def rmsnorm(x, g):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * g


def rope(x, pos):  # x [T, heads, HD] at positions pos [T], rotate-half
    half = HD // 2
    ang = np.asarray(pos)[:, None] * THETA ** (-2.0 * np.arange(half) / HD)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def forward(w, tokens, conv_L):
    """Logits [T, VOCAB] of a cache-free float64 forward over the whole sequence."""
    T = len(tokens)
    x = w["model.embed_tokens.weight"][tokens]
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l, t in enumerate(TYPES):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + N["attn_norm"] + ".weight"])
        if t == "conv":
            bcx = proj(w, p + "conv.in_proj", h)
            B, C, u = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
            s = np.concatenate([np.zeros((conv_L - 1, H)), B * u])  # zeros before position 0
            k = w[p + "conv.conv.weight"][:, 0, :]  # [H, L]; k[:, L-1] weighs the current token
            conv = sum(s[j:j + T] * k[:, j] for j in range(conv_L)) + w.get(p + "conv.conv.bias", 0)
            y = proj(w, p + "conv.out_proj", C * conv)
        else:
            q = proj(w, p + N["q"], h).reshape(T, HEADS, HD)
            k = proj(w, p + N["k"], h).reshape(T, KV, HD)
            v = proj(w, p + N["v"], h).reshape(T, KV, HD)
            q, k = qk_norm(w, p, q, k)
            q, k = rope(q, np.arange(T)), rope(k, np.arange(T))
            out = np.empty((T, HEADS, HD))
            for hh in range(HEADS):
                g = hh // (HEADS // KV)
                sc = q[:, hh, :] @ k[:, g, :].T / np.sqrt(HD)
                sc = np.where(causal, sc, -np.inf)
                e = np.exp(sc - sc.max(axis=1, keepdims=True))
                out[:, hh, :] = (e / e.sum(axis=1, keepdims=True)) @ v[:, g, :]
            y = proj(w, p + N["o"], out.reshape(T, HEADS * HD))
        x = x + y
        h = rmsnorm(x, w[p + N["mlp_norm"] + ".weight"])
        gate = proj(w, p + N["gate"], h)
        up = proj(w, p + N["up"], h)
        x = x + proj(w, p + N["down"], gate / (1 + np.exp(-gate)) * up)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return rmsnorm(x, w[N["final"]]) @ head.T


def step(w, cache, token, conv_L):
    """Logits of one more token after those in cache (an incremental float64 forward:
    the conv layers' last L-1 vectors B*u, the attention layers' rotated k and v)."""
    pos = cache.setdefault("n", 0)
    x = w["model.embed_tokens.weight"][token][None, :]
    for l, t in enumerate(TYPES):
        p = "model.layers.%d." % l
        h = rmsnorm(x, w[p + N["attn_norm"] + ".weight"])
        if t == "conv":
            bcx = proj(w, p + "conv.in_proj", h)
            B, C, u = bcx[:, :H], bcx[:, H:2 * H], bcx[:, 2 * H:]
            s = np.concatenate([cache.get(l, np.zeros((conv_L - 1, H))), B * u])
            cache[l] = s[1:]
            conv = np.sum(s.T * w[p + "conv.conv.weight"][:, 0, :], axis=1) + w.get(p + "conv.conv.bias", 0)
            y = proj(w, p + "conv.out_proj", C * conv)
        else:
            q = proj(w, p + N["q"], h).reshape(HEADS, HD)
            k = proj(w, p + N["k"], h).reshape(KV, HD)
            v = proj(w, p + N["v"], h).reshape(KV, HD)
            q, k = qk_norm(w, p, q, k)
            q, k = rope(q[None], [pos])[0], rope(k[None], [pos])[0]
            K, V = cache.get(l, (np.zeros((0, KV, HD)), np.zeros((0, KV, HD))))
            K, V = np.concatenate([K, k[None]]), np.concatenate([V, v[None]])
            cache[l] = (K, V)
            out = np.empty((HEADS, HD))
            for hh in range(HEADS):
                g = hh // (HEADS // KV)
                sc = K[:, g, :] @ q[hh] / np.sqrt(HD)
                e = np.exp(sc - sc.max())
                out[hh] = e / e.sum() @ V[:, g, :]
            y = proj(w, p + N["o"], out.reshape(1, HEADS * HD))
        x = x + y
        h = rmsnorm(x, w[p + N["mlp_norm"] + ".weight"])
        gate = proj(w, p + N["gate"], h)
        up = proj(w, p + N["up"], h)
        x = x + proj(w, p + N["down"], gate / (1 + np.exp(-gate)) * up)
    cache["n"] = pos + 1
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return (rmsnorm(x, w[N["final"]]) @ head.T)[0]


def greedy(w, prompt, n_new, conv_L):
    """The prompt plus n_new argmax tokens, the logits rows from the prompt's last
    position on, and the smallest gap between the best and the second-best logit.
    The tokens are chosen incrementally (step); the rows written are those of one
    cache-free forward over the whole sequence, which must pick the same tokens."""
    tokens, cache = list(prompt), {}
    for t in prompt[:-1]:
        step(w, cache, t, conv_L)
    for _ in range(n_new):
        tokens.append(int(np.argmax(step(w, cache, tokens[-1], conv_L))))
    rows = forward(w, tokens, conv_L)[len(prompt) - 1:]
    assert list(np.argmax(rows[:-1], axis=1)) == tokens[len(prompt):], "incremental and full forward disagree"
    top2 = np.sort(rows[:-1], axis=1)[:, -2:]
    return tokens, rows, float(np.min(top2[:, 1] - top2[:, 0]))


def write_safetensors(path, w):
    header, blobs, offset = {}, [], 0
    for name in sorted(w):
        data = np.ascontiguousarray(w[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(w[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--conv-L", type=int, default=4)
    ap.add_argument("--no-conv-bias", action="store_true")
    ap.add_argument("--tied", action="store_true")
    ap.add_argument("--arch", choices=["lfm2", "llama", "qwen3"], default="lfm2")
    ap.add_argument("--attention-bias", action="store_true")
    ap.add_argument("--mlp-bias", action="store_true")
    a = ap.parse_args()
    global TYPES, THETA, QK_NORM, N
    if a.arch != "lfm2":
        TYPES, THETA, QK_NORM, N = ["full_attention"] * 4, 10000.0, a.arch == "qwen3", LLAMA
    rng = np.random.default_rng(a.seed)
    conv_bias = not a.no_conv_bias and a.arch == "lfm2"
    w = make_weights(rng, a.conv_L, conv_bias, a.tied, a.attention_bias, a.mlp_bias)
    # The model as tinylm reads it: float32 weights, so the reference runs on those too.
    w = {k: v.astype(np.float32).astype(np.float64) for k, v in w.items()}
    os.makedirs(a.out, exist_ok=True)
    write_safetensors(os.path.join(a.out, "model.safetensors"), w)
    with open(os.path.join(a.out, "config.txt"), "w") as f:
        f.write("vocab %d\nhidden %d\nlayers %d\nheads %d\nkv %d\nhd %d\ninter %d\ntheta %.1f\nwindow 0\n"
                "rms_eps %g\nrope neox\nact silu\narch %s\nlayer_types %s\nqk_norm %d\nconv_L %d\n"
                "conv_bias %d\ntie_embeddings %d\nattention_bias %d\nmlp_bias %d\n"
                % (VOCAB, H, len(TYPES), HEADS, KV, HD, INTER, THETA, EPS, a.arch, " ".join(TYPES), QK_NORM,
                   a.conv_L if a.arch == "lfm2" else 0, conv_bias, a.tied, a.attention_bias, a.mlp_bias))
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump({"model_type": a.arch, "attention_bias": a.attention_bias, "mlp_bias": a.mlp_bias, "vocab_size": VOCAB, "hidden_size": H, "intermediate_size": INTER,
                   "num_hidden_layers": len(TYPES), "num_attention_heads": HEADS, "num_key_value_heads": KV,
                   "layer_types": TYPES, "conv_L_cache": a.conv_L, "conv_bias": conv_bias, "norm_eps": EPS,
                   "rope_parameters": {"rope_theta": THETA, "rope_type": "default"},
                   "tie_word_embeddings": a.tied, "block_auto_adjust_ff_dim": False}, f, indent=2)
    # The cases of tests/data/README.md, same lengths and roles.
    base_prompt = list(rng.integers(1, VOCAB, 96))
    long_prompt = list(rng.integers(1, VOCAB, 200))
    long_prompt[20] = long_prompt[180] = 0  # the pad token's zero input, as in lfm2-tiny
    cases = []
    base, rows, m = greedy(w, base_prompt, 40, a.conv_L)
    cases.append(("base", "greedy", 96, base, rows, m))
    for name, prefix, extra in (("reuse", base_prompt[:64], 32), ("branch_a", base_prompt, 16),
                                ("branch_b", base_prompt, 16)):
        tokens = prefix + list(rng.integers(1, VOCAB, extra))
        cases.append((name, "forced", len(prefix), tokens, forward(w, tokens, a.conv_L)[len(prefix) - 1:], None))
    tokens, rows, m = greedy(w, long_prompt, 30, a.conv_L)
    cases.append(("long", "greedy", 200, tokens, rows, m))
    with open(os.path.join(a.out, "reference.txt"), "w") as f:
        for name, kind, n, tokens, rows, m in cases:
            f.write("case %s kind %s prompt_len %d total_len %d rows %d min_top2_margin %s\n"
                    % (name, kind, n, len(tokens), len(rows), "nan" if m is None else "%g" % m))
            f.write("tokens %s\n" % " ".join(str(int(t)) for t in tokens))
            rows.astype("<f4").tofile(os.path.join(a.out, name + ".logits.f32"))
    margins = [c[5] for c in cases if c[5] is not None]
    print("gen_model: %s: %s, conv_L %d, conv_bias %d, tied %d, attention_bias %d, mlp_bias %d, seed %d, "
          "smallest top-2 margin %.3g, logits rms %.2f" % (a.out, a.arch, a.conv_L, conv_bias, a.tied,
                                                          a.attention_bias, a.mlp_bias, a.seed, min(margins),
                               float(np.sqrt(np.mean(cases[0][4] ** 2)))))


if __name__ == "__main__":
    main()

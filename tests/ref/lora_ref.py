"""The PyTorch reference for LoRA (issue 31), for tests/test_lora.c: PEFT's LoRA arithmetic
(peft/tuners/lora/layer.py, Linear.forward) on qwen3_ref.py's model, written out here because
peft is not installed:

    result = base_layer(x)                      # F.linear(x, W, b), frozen
    x = x.to(lora_A.weight.dtype)               # _cast_input_dtype (fp32 adapter)
    result = result + lora_B(lora_A(dropout(x))) * scaling
    result = result.to(torch_result_dtype)

with scaling = lora_alpha / r (or lora_alpha / math.sqrt(r) with use_rslora), a Python float.
Only the adapter's tensors require gradients. bf16 runs the forward under
torch.autocast("cpu", dtype=torch.bfloat16), as a PEFT model under autocast does: the base and
the adapter's F.linear run in bf16 with fp32 accumulation, their outputs bf16. Dropout is 0 in
every case (a mask is not comparable across RNGs; test_lora.c checks dropout > 0 on its own).

B starts non-zero here (PEFT's init has B = 0, which would leave A's gradient zero): A is
PEFT's kaiming-uniform U(+-1/sqrt(in)) from the case's generator, B normal(0, 0.2).

DIR/lora/op.safetensors, op.json  the branch alone on one layer (write_op)
DIR/lora/moe_op.safetensors, .json  the branches on bf16 experts (write_moe_op)
DIR/lora/index.json           {"cases": [names]}
DIR/lora/<case>/hf/           the base: config.json + model.safetensors (F32; BF16 for the bf16
                              cases)
DIR/lora/<case>/tokens.npy    the token stream; step s reads windows [s*B, (s+1)*B) (train_ref.py)
DIR/lora/<case>/adapter.safetensors  the initial A and B under PEFT's keys
                              (base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight)
DIR/lora/<case>/expected.safetensors  "grad.<key>": step 1's gradient of every A and B;
                              "step<k>.<key>": the adapter after k AdamW steps (k = steps)
DIR/lora/<case>/meta.json     B, T, steps, rank, alpha, use_rslora, target_modules, bf16, lr,
                              beta1, beta2, eps, weight_decay, "losses" (per step, before it),
                              "n_valid"
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref  # noqa: E402
import safetensors_ref  # noqa: E402
import train_ref  # noqa: E402

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMALL = dict(V=96, C=40, F=72, L=2, NH=6, NKV=2, D=12, tied=False, bias=False)
TIED = dict(V=80, C=32, F=64, L=2, NH=4, NKV=2, D=16, tied=True, bias=True)
RUN = dict(B=2, T=12, accum=1, steps=4, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, wd=0.1, ignore=[])
MOE = dict(V=96, C=32, F=48, L=2, NH=4, NKV=2, D=8, tied=False, bias=False, E=6, K=2, Fm=16,
           norm=True, step=1, mlp_only=[0], aux=False, coef=0.001)
CASES = [
    dict(SMALL, **RUN, name="untied_all_f32", r=4, alpha=8.0, rslora=False, targets=ALL,
         bf16=False),
    dict(TIED, **RUN, name="tied_bias_subset_rslora_f32", r=3, alpha=5.0, rslora=True,
         targets=["q_proj", "v_proj", "down_proj"], bf16=False),
    # Qwen3-MoE with a dense first layer (mlp_only_layers [0]): the attention adapted and the
    # experts frozen; then all-linear (each expert's gate/up/down under PEFT's per-expert keys,
    # layer 0's dense MLP under mlp.*), then a subset with rsLoRA. No aux loss
    # (output_router_logits false): test_lora.c runs no balance.
    dict(MOE, **RUN, name="moe_mixed_attention_f32", r=4, alpha=4.0, rslora=False,
         targets=["q_proj", "k_proj", "v_proj", "o_proj"], bf16=False),
    dict(MOE, **RUN, name="moe_mixed_all_f32", r=4, alpha=8.0, rslora=False, targets=ALL,
         bf16=False),
    dict(MOE, **RUN, name="moe_mixed_subset_rslora_f32", r=3, alpha=5.0, rslora=True,
         targets=["q_proj", "up_proj", "down_proj"], bf16=False),
    dict(SMALL, **RUN, name="untied_all_bf16", r=4, alpha=8.0, rslora=False, targets=ALL,
         bf16=True),
    dict(TIED, **RUN, name="tied_bias_subset_rslora_bf16", r=3, alpha=5.0, rslora=True,
         targets=["k_proj", "o_proj", "gate_proj", "up_proj"], bf16=True),
    # bf16 with every expert adapted (the bf16 expert kernel's LoRA path), rsLoRA.
    dict(MOE, **RUN, name="moe_mixed_all_rslora_bf16", r=4, alpha=8.0, rslora=True, targets=ALL,
         bf16=True),
]

ADAPTER = {}  # PEFT key prefix "base_model.model.<module>" -> (A, B)
SCALING = [1.0]


def lora_linear(x, w, b, module):
    """PEFT's lora.Linear.forward on the frozen F.linear(x, w, b) of `module` (an HF name)."""
    result = F.linear(x, w, b)
    ab = ADAPTER.get("base_model.model." + module)
    if ab is None:
        return result
    A, B = ab
    torch_result_dtype = result.dtype
    x = x.to(A.dtype)
    result = result + F.linear(F.linear(x, A), B) * SCALING[0]  # dropout 0: nn.Identity
    return result.to(torch_result_dtype)


def linear(x, params, name, bias):
    return lora_linear(x, params[name + ".weight"], params[name + ".bias"] if bias else None,
                       name)


def mlp(x, params, p):
    g = lora_linear(x, params[p + "gate_proj.weight"], None, p + "gate_proj")
    u = lora_linear(x, params[p + "up_proj.weight"], None, p + "up_proj")
    return lora_linear(F.silu(g) * u, params[p + "down_proj.weight"], None, p + "down_proj")


def adapter_keys(cfg, targets):
    """[(PEFT key, in, out)] in ctitan's lora_layout order: layer by layer, modules in ALL's
    order, A then B; a sparse layer's MLP modules per expert (PEFT's key for the module
    mlp.experts.{e}.gate_proj), expert by expert, after its attention's."""
    C = cfg["hidden_size"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    mlp = ("gate_proj", "up_proj", "down_proj")

    def dims(mod, Fi):
        return dict(q_proj=(q, C), k_proj=(kv, C), v_proj=(kv, C), o_proj=(C, q),
                    gate_proj=(Fi, C), up_proj=(Fi, C), down_proj=(C, Fi))[mod]

    out = []
    for i in range(cfg["num_hidden_layers"]):
        sparse = qwen3_ref.is_sparse(cfg, i)
        for mod in ALL:
            if mod not in targets or (sparse and mod in mlp):
                continue
            part = "self_attn" if mod not in mlp else "mlp"
            o, n = dims(mod, cfg["intermediate_size"])
            out.append(("base_model.model.model.layers.%d.%s.%s" % (i, part, mod), n, o))
        for e in range(cfg["num_experts"] if sparse else 0):
            for mod in mlp:
                if mod in targets:
                    o, n = dims(mod, cfg["moe_intermediate_size"])
                    out.append(("base_model.model.model.layers.%d.mlp.experts.%d.%s"
                                % (i, e, mod), n, o))
    return out


def step_loss(params, cfg, inp, tgt, bf16):
    if bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = qwen3_ref.forward(params, cfg, inp)
            loss, n_valid = qwen3_ref.loss_fn(logits.float(), tgt)
    else:
        logits = qwen3_ref.forward(params, cfg, inp)
        loss, n_valid = qwen3_ref.loss_fn(logits, tgt)
    return loss, n_valid


def write_case(d, c, gen):
    # bf16 cases store the base as BF16 (as Qwen3's checkpoints are): a bf16 LoRA run holds the
    # base once, in bf16, the embedding included, which autocast would read in fp32.
    cfg, order, params, tokens, _ = train_ref.write_case_inputs(
        d, c, gen, MAKE_REF, "BF16" if c["bf16"] else "F32")
    r = c["r"]
    SCALING[0] = c["alpha"] / (math.sqrt(r) if c["rslora"] else r)
    ADAPTER.clear()
    entries, tensors = [], []
    for key, fan_in, fan_out in adapter_keys(cfg, c["targets"]):
        bound = 1.0 / math.sqrt(fan_in)
        A = (torch.rand((r, fan_in), generator=gen, dtype=torch.float64) * 2 - 1) * bound
        A = A.to(torch.float32).requires_grad_(True)
        B = (0.2 * torch.randn((fan_out, r), generator=gen)).requires_grad_(True)
        ADAPTER[key] = (A, B)
        entries += [(key + ".lora_A.weight", A.detach().clone()),
                    (key + ".lora_B.weight", B.detach().clone())]
        tensors += [(key + ".lora_A.weight", A), (key + ".lora_B.weight", B)]
    safetensors_ref.write_file(os.path.join(d, "adapter.safetensors"), entries, "F32")
    frozen = {k: v.detach() for k, v in params.items()}
    opt = torch.optim.AdamW([t for _, t in tensors], lr=c["lr"], betas=c["betas"], eps=c["eps"],
                            weight_decay=c["wd"], foreach=False)
    losses, expected = [], []
    for s in range(c["steps"]):
        (inp, tgt), = train_ref.step_batches(tokens, c, s)
        opt.zero_grad(set_to_none=True)
        loss, n_valid = step_loss(frozen, cfg, inp, tgt, c["bf16"])
        loss.backward()
        for _, t in tensors:  # experts that saw no token in the step: zero gradients, as in
            if t.grad is None:  # ctitan (torch's AdamW would skip them: no decay, no moments)
                t.grad = torch.zeros_like(t)
        losses.append(float(loss))
        if s == 0:
            expected += [("grad." + k, t.grad.detach().clone()) for k, t in tensors]
            n_valid0 = n_valid
        opt.step()
    expected += [("step%d.%s" % (c["steps"], k), t.detach().clone()) for k, t in tensors]
    safetensors_ref.write_file(os.path.join(d, "expected.safetensors"), expected, "F32")
    meta = dict(B=c["B"], T=c["T"], steps=c["steps"], rank=r, alpha=c["alpha"],
                use_rslora=c["rslora"], target_modules=c["targets"], bf16=c["bf16"],
                lr=c["lr"], beta1=c["betas"][0], beta2=c["betas"][1], eps=c["eps"],
                weight_decay=c["wd"], losses=losses, n_valid=n_valid0)
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")


def write_op(root, gen):
    """The branch alone on one linear layer, to pin the op's arithmetic (ops/lora.c) without the
    model's other bf16 roundings: x (N, in), the base output yb = F.linear(x, W) (a constant
    here: bf16 under autocast), y = PEFT's result; then the gradients of x (through the branch
    only), A and B for an output gradient dy (bf16 under autocast, as a bf16 tensor's is).
    DIR/lora/op.safetensors: "<f32|bf16>.{x,A,B,yb,y,dy,dx,dA,dB}"; op.json: N, in, out, r,
    scale."""
    N, fin, fout, r, scale = 24, 40, 56, 4, 2.5
    x = torch.randn((N, fin), generator=gen)
    W = torch.randn((fout, fin), generator=gen) / fin ** 0.5
    A = (torch.rand((r, fin), generator=gen) * 2 - 1) / fin ** 0.5
    B = 0.3 * torch.randn((fout, r), generator=gen)
    dy = torch.randn((N, fout), generator=gen) * 0.1
    entries = []
    for bf16 in (False, True):
        xs, As, Bs = (t.clone().requires_grad_(True) for t in (x, A, B))
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            yb = F.linear(x, W).detach()
            result = yb + F.linear(F.linear(xs.to(As.dtype), As), Bs) * scale
            result = result.to(yb.dtype)
        g = dy.to(result.dtype)
        dx, dA, dB = torch.autograd.grad(result, [xs, As, Bs], g)
        tag = "bf16." if bf16 else "f32."
        entries += [(tag + k, v.detach().float()) for k, v in
                    (("x", x), ("A", A), ("B", B), ("yb", yb), ("y", result), ("dy", g),
                     ("dx", dx), ("dA", dA), ("dB", dB))]
    safetensors_ref.write_file(os.path.join(root, "op.safetensors"), entries, "F32")
    with open(os.path.join(root, "op.json"), "w") as f:
        json.dump(dict(N=N, fan_in=fin, fan_out=fout, rank=r, scale=scale), f, indent=2)
        f.write("\n")


def write_moe_op(root, gen):
    """The bf16 expert kernel's LoRA path alone (ops moe_bf16_lora_*): HF's Qwen3MoeSparseMoeBlock
    loop over experts on a fixed routing, each expert's gate_proj, up_proj and down_proj PEFT's
    lora.Linear, under torch.autocast: x and the experts' weights hold bf16 values (the kernel
    takes them in bf16), the routing weights fp32 (HF's, cast to the fp32 hidden states' dtype).
    Then the gradients of x, the routing weights and every A and B for an output gradient dout.
    DIR/lora/moe_op.safetensors: x (N, C), expert (N, K) (ids as floats), weight (N, K), w (E,
    3F, C: gate, up, then down (C, F) per expert), lora (per expert: gate A (r, C), B (F, r), up
    A, B, down A (r, F), B (C, r)), dout, out, dx, dweight, dlora (lora's layout);
    moe_op.json: N, C, F, E, K, rank, scale."""
    N, C, Fm, E, K, r, scale = 21, 24, 16, 5, 2, 4, 5.0 / math.sqrt(4)  # rsLoRA, alpha 5
    bf = lambda t: t.to(torch.bfloat16).float()  # noqa: E731
    x = bf(torch.randn((N, C), generator=gen))
    expert = torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(N)])
    expert[3] = torch.tensor([E - 1, 0])  # a token whose experts are not in ascending order
    weight = torch.rand((N, K), generator=gen) + 0.1
    weight = weight / weight.sum(1, keepdim=True)
    w = [[bf(torch.randn(shape, generator=gen) / shape[1] ** 0.5) for shape in ((Fm, C), (Fm, C), (C, Fm))]
         for _ in range(E)]
    ab = [[((torch.rand((r, fin), generator=gen) * 2 - 1) / fin ** 0.5,
            0.2 * torch.randn((fout, r), generator=gen)) for fin, fout in ((C, Fm), (C, Fm), (Fm, C))]
          for _ in range(E)]
    dout = 0.1 * torch.randn((N, C), generator=gen)
    xs, ws = x.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    leaves = [[(A.clone().requires_grad_(True), B.clone().requires_grad_(True)) for A, B in e]
              for e in ab]

    def lora(inp, W, A, B):  # PEFT's lora.Linear.forward, dropout 0
        result = F.linear(inp, W)
        torch_result_dtype = result.dtype
        inp = inp.to(A.dtype)
        result = result + F.linear(F.linear(inp, A), B) * scale
        return result.to(torch_result_dtype)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = torch.zeros((N, C))
        for e in range(E):
            tok, slot = torch.where(expert == e)
            if tok.numel() == 0:
                continue
            (ga, gb), (ua, ub), (da, db) = leaves[e]
            xe = xs[tok]
            h = F.silu(lora(xe, w[e][0], ga, gb)) * lora(xe, w[e][1], ua, ub)
            y = lora(h, w[e][2], da, db)
            out.index_add_(0, tok, (y * ws[tok, slot, None]).to(out.dtype))
    flat = [t for e in leaves for A, B in e for t in (A, B)]
    grads = torch.autograd.grad(out, [xs, ws] + flat, dout, allow_unused=True)
    dl = [torch.zeros_like(t) if g is None else g for g, t in zip(grads[2:], flat)]
    cat = lambda ts: torch.cat([t.reshape(-1) for t in ts])  # noqa: E731
    entries = [("x", x), ("expert", expert.float()), ("weight", weight),
               ("w", cat([m for e in w for m in e])), ("lora", cat([t for e in ab for p in e for t in p])),
               ("dout", dout), ("out", out.detach()), ("dx", grads[0]), ("dweight", grads[1]),
               ("dlora", cat(dl))]
    safetensors_ref.write_file(os.path.join(root, "moe_op.safetensors"),
                               [(k, v.detach().float().contiguous()) for k, v in entries], "F32")
    with open(os.path.join(root, "moe_op.json"), "w") as f:
        json.dump(dict(N=N, C=C, F=Fm, E=E, K=K, rank=r, scale=scale), f, indent=2)
        f.write("\n")


MAKE_REF = None


def write_all(out, quiet=False):
    """Runs with qwen3_ref's linear layers replaced by PEFT's LoRA ones, then puts them back."""
    global MAKE_REF
    import make_ref  # its model init and config.json; imported late, it imports this module

    MAKE_REF = make_ref
    root = os.path.join(out, "lora")
    os.makedirs(root, exist_ok=True)
    gen = torch.Generator().manual_seed(31)
    write_op(root, gen)
    write_moe_op(root, torch.Generator().manual_seed(3131))
    saved = qwen3_ref.linear, qwen3_ref.mlp
    qwen3_ref.linear, qwen3_ref.mlp = linear, mlp
    try:
        for c in CASES:
            write_case(os.path.join(root, c["name"]), c, gen)
    finally:
        qwen3_ref.linear, qwen3_ref.mlp = saved
    with open(os.path.join(root, "index.json"), "w") as f:
        json.dump({"cases": [c["name"] for c in CASES]}, f, indent=2)
        f.write("\n")

"""torchtitan's Qwen3 random init (init_weights, TOML era; ../shared/design.md) on the reference
model's parameter dict (qwen3_ref.py), with torch's own initialisers: trunc_normal_ for the
matrices, normal_ for an untied embedding, the output init for a tied one."""
import math

import torch

import qwen3_ref as R


def std_of(cfg, name):
    """(std, cut) of a matrix; cut None: a plain normal."""
    out = cfg["hidden_size"] ** -0.5
    if name == "lm_head.weight" or (name == "model.embed_tokens.weight" and
                                    cfg.get("tie_word_embeddings")):
        return out, 3 * out
    if name == "model.embed_tokens.weight":
        return 1.0, None
    depth = 0.02 / math.sqrt(2 * (int(name.split(".")[2]) + 1))  # depth_init
    reads_stream = any(k in name for k in ("q_proj", "k_proj", "v_proj", "gate_proj"))
    return (0.02 if reads_stream else depth), 2.0  # torch's default cut, absolute


def init_params(cfg, seed):
    torch.manual_seed(seed)
    params = {}
    for name, shape in R.param_shapes(cfg):
        t = torch.empty(shape)
        if len(shape) == 1:
            t.fill_(0.0 if name.endswith(".bias") else 1.0)
        else:
            std, cut = std_of(cfg, name)
            if cut is None:
                torch.nn.init.normal_(t, 0.0, std)
            else:
                torch.nn.init.trunc_normal_(t, 0.0, std, -cut, cut)
        params[name] = t
    return params

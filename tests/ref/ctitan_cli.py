"""The `ctitan train` command line that runs a training reference case (train_ref.py's and
bf16_ref.py's meta.json) through the CLI: backend hf on the case's hf/, its tokens.npy without
shuffling, and the case's batch, optimizer, schedule and clipping settings. Shared by
tests/train_cli_parity.py and tests/train_bf16.py."""
import os


def train_cmd(ctitan, d, m, dump, moe_impl="grouped", **overrides):
    """argv for case folder d with meta m, writing to dump. overrides: {"section.key": value}
    replacing or adding options (e.g. **{"training.mixed_precision_param": "bfloat16"})."""
    opt = {
        "model.backend": "hf", "model.hf_path": os.path.join(d, "hf"),
        "training.dataset_path": os.path.join(d, "tokens.npy"),
        "training.shuffle": "false", "training.steps": str(m["steps"]),
        "training.seq_len": str(m["T"]), "training.local_batch_size": str(m["B"]),
        "training.global_batch_size": str(m["B"] * m["accum"]),
        "training.max_norm": repr(m["max_norm"]),
        "optimizer.lr": repr(m["lr"]), "optimizer.eps": repr(m["eps"]),
        "optimizer.beta1": repr(m["beta1"]), "optimizer.beta2": repr(m["beta2"]),
        "optimizer.weight_decay": repr(m["weight_decay"]),
        "optimizer.decay_norms_and_embeddings": str(m["decay_norms_and_embeddings"]).lower(),
        "lr_scheduler.warmup_steps": str(m["warmup"]),
        "lr_scheduler.decay_ratio": repr(m["decay_ratio"]),
        "lr_scheduler.decay_type": m["decay_type"],
        "lr_scheduler.min_lr_factor": repr(m["min_lr_factor"]),
        "metrics.log_freq": "1", "metrics.peak_gflops": "100",
        "checkpoint.interval": "100", "job.dump_folder": dump,
    }
    if "load_balance" in m:
        opt.update({"model.moe_impl": moe_impl, "model.load_balance": m["load_balance"],
                    "model.load_balance_coeff": repr(m.get("load_balance_coeff", 1e-3))})
    if "val" in m:
        opt.update({"validation.enable": "true",
                    "validation.dataset_path": os.path.join(d, "val.npy"),
                    "validation.freq": str(m["val"]["freq"]),
                    "validation.steps": str(m["val"]["steps"])})
    opt.update({k: str(v) for k, v in overrides.items()})
    cmd = [ctitan, "train"]
    for k, v in opt.items():
        cmd += ["--" + k, v]
    return cmd

#!/usr/bin/env python3
"""Two training runs agree (tok_mpi.sh, fsdp.sh): compare_runs.py A B LOSS NORM WEIGHTS [STEPS].

Per-step losses within rel LOSS, gradient norms within rel NORM, final weights within rel L2
WEIGHTS; a bound of 0 asks for bit-identical values. With STEPS, only the first STEPS steps'
losses and norms. A and B are job.dump_folders."""
import json, struct, sys, os
import numpy as np
a, b = sys.argv[1], sys.argv[2]
tol_loss, tol_norm, tol_w = map(float, sys.argv[3:6])
first = int(sys.argv[6]) if len(sys.argv) > 6 else 0
def rows(d):
    r = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"loss"' in l]
    return r[:first] if first else r
def weights(d): # the header's tensors, and all their data as one mapped F32 array
    # An HF export the test made in DUMP/hf (FSDP's checkpoints hold shards; a LoRA run's is its
    # PEFT adapter), else the last checkpoint's model.safetensors.
    path = f"{d}/hf/model.safetensors"
    if not os.path.exists(path) and os.path.exists(f"{d}/hf/adapter_model.safetensors"):
        path = f"{d}/hf/adapter_model.safetensors"
    if not os.path.exists(path):
        steps = sorted(int(s[5:]) for s in os.listdir(d + "/checkpoint") if s[5:].isdigit())
        path = f"{d}/checkpoint/step-{steps[-1]}/model.safetensors"
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
    hdr.pop("__metadata__", None)
    if any(v["dtype"] != "F32" for v in hdr.values()):
        sys.exit(f"{path}: expected F32 tensors only")
    return hdr, np.memmap(path, dtype="<f4", mode="r", offset=8 + n)
ra, rb = rows(a), rows(b)
if len(ra) != len(rb) or not ra:
    sys.exit(f"step counts differ: {len(ra)} vs {len(rb)}")
def rel(key):
    return max(abs(x[key] - y[key]) / abs(y[key]) for x, y in zip(ra, rb))
loss, norm = rel("loss"), rel("grad_norm")
fails = [f"{what} rel {got:.2e} over {tol:g}" for what, got, tol in
         [("loss", loss, tol_loss), ("grad norm", norm, tol_norm)] if got > tol]
msg = f"{os.path.basename(a)} vs {os.path.basename(b)}: loss rel {loss:.2e}, grad norm rel {norm:.2e}"
if not first:
    (ha, wa), (hb, wb) = weights(a), weights(b)
    if ha != hb:
        sys.exit(f"{msg}; the two model.safetensors hold different tensors or layouts")
    differ = np.flatnonzero(wa != wb)
    w = 0.0
    if differ.size:
        w = np.linalg.norm(wa[differ].astype(np.float64) - wb[differ]) / np.sqrt(
            np.sum(np.square(wb, dtype=np.float64)))
    msg += f", weights rel L2 {w:.2e} ({differ.size} of {wa.size} differ"
    msg += f", the first at {differ[0]})" if differ.size else ")"
    if w > tol_w or (tol_w == 0 and differ.size):
        fails.append(f"weights rel L2 {w:.2e}, {differ.size} element(s), over {tol_w:g}")
else:
    msg = msg.replace(":", f": first {first} steps'", 1)
print(msg)
sys.exit("; ".join(fails) if fails else 0)

"""What the peak-RSS tests (tok_gen_memory.py, lora_memory.py) share: a weight-dominated BF16
model folder (the real vocabulary, a short stack), a file of random token ids, and a run of
ctitan measured by its peak RSS."""
import os
import subprocess
import sys


def dense_folder(tmp, layers):
    """Writes a BF16 dense model of `layers` layers to tmp/model; (folder, geometry, parameters)."""
    g = dict(V=151936, C=1024, L=layers, NH=8, NKV=4, D=128, F=2048, eps=1e-6,
             theta=1000000.0, tied=True, bias=False, dtype="BF16")
    folder = os.path.join(tmp, "model")
    # Written by another process: a child forked from this one would start with its pages.
    subprocess.run([sys.executable, "-c", "import sys; sys.path[:0] = %r; import moe; "
                    "moe.write_model(%r, %r, 1234, 2)" % (sys.path[:2], folder, g)], check=True)
    n = g["V"] * g["C"] + g["L"] * (
        2 * g["C"] * g["NH"] * g["D"] + 2 * g["C"] * g["NKV"] * g["D"] + 3 * g["C"] * g["F"]
        + 2 * g["C"] + 2 * g["D"]) + g["C"]
    return folder, g, n


def token_file(tmp):
    """4000 random token ids as tmp/tokens.npy (written by another process, as above)."""
    path = os.path.join(tmp, "tokens.npy")
    subprocess.run([sys.executable, "-c", "import numpy as np; np.save(%r, np.random."
                    "default_rng(1).integers(0, 151643, 4000).astype(np.uint32))" % path],
                   check=True)
    return path


def peak_rss(binary, args):
    """Runs binary with args; (exit code, its output, its peak RSS in bytes)."""
    p = subprocess.Popen([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = p.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    return os.waitstatus_to_exitcode(status), out, usage.ru_maxrss * 1024

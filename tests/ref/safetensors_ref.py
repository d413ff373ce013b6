#!/usr/bin/env python3
"""An independent safetensors reader/writer (numpy + torch; the `safetensors` package is not
available here), written from the format description, to cross-check the C implementation.

Format: 8-byte little-endian header length N, N bytes of JSON, then the data region.
The JSON maps tensor names to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
to the data region) plus an optional "__metadata__" object of string -> string.

Our writer (and the C writer, which must match it byte for byte):
  - compact JSON, "__metadata__": {"format": "pt"} first, then tensors sorted by name, each entry
    with keys in the order dtype, shape, data_offsets;
  - data stored in that same (sorted) order, contiguous;
  - header padded with spaces so the data region starts 8-byte aligned: (8 + N) % 8 == 0;
  - BF16/F16 from fp32 by round-to-nearest-even (torch's .to()).
Sharding follows HF: walk tensors in the given order, start a new shard when adding a tensor would
push the current shard over max_shard_bytes and the shard is not empty.

CLI: safetensors_ref.py --check DIR_OR_FILE [...] [--compare SAVED ORIGINAL ...]
     (exit 0 if each reads back cleanly / matches the original)
"""
import json
import os
import struct
import sys

import numpy as np
import torch

DTYPES = {
    # name: (element size, torch dtype)
    "F64": (8, torch.float64),
    "F32": (4, torch.float32),
    "F16": (2, torch.float16),
    "BF16": (2, torch.bfloat16),
    "I64": (8, torch.int64),
    "I32": (4, torch.int32),
    "I16": (2, torch.int16),
    "I8": (1, torch.int8),
    "U8": (1, torch.uint8),
    "BOOL": (1, torch.bool),
}
# Types torch 1.13 cannot hold; we still validate their sizes.
EXTRA_SIZES = {"U64": 8, "U32": 4, "U16": 2}
MAX_HEADER = 100 << 20


class FormatError(Exception):
    pass


def dtype_size(name):
    if name in DTYPES:
        return DTYPES[name][0]
    if name in EXTRA_SIZES:
        return EXTRA_SIZES[name]
    raise FormatError("unknown dtype %r" % (name,))


def to_bytes(t, dtype):
    """fp32 (or any float) tensor -> raw little-endian bytes of `dtype` (F32, BF16, F16)."""
    t = torch.as_tensor(t).detach().to(torch.float32).contiguous()
    if dtype == "F32":
        return t.numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        # torch's fp32 -> bf16 cast rounds to nearest even; view the bits as int16.
        return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    raise ValueError("unsupported output dtype %s" % dtype)


def round_to(t, dtype):
    """The fp32 values a reader sees after storing `t` as `dtype`."""
    t = torch.as_tensor(t).detach().to(torch.float32)
    if dtype == "F32":
        return t.clone()
    if dtype == "BF16":
        return t.to(torch.bfloat16).to(torch.float32)
    if dtype == "F16":
        return t.to(torch.float16).to(torch.float32)
    raise ValueError(dtype)


def header_str(s):
    """A JSON string as the header writes it: backslash before '"' and '\\', control characters
    as \\u00XX, everything else (UTF-8 included) as is."""
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20:
            out.append("\\u%04x" % ord(ch))
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def serialize(entries, dtype):
    """entries: list of (name, tensor). Returns the file's bytes."""
    names = [n for n, _ in entries]
    if len(set(names)) != len(names):
        raise ValueError("duplicate tensor names")
    # Sorted by UTF-8 bytes, as C's strcmp sorts.
    items = sorted(entries, key=lambda e: e[0].encode("utf-8"))
    parts = ['{"__metadata__":{"format":"pt"}']
    blobs = []
    off = 0
    for name, t in items:
        b = to_bytes(t, dtype)
        shape = ",".join(str(int(s)) for s in torch.as_tensor(t).shape)
        parts.append('%s:{"dtype":"%s","shape":[%s],"data_offsets":[%d,%d]}' % (
            header_str(name), dtype, shape, off, off + len(b)))
        blobs.append(b)
        off += len(b)
    h = (",".join(parts) + "}").encode("utf-8")
    h += b" " * ((8 - (8 + len(h)) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write_file(path, entries, dtype):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(serialize(entries, dtype))
    os.replace(tmp, path)


def plan_shards(entries, dtype, max_shard_bytes):
    """Groups entries (in order) into shards as HF's save_pretrained does."""
    esize = dtype_size(dtype)
    shards, cur, cur_bytes = [], [], 0
    for name, t in entries:
        nbytes = torch.as_tensor(t).numel() * esize
        if cur and max_shard_bytes and cur_bytes + nbytes > max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append((name, t))
        cur_bytes += nbytes
    if cur or not shards:
        shards.append(cur)
    return shards


def write_folder(dirname, entries, dtype, max_shard_bytes=0):
    """model.safetensors, or model-0000K-of-0000N.safetensors + model.safetensors.index.json."""
    os.makedirs(dirname, exist_ok=True)
    shards = plan_shards(entries, dtype, max_shard_bytes)
    if len(shards) == 1:
        write_file(os.path.join(dirname, "model.safetensors"), shards[0], dtype)
        return ["model.safetensors"]
    esize = dtype_size(dtype)
    weight_map, files, total = {}, [], 0
    for k, shard in enumerate(shards):
        fname = "model-%05d-of-%05d.safetensors" % (k + 1, len(shards))
        write_file(os.path.join(dirname, fname), shard, dtype)
        files.append(fname)
        for name, t in shard:
            weight_map[name] = fname
            total += torch.as_tensor(t).numel() * esize
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(dirname, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return files


def _is_uint(v):
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def read_file(path, require_aligned=True):
    """Reads and strictly validates a file. Returns {name: (dtype, shape, raw bytes)} and the
    metadata dict. Raises FormatError naming the file (and tensor) on any violation."""
    with open(path, "rb") as f:
        data = f.read()

    def fail(msg):
        raise FormatError("%s: %s" % (path, msg))

    if len(data) < 8:
        fail("file is %d bytes, shorter than the 8-byte header length" % len(data))
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER:
        fail("header length %d exceeds %d" % (n, MAX_HEADER))
    if 8 + n > len(data):
        fail("header length %d runs past the end of the file (%d bytes)" % (n, len(data)))
    if require_aligned and (8 + n) % 8 != 0:
        fail("data region starts at byte %d, not 8-byte aligned" % (8 + n))
    raw = data[8 : 8 + n]
    if not raw.startswith(b"{"):
        fail("header does not start with '{'")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        fail("header is not UTF-8: %s" % e)
    if text.rstrip(" ") != text.rstrip():
        fail("header padding is not spaces")

    def no_dups(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            fail("duplicate key in header")
        return dict(pairs)

    try:
        header = json.loads(text, object_pairs_hook=no_dups)
    except json.JSONDecodeError as e:
        fail("header JSON: %s" % e)
    if not isinstance(header, dict):
        fail("header is not a JSON object")
    meta = header.pop("__metadata__", None)
    if meta is not None:
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            fail("__metadata__ must map strings to strings")
    region = len(data) - 8 - n
    spans = []
    out = {}
    for name, info in header.items():
        if not isinstance(info, dict) or set(info.keys()) != {"dtype", "shape", "data_offsets"}:
            fail("tensor %r: expected keys dtype, shape, data_offsets, found %r" % (name, info))
        dt = info["dtype"]
        if not isinstance(dt, str):
            fail("tensor %r: dtype is not a string" % name)
        try:
            esize = dtype_size(dt)
        except FormatError as e:
            fail("tensor %r: %s" % (name, e))
        shape = info["shape"]
        if not isinstance(shape, list) or not all(_is_uint(s) for s in shape):
            fail("tensor %r: shape must be a list of non-negative integers, found %r" % (name, shape))
        offs = info["data_offsets"]
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_uint(o) for o in offs):
            fail("tensor %r: data_offsets must be [begin, end], found %r" % (name, offs))
        b, e = offs
        if b > e or e > region:
            fail("tensor %r: data_offsets [%d, %d] outside the data region (%d bytes)" % (name, b, e, region))
        numel = 1
        for s in shape:
            numel *= s
        if e - b != numel * esize:
            fail("tensor %r: %s %r needs %d bytes, data_offsets span %d" % (name, dt, shape, numel * esize, e - b))
        spans.append((b, e, name))
        out[name] = (dt, shape, data[8 + n + b : 8 + n + e])
    # The data region must be covered exactly, with no holes and no overlaps.
    spans.sort()
    pos = 0
    for b, e, name in spans:
        if b != pos:
            fail("tensor %r: starts at %d, expected %d (hole or overlap)" % (name, b, pos))
        pos = e
    if pos != region:
        fail("tensors cover %d bytes of a %d-byte data region" % (pos, region))
    return out, meta


def tensor_from(dt, shape, raw):
    """Raw bytes -> torch tensor of the stored dtype."""
    if dt in ("U16", "U32", "U64"):
        a = np.frombuffer(raw, dtype="<u%d" % EXTRA_SIZES[dt]).astype(np.int64)
        return torch.from_numpy(a.copy()).reshape(shape)
    if dt == "BF16":
        a = np.frombuffer(raw, dtype="<i2").copy()
        return torch.from_numpy(a).view(torch.bfloat16).reshape(shape)
    npdt = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
            "I8": "i1", "U8": "u1", "BOOL": "?"}[dt]
    a = np.frombuffer(raw, dtype=npdt).copy()
    return torch.from_numpy(a).reshape(shape)


def load_file(path):
    """{name: tensor in its stored dtype}"""
    tensors, _ = read_file(path)
    return {k: tensor_from(*v) for k, v in tensors.items()}


def load_folder(path):
    """Loads a file, or a folder with model.safetensors or an index + shards, validating the
    index against the shards. Returns {name: tensor}."""
    if os.path.isfile(path):
        return load_file(path)
    index_path = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if not os.path.exists(index_path):
        if not os.path.exists(single):
            raise FormatError("%s: neither model.safetensors nor model.safetensors.index.json" % path)
        return load_file(single)
    with open(index_path) as f:
        try:
            index = json.load(f)
        except json.JSONDecodeError as e:
            raise FormatError("%s: %s" % (index_path, e))
    wm = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise FormatError("%s: weight_map must map tensor names to file names" % index_path)
    out, total = {}, 0
    for fname in sorted(set(wm.values())):
        if "/" in fname or fname.startswith("."):
            raise FormatError("%s: shard name %r escapes the folder" % (index_path, fname))
        fpath = os.path.join(path, fname)
        tensors, _ = read_file(fpath)
        for name, (dt, shape, raw) in tensors.items():
            if wm.get(name) != fname:
                raise FormatError("%s: tensor %r is in %s but weight_map says %r" % (index_path, name, fname, wm.get(name)))
            if name in out:
                raise FormatError("%s: tensor %r appears in two shards" % (index_path, name))
            out[name] = tensor_from(dt, shape, raw)
            total += len(raw)
    for name, fname in wm.items():
        if name not in out:
            raise FormatError("%s: weight_map lists %r in %s, which lacks it" % (index_path, name, fname))
    meta = index.get("metadata", {})
    if isinstance(meta, dict) and "total_size" in meta and meta["total_size"] != total:
        raise FormatError("%s: metadata.total_size is %r, the tensors hold %d bytes" % (index_path, meta["total_size"], total))
    return out


def compare(saved_path, orig_path):
    """Every tensor of `saved` equals the same-named tensor of `orig` after rounding to the
    saved dtype (bitwise), and the names agree. Returns an error string or None."""
    saved, orig = load_folder(saved_path), load_folder(orig_path)
    if set(saved) != set(orig):
        return "%s vs %s: names differ: only in saved %s, only in original %s" % (
            saved_path, orig_path, sorted(set(saved) - set(orig)), sorted(set(orig) - set(saved)))
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
    for name, t in sorted(saved.items()):
        if t.dtype not in names:
            return "%s: tensor %r has dtype %s" % (saved_path, name, t.dtype)
        want = round_to(orig[name].to(torch.float32), names[t.dtype])
        got = t.to(torch.float32)
        if got.shape != want.shape:
            return "%s: tensor %r: shape %s, original %s" % (saved_path, name, list(got.shape), list(want.shape))
        if not torch.equal(got.view(torch.int32), want.view(torch.int32)):
            bad = int((got.view(torch.int32) != want.view(torch.int32)).sum())
            return "%s: tensor %r: %d values differ from the original rounded to %s" % (
                saved_path, name, bad, names[t.dtype])
    return None


USAGE = "usage: safetensors_ref.py [--check PATH ...] [--compare SAVED ORIGINAL ...]"


def main(argv):
    """--check PATH: PATH (file or folder) reads back cleanly. --compare SAVED ORIGINAL: SAVED
    holds ORIGINAL's tensors rounded to SAVED's dtype. Both may repeat, in one process (torch
    takes a second to import)."""
    args, mode, n_done = argv[1:], None, 0
    while args:
        if args[0] in ("--check", "--compare"):
            mode = args.pop(0)
            continue
        try:
            if mode == "--check":
                path = args.pop(0)
                tensors = load_folder(path)
                nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
                dts = sorted({str(t.dtype).replace("torch.", "") for t in tensors.values()})
                print("%s: ok: %d tensors, %d bytes, dtypes %s" % (path, len(tensors), nbytes, ",".join(dts)))
            elif mode == "--compare" and len(args) >= 2:
                saved, orig = args.pop(0), args.pop(0)
                msg = compare(saved, orig)
                if msg:
                    print("safetensors_ref: error: %s" % msg, file=sys.stderr)
                    return 1
                print("%s: same as %s" % (saved, orig))
            else:
                print(USAGE, file=sys.stderr)
                return 2
        except (FormatError, OSError) as e:
            print("safetensors_ref: error: %s" % e, file=sys.stderr)
            return 1
        n_done += 1
    if n_done == 0:
        print(USAGE, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

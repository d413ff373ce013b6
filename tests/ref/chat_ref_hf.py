"""Renders each case of a chat case file with Python's jinja2 set up as transformers'
apply_chat_template sets it up (an ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks
and loopcontrols; tojson as json.dumps(ensure_ascii=False); raise_exception, strftime_now), for
tests/test_tok_chat.c. The same input and output lines as tests/ref/chat_ref.mjs (which renders
with @huggingface/jinja):

    python3 tests/ref/chat_ref_hf.py --assets DIR --cases tests/chat_cases.jsonl --out FILE
"""
import argparse
import json
import os
from datetime import datetime

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


def make_env():
    # transformers.utils.chat_template_utils._compile_jinja_template, less the generation tag
    def raise_exception(message):
        raise RuntimeError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--assets", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(os.path.join(a.assets, "qwen3-tokenizer", "tokenizer_config.json")) as f:
        config = json.load(f)
    special = {}
    for k in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = config.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            special[k] = v
    env = make_env()
    qwen3 = env.from_string(config["chat_template"])
    tdir = os.path.join(os.path.dirname(a.cases), "chat_templates")
    lines = []
    with open(a.cases, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            c = json.loads(line)
            tpl = qwen3
            if "template" in c:
                with open(os.path.join(tdir, c["template"]), encoding="utf-8") as t:
                    tpl = env.from_string(t.read())
            if "vars" in c:
                kw = c["vars"]
            else:
                kw = dict(messages=c["messages"], tools=c.get("tools"), documents=None,
                          add_generation_prompt=c.get("add_generation_prompt", False))
                if "enable_thinking" in c:
                    kw["enable_thinking"] = c["enable_thinking"]
                if "template" not in c:
                    kw.update(special)
            try:
                out = tpl.render(**kw)
                lines.append(json.dumps({"name": c["name"], "hex": out.encode().hex()}))
            except Exception as e:  # the C side must fail too
                lines.append(json.dumps({"name": c["name"], "error": f"{type(e).__name__}: {e}"}))
    with open(a.out + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()

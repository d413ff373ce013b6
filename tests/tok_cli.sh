#!/usr/bin/env bash
# `ctitan tokenize` end to end on real text: every output is compared with Hugging Face's ids
# (tests/ref/tok_encode_files.mjs) and read back with numpy; then the bad inputs.
set -euo pipefail
A=$CTITAN_ASSETS_DIR T=$CTITAN_TMP B=$CTITAN_BIN PY=$CTITAN_PYTHON S=$CTITAN_SOURCE_DIR
if [ ! -f "$A/.fetch-assets-stamp" ]; then
    echo "FAIL: $A has no assets (scripts/fetch-assets was skipped for want of node/npm, or failed)"
    exit 1
fi
TOK=$A/qwen3-tokenizer
source "$(dirname "$0")/checks.bash" # ok, bad, finish

# Inputs: real sentences, with CRLF lines and special tokens mixed in; a .jsonl of the same.
head -n 3000 "$A/corpus/nlp-corpus.txt" >"$T/docs.txt"
printf 'a line with CRLF\r\n<|im_start|>user\r\n\r\nlast line without newline' >>"$T/docs.txt"
"$PY" - "$T/docs.txt" "$T/docs.jsonl" <<'EOF'
import json, sys
with open(sys.argv[1], encoding="utf-8", newline="") as f, open(sys.argv[2], "w") as out:
    for line in f.read().split("\n"):
        line = line.rstrip("\r")
        if line:
            out.write(json.dumps({"id": 1, "text": line}, ensure_ascii=False) + "\n")
EOF
# Invalid UTF-8 (a lone continuation, an overlong, a surrogate, a truncated sequence at the end)
# and its repair by Python's errors="replace", the documented rule.
printf 'good \x80 text \xc0\xaf and \xed\xa0\x80 end \xe2\x82' >"$T/bad.txt"
"$PY" -c "import sys; open(sys.argv[2],'w',encoding='utf-8').write(open(sys.argv[1],'rb').read().decode('utf-8','replace'))" \
    "$T/bad.txt" "$T/bad_fixed.txt"

node "$S/tests/ref/tok_encode_files.mjs" --assets "$A" \
    whole "$T/docs.txt" "$T/ref_whole.json" lines "$T/docs.txt" "$T/ref_lines.json" \
    jsonl "$T/docs.jsonl" "$T/ref_jsonl.json" whole "$T/bad_fixed.txt" "$T/ref_bad.json"

run() { "$B" tokenize --tokenizer "$TOK" "$@"; }
run --input "$T/docs.txt" --output "$T/whole1.npy" --threads 1 >"$T/out1.log"
run --input "$T/docs.txt" --output "$T/whole2.npy" --threads 2 >"$T/out2.log"
run --input "$T/docs.txt" --output "$T/lines.jsonl" --lines
run --input "$T/docs.jsonl" --output "$T/jsonl.npy"
run --input "$T/docs.jsonl" --output "$T/jsonl_noeos.npy" --no-eos
run --input "$T/bad.txt" --output "$T/bad.npy" 2>"$T/bad.err"
grep -q "documents, .* tokens, .* MB/s, .* tokens/s" "$T/out1.log" && ok || bad "no summary line"
cmp -s "$T/whole1.npy" "$T/whole2.npy" && ok || bad "1 and 2 threads differ"
# 0x80: 1, C0 AF: 2 (C0 is never valid), ED A0 80: 3 (a surrogate), E2 82 at the end: 1.
grep -qF "7 invalid UTF-8 sequence(s) replaced by U+FFFD (the first at byte offset 5)" "$T/bad.err" &&
    ok || bad "invalid UTF-8 warning: $(cat "$T/bad.err")"

"$PY" - "$T" <<'EOF' && ok || bad "ids differ from HF (see above)"
import json, sys
import numpy as np
t = sys.argv[1]
EOT = 151643
def ref(name): return json.load(open(f"{t}/{name}"))
def stream(docs, eos=True): return [i for d in docs for i in d + ([EOT] if eos else [])]
checks = []
for name, want in [("whole1.npy", stream(ref("ref_whole.json"))),
                   ("jsonl.npy", stream(ref("ref_jsonl.json"))),
                   ("jsonl_noeos.npy", stream(ref("ref_jsonl.json"), eos=False)),
                   ("bad.npy", stream(ref("ref_bad.json")))]:
    a = np.load(f"{t}/{name}")
    checks.append((name, a.dtype == np.uint32 and a.ndim == 1 and a.tolist() == want,
                   f"{a.dtype} {a.shape} vs {len(want)} ids"))
lines = [json.loads(l)["ids"] for l in open(f"{t}/lines.jsonl")]
checks.append(("lines.jsonl", lines == ref("ref_lines.json"), f"{len(lines)} documents"))
# ctitan's own two readings of the same documents (--lines on the .txt, the .jsonl) agree: this
# compares ctitan with ctitan, the checks above compare each with HF's ids.
jsonl_ids = np.load(f"{t}/jsonl.npy").tolist()
checks.append(("--lines = the .jsonl documents", stream(lines) == jsonl_ids,
               f"{len(stream(lines))} vs {len(jsonl_ids)} ids"))
# The references are real: 3000 lines of text make over 3000 documents and 30000 ids.
n_ref = len(stream(ref("ref_whole.json")))
checks.append(("reference size", len(ref("ref_lines.json")) > 3000 and n_ref > 30000,
               f"{len(ref('ref_lines.json'))} documents, {n_ref} ids"))
for name, good, info in checks:
    print(("ok   " if good else "FAIL ") + name + ("" if good else ": " + info))
sys.exit(0 if all(g for _, g, _ in checks) else 1)
EOF

# Text is bytes: NUL and every other C0 control, raw in a .txt and as JSON escapes in a .jsonl,
# give HF's ids (Hugging Face encodes U+0000 like any other character).
"$PY" - "$T/ctl.txt" "$T/ctl.jsonl" <<'EOF'
import json, sys
ctl = "".join(chr(c) + "x" for c in range(32))
docs = ["a" + ctl + "end", "\0lead", "trail\0", "two\0\0nuls", "\0", "tab\tnul\0 cr\r lf\n end"]
with open(sys.argv[1], "w", encoding="utf-8", newline="") as f:
    f.write("before\0after " + ctl + "\nline two\0\n")
with open(sys.argv[2], "w", encoding="utf-8", newline="") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
EOF
grep -qF '\u0000' "$T/ctl.jsonl" && ok || bad "ctl.jsonl has no \\u0000 escape"
node "$S/tests/ref/tok_encode_files.mjs" --assets "$A" \
    whole "$T/ctl.txt" "$T/ref_ctl_txt.json" jsonl "$T/ctl.jsonl" "$T/ref_ctl_jsonl.json"
run --input "$T/ctl.txt" --output "$T/ctl_txt.npy" >/dev/null || bad "ctl.txt refused"
run --input "$T/ctl.jsonl" --output "$T/ctl_jsonl.npy" >/dev/null || bad "ctl.jsonl refused"
run --input "$T/ctl.jsonl" --output "$T/ctl_jsonl.jsonl" >/dev/null || bad "ctl.jsonl refused"
"$PY" - "$T" <<'EOF' && ok || bad "NUL and C0 controls: ids differ from HF (see above)"
import json, os, sys
import numpy as np
t = sys.argv[1]
EOT = 151643
def ref(name): return json.load(open(f"{t}/{name}"))
def stream(docs): return [i for d in docs for i in d + [EOT]]
def npy(name): return np.load(f"{t}/{name}").tolist() if os.path.exists(f"{t}/{name}") else None
def lines(name):
    if not os.path.exists(f"{t}/{name}"): return None
    return [json.loads(l)["ids"] for l in open(f"{t}/{name}")]
checks = [("ctl_txt.npy", npy("ctl_txt.npy"), stream(ref("ref_ctl_txt.json"))),
          ("ctl_jsonl.npy", npy("ctl_jsonl.npy"), stream(ref("ref_ctl_jsonl.json"))),
          ("ctl_jsonl.jsonl", lines("ctl_jsonl.jsonl"), ref("ref_ctl_jsonl.json"))]
for name, got, want in checks:
    print(("ok   " if got == want else "FAIL ") + name + ("" if got == want else f": {got} vs HF {want}"))
sys.exit(0 if all(g == w for _, g, w in checks) else 1)
EOF

# Bad inputs: each fails with a clear message and exit code 1, and leaves no output file.
expect_error() { # expect_error "message part" args...
    local want=$1
    shift
    rm -f "$T/err.npy"
    if "$B" tokenize "$@" >"$T/err.log" 2>&1; then
        bad "succeeded: $*"
    elif grep -qF -- "$want" "$T/err.log" && [ ! -e "$T/err.npy" ]; then
        ok
    else
        bad "expected '$want' from: $*; got: $(cat "$T/err.log")"
    fi
}
: >"$T/empty.txt"
printf '\n\n\r\n' >"$T/blank.txt"
printf '{"text": "fine"}\n{"txt": "no text field"}\n' >"$T/notext.jsonl"
printf '{"text": "fine"}\n{"text": 5}\n' >"$T/numtext.jsonl"
printf '{"text": "fine"}\n{"text": "unterminated\n' >"$T/badjson.jsonl"
mkdir -p "$T/badtok"
head -c 100000 "$TOK/tokenizer.json" >"$T/badtok/tokenizer.json"
mkdir -p "$T/wordpiece"
"$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); d['model']['type']='WordPiece'; json.dump(d, open(sys.argv[2],'w'))" \
    "$TOK/tokenizer.json" "$T/wordpiece/tokenizer.json"
expect_error "no documents" --tokenizer "$TOK" --input "$T/empty.txt" --output "$T/err.npy"
expect_error "no documents" --tokenizer "$TOK" --input "$T/blank.txt" --output "$T/err.npy" --lines
expect_error "notext.jsonl:2: no \"text\", \"messages\" or \"ids\" field" --tokenizer "$TOK" --input "$T/notext.jsonl" --output "$T/err.npy"
expect_error "numtext.jsonl:2: \"text\" is not a string" --tokenizer "$TOK" --input "$T/numtext.jsonl" --output "$T/err.npy"
expect_error "badjson.jsonl:2: invalid JSON" --tokenizer "$TOK" --input "$T/badjson.jsonl" --output "$T/err.npy"
printf '{"text": "fine"}\n{"text": "a\\u00zzb"}\n' >"$T/badhex.jsonl"
expect_error "badhex.jsonl:2: invalid JSON" --tokenizer "$TOK" --input "$T/badhex.jsonl" --output "$T/err.npy"
expect_error "invalid JSON at byte" --tokenizer "$T/badtok" --input "$T/docs.txt" --output "$T/err.npy"
expect_error "not supported: model type WordPiece" --tokenizer "$T/wordpiece" --input "$T/docs.txt" --output "$T/err.npy"
expect_error "tokenizer.json" --tokenizer "$T/nonexistent" --input "$T/docs.txt" --output "$T/err.npy"
# train's spelling of the tokenizer folder points at tokenize's own
expect_error "unknown option --model.tokenizer_path (did you mean --tokenizer?)" \
  --model.tokenizer_path "$TOK" --input "$T/docs.txt" --output "$T/err.npy"
expect_error "expected a .txt or .jsonl" --tokenizer "$TOK" --input "$T/docs.csv" --output "$T/err.npy"
expect_error "expected a .npy or .jsonl" --tokenizer "$TOK" --input "$T/docs.txt" --output "$T/err.bin"
expect_error "cannot open" --tokenizer "$TOK" --input "$T/missing.txt" --output "$T/err.npy"
expect_error "--threads" --tokenizer "$TOK" --input "$T/docs.txt" --output "$T/err.npy" --threads -1
expect_error "--lines is for .txt" --tokenizer "$TOK" --input "$T/docs.jsonl" --output "$T/err.npy" --lines
expect_error "needs --tokenizer" --input "$T/docs.txt" --output "$T/err.npy"
"$B" tokenize --help | grep -q -- "--no-eos" && ok || bad "help lacks --no-eos"

finish

// scripts/run-fuzz: fuzz_tokenizer's json-mode seed. A byte-level BPE tokenizer.json with the 256 byte tokens, one merge and one added token, then
// a NUL and its tokenizer_config.json (fuzz_tokenizer's json mode, first byte 1)
const bs = [];
for (let b = 33; b <= 126; b++) bs.push(b);
for (let b = 161; b <= 172; b++) bs.push(b);
for (let b = 174; b <= 255; b++) bs.push(b);
const cs = bs.slice();
let n = 0;
for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n++); }
const vocab = {};
bs.forEach((b, i) => { vocab[String.fromCodePoint(cs[i])] = b; });
vocab["ab"] = 256;
const tok = {
  added_tokens: [{id: 257, content: "<|im_end|>", special: true}],
  pre_tokenizer: {type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: true},
  decoder: {type: "ByteLevel"},
  model: {type: "BPE", vocab, merges: ["a b"]},
};
const cfg = {eos_token: "<|im_end|>", split_special_tokens: false,
             added_tokens_decoder: {"257": {content: "<|im_end|>", special: true}}};
process.stdout.write("\x01" + JSON.stringify(tok) + "\0" + JSON.stringify(cfg));

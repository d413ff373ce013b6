// Hugging Face's ids for whole files, the reference for tests/tok_cli.sh.
//
//   node tests/ref/tok_encode_files.mjs --assets DIR MODE INPUT OUTPUT [MODE INPUT OUTPUT ...]
//
// MODE says what a document is, as `ctitan tokenize` defines it: "whole" (the file), "lines"
// (each non-empty line without its \n or \r\n) or "jsonl" (each non-empty line's "text").
// OUTPUT gets a JSON array with one array of ids per document. Inputs must be valid UTF-8.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const argv = process.argv.slice(2);
if (argv[0] !== '--assets' || (argv.length - 2) % 3 !== 0 || argv.length < 5) {
  throw new Error('usage: --assets DIR MODE INPUT OUTPUT [MODE INPUT OUTPUT ...]');
}
const assets = path.resolve(argv[1]);
const require = createRequire(path.join(assets, 'npm', 'package.json'));
const { Tokenizer } = require('tokenizers');
const hf = Tokenizer.fromFile(path.join(assets, 'qwen3-tokenizer', 'tokenizer.json'));

for (let i = 2; i < argv.length; i += 3) {
  const [mode, input, output] = argv.slice(i, i + 3);
  const text = fs.readFileSync(input, 'utf8');
  let docs;
  if (mode === 'whole') {
    docs = [text];
  } else if (mode === 'lines' || mode === 'jsonl') {
    docs = text.split('\n').map((l) => l.replace(/\r$/, '')).filter((l) => l.length > 0);
    if (mode === 'jsonl') docs = docs.map((l) => JSON.parse(l).text);
  } else {
    throw new Error(`unknown mode ${mode}`);
  }
  const encs = await hf.encodeBatch(docs, { addSpecialTokens: false });
  fs.writeFileSync(output, JSON.stringify(encs.map((e) => Array.from(e.getIds()))));
}

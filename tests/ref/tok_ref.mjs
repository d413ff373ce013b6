// Writes the references for the tokenizer tests. Two modes:
//
//   node tests/ref/tok_ref.mjs --assets DIR --out FILE [--docs 0,17,42,75,99]
//     ids for tests/test_tok_parity.c: the hand-written hard cases (tok_cases.mjs) and every
//     sentence of the nlp-corpus files --docs.
//   node tests/ref/tok_ref.mjs --assets DIR --unicode IN --out FILE
//     for tests/test_tok_unicode.c: for each {"name", "hex", "segments"} line of IN, HF's NFC
//     of each segment (hex; "segments" are their byte lengths) and the byte offsets where the
//     pieces that HF's pre-tokenizer cuts the (unnormalised) text into end. Also what node's own
//     Unicode tables (its ICU's, version "unicode") make of each segment's code point (the one
//     after its leading "x"): "class", one letter per segment, 'L' (\p{L}), 'N' (\p{N}), 'o'
//     (another assigned character) or '-' (unassigned, \p{Cn}). The C test uses it to tell a
//     Unicode-version difference from a bug.
//
// Two references, both loading DIR/qwen3-tokenizer/ (what scripts/fetch-assets extracted):
//   hf: Hugging Face's own `tokenizers` (the Rust library, through its node binding): the
//       behaviour ctitan must match;
//   js: @lenml/tokenizers, a JS port of it (the package that ships the Qwen3 tokenizer).
// Where the two disagree, the JS port is wrong; the test says so and follows HF.
//
// Parity lines: {"name", "hex" (the text's UTF-8 bytes), "nfc_hex" (the text after NFC: what
// decoding must give back), "hf" and "js" (ids), "hf_decoded" and "hf_decoded_skip" (HF's
// decode of its ids keeping and skipping special tokens, hex)}. Texts travel as hex because a
// C JSON reader stops strings at NUL.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';
import { cases } from './tok_cases.mjs';

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`);
  if (i >= 0 && i + 1 < process.argv.length) return process.argv[i + 1];
  if (fallback === undefined) throw new Error(`missing --${name}`);
  return fallback;
}

const assets = path.resolve(arg('assets'));
const outPath = arg('out');
const unicodeIn = arg('unicode', null);
const require = createRequire(path.join(assets, 'npm', 'package.json'));
const tokDir = path.join(assets, 'qwen3-tokenizer');
const { Tokenizer } = require('tokenizers');
const hf = Tokenizer.fromFile(path.join(tokDir, 'tokenizer.json'));

const hex = (s) => Buffer.from(s, 'utf8').toString('hex');

function write(lines) {
  fs.writeFileSync(outPath + '.tmp', lines.join('\n') + '\n');
  fs.renameSync(outPath + '.tmp', outPath);
}

// Pieces as byte offsets: HF reports offsets in code points.
function pieceEnds(text, pieces) {
  const cps = Array.from(text);
  const byteAt = new Array(cps.length + 1);
  byteAt[0] = 0;
  for (let i = 0; i < cps.length; i++) byteAt[i + 1] = byteAt[i] + Buffer.byteLength(cps[i]);
  return pieces.map(([, [, end]]) => byteAt[end]);
}

// Node's class of the code point after a segment's leading "x" (see the header).
function nodeClass(seg) {
  if (/^x\p{L}/u.test(seg)) return 'L';
  if (/^x\p{N}/u.test(seg)) return 'N';
  return /^x\p{Cn}/u.test(seg) ? '-' : 'o';
}

if (unicodeIn) {
  const normalizer = hf.getNormalizer();
  const pre = hf.getPreTokenizer();
  const lines = [];
  for (const line of fs.readFileSync(unicodeIn, 'utf8').split('\n')) {
    if (!line) continue;
    const { name, hex: h, segments } = JSON.parse(line);
    const bytes = Buffer.from(h, 'hex');
    const nfc = [];
    let cls = '';
    for (let at = 0, i = 0; i < segments.length; at += segments[i++]) {
      const seg = bytes.subarray(at, at + segments[i]).toString();
      nfc.push(hex(normalizer.normalizeString(seg)));
      cls += nodeClass(seg);
    }
    const text = bytes.toString('utf8');
    lines.push(JSON.stringify({ name, nfc, ends: pieceEnds(text, pre.preTokenizeString(text)),
                                class: cls, unicode: process.versions.unicode }));
  }
  write(lines);
  console.error(`tok_ref: ${lines.length} unicode chunks`);
} else {
  const { TokenizerLoader } = require('@lenml/tokenizers');
  const js = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer.json'), 'utf8')),
    tokenizerConfig: JSON.parse(fs.readFileSync(path.join(tokDir, 'tokenizer_config.json'),
                                                 'utf8')),
  });
  const docs = arg('docs', '0,17,42,75,99').split(',').map(Number);
  const all = cases.map(([name, text]) => ({ name, text }));
  const builds = path.join(assets, 'npm', 'node_modules', 'nlp-corpus', 'builds');
  for (const d of docs) {
    const sentences = JSON.parse(fs.readFileSync(path.join(builds, `doc-${d}.json`), 'utf8'));
    sentences.forEach((text, i) => all.push({ name: `nlp-corpus/doc-${d}/${i}`, text }));
  }
  // encodeBatch runs HF's Rust code on all cores; each text is still encoded on its own.
  const encs = await hf.encodeBatch(all.map((c) => c.text), { addSpecialTokens: false });
  const ids = encs.map((e) => Array.from(e.getIds()));
  const decoded = await hf.decodeBatch(ids, false);
  const decodedSkip = await hf.decodeBatch(ids, true);
  const lines = all.map((c, i) => JSON.stringify({
    name: c.name,
    hex: hex(c.text),
    nfc_hex: hex(c.text.normalize('NFC')),
    hf: ids[i],
    js: js.encode(c.text, { add_special_tokens: false }),
    hf_decoded: hex(decoded[i]),
    hf_decoded_skip: hex(decodedSkip[i]),
  }));
  write(lines);
  console.error(`tok_ref: ${all.length} cases (${cases.length} hand-written, ` +
                `${all.length - cases.length} nlp-corpus sentences from docs ${docs.join(',')})`);
}

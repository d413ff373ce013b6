// Renders each case of a chat case file with @huggingface/jinja (Hugging Face's chat-template
// engine in JS), for tests/test_tok_chat.c:
//
//   node tests/ref/chat_ref.mjs --assets DIR --cases tests/chat_cases.jsonl --out FILE
//
// A case is {"name", "messages", "tools"?, "add_generation_prompt"?, "enable_thinking"?,
// "template"?}. Without "template" it uses the real Qwen3 template
// (DIR/qwen3-tokenizer/tokenizer_config.json) with the globals apply_chat_template passes:
// messages, tools (None when absent), documents (None), add_generation_prompt, enable_thinking
// only when the case sets it, and the tokenizer's special tokens that are set. "template" names
// a file under tests/chat_templates/ instead (no special tokens). A case with "vars" renders
// those globals as they are. Each output line is {"name", "hex"} (the rendered text's UTF-8
// bytes, as hex: a C JSON reader stops strings at NUL) or {"name", "error"}.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

function arg(name) {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0 || i + 1 >= process.argv.length) throw new Error(`missing --${name}`);
  return process.argv[i + 1];
}

const assets = path.resolve(arg('assets'));
const casesPath = arg('cases');
const outPath = arg('out');
const require = createRequire(path.join(assets, 'npm', 'package.json'));
const { Template } = require('@huggingface/jinja');

const config = JSON.parse(
  fs.readFileSync(path.join(assets, 'qwen3-tokenizer', 'tokenizer_config.json'), 'utf8'));
const special = {};
for (const k of ['bos_token', 'eos_token', 'pad_token', 'unk_token']) {
  let v = config[k];
  if (v && typeof v === 'object') v = v.content;
  if (typeof v === 'string') special[k] = v;
}
const qwen3 = new Template(config.chat_template);
const templateDir = path.join(path.dirname(casesPath), 'chat_templates');
const others = new Map();

const lines = [];
for (const line of fs.readFileSync(casesPath, 'utf8').split('\n')) {
  if (!line.trim()) continue;
  const c = JSON.parse(line);
  let tpl = qwen3;
  let vars;
  if (c.template) {
    if (!others.has(c.template))
      others.set(c.template, new Template(fs.readFileSync(path.join(templateDir, c.template), 'utf8')));
    tpl = others.get(c.template);
  }
  if (c.vars) {
    vars = c.vars;
  } else {
    vars = { messages: c.messages, tools: c.tools ?? null, documents: null,
             add_generation_prompt: c.add_generation_prompt ?? false };
    if (c.enable_thinking !== undefined) vars.enable_thinking = c.enable_thinking;
    if (!c.template) Object.assign(vars, special);
  }
  try {
    const out = tpl.render(vars);
    lines.push(JSON.stringify({ name: c.name, hex: Buffer.from(out, 'utf8').toString('hex') }));
  } catch (e) {
    lines.push(JSON.stringify({ name: c.name, error: String(e.message ?? e) }));
  }
}
fs.writeFileSync(outPath + '.tmp', lines.join('\n') + '\n');
fs.renameSync(outPath + '.tmp', outPath);

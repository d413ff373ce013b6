// llama.cpp as the inference peer (bench/generate.py): the prebuilt CPU build that the npm
// package node-llama-cpp ships, on a GGUF written by bench/gguf.py from the same HF folder.
//
//   CTITAN_LLAMA_NPM=DIR node bench/llama_peer.mjs MODEL.gguf PROMPTS.json NEW THREADS REPEATS
//
// PROMPTS.json is a list of token-id lists (ctitan's tokenizer's ids, so both sides see the
// same tokens). Each prompt runs REPEATS times in a fresh sequence, greedy (temperature 0),
// NEW tokens: prefill_s is the time to the first new token (the whole prompt evaluated in one
// batch, then one token chosen: what ctitan's --timing calls prefill), decode_s the time of the
// NEW - 1 tokens after it. Prints one JSON object: {"runs": [{n, prefill_s, decode_s, ids}]}.
import {readFileSync} from "node:fs";
import {join} from "node:path";
import {pathToFileURL} from "node:url";

// node-llama-cpp lives where bench/setup-llama put it (CTITAN_LLAMA_NPM), not in the source tree.
const npm = process.env.CTITAN_LLAMA_NPM;
const {getLlama} = await import(pathToFileURL(join(npm, "node_modules/node-llama-cpp/dist/index.js")).href);

const [modelPath, promptsPath, newArg, threadsArg, repeatsArg] = process.argv.slice(2);
const prompts = JSON.parse(readFileSync(promptsPath, "utf8"));
const nNew = Number(newArg), threads = Number(threadsArg), repeats = Number(repeatsArg);
const longest = Math.max(...prompts.map((p) => p.length));

const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: "error"});
const model = await llama.loadModel({modelPath, gpuLayers: 0, useMmap: true});
const context = await model.createContext({
    contextSize: longest + nNew + 8, batchSize: longest, sequences: 1,
    threads: {ideal: threads, min: threads},
});
const runs = [];
for (let r = 0; r < repeats; r++) {
    for (const prompt of prompts) {
        const seq = context.getSequence();
        const ids = [];
        const t0 = performance.now();
        let tFirst = 0;
        for await (const id of seq.evaluate(prompt, {temperature: 0})) {
            if (ids.length === 0) tFirst = performance.now();
            ids.push(id);
            if (ids.length === nNew) break;
        }
        const t1 = performance.now();
        runs.push({n: prompt.length, prefill_s: (tFirst - t0) / 1e3, decode_s: (t1 - tFirst) / 1e3, ids});
        seq.dispose();
    }
}
console.log(JSON.stringify({runs, build: llama.buildType ?? null, threads: context.currentThreads ?? threads}));
await context.dispose();
await model.dispose();
await llama.dispose();

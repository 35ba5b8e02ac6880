// llama.cpp on our GGUF exports: tokenization, greedy completions, chat mode, metadata.
//
//   node tests/llama_cpp/llama_cpp.mjs REQUEST.json RESPONSE.json
//
// node-llama-cpp 3.21.1 (package-lock.json) ships llama.cpp prebuilt for
// linux-x64; `build: "never"` makes a missing or unloadable binary an error
// instead of a source build. Used by tests/test_llama_cpp.py and
// bench/llama_cpp.py, which write the request:
//   models      GGUF paths, each loaded once, in order; or {path, prompts: N} to
//               complete only the first N prompts with that file
//   prompts     texts; each is tokenized with special tokens (<start_of_turn> is
//               one token) after <bos>, as our tokenizer encodes a prompt
//   maxTokens   new tokens per prompt at most
//   stopText    stop once the completion's text contains it ("" for none), as
//               `gemma-grpo eval` stops at rollout.stop_text
//   threads     llama.cpp's CPU threads
//   chat        optional [{role, content}, ...]: its tokens as the file's chat
//               template renders it, and the tokens that end the model's turn
// Files go through arguments rather than stdout: llama.cpp may print there.

import fs from "node:fs";
import {getLlama, LlamaLogLevel, resolveChatWrapper} from "node-llama-cpp";

const [requestPath, responsePath] = process.argv.slice(2);
const request = JSON.parse(fs.readFileSync(requestPath, "utf8"));
const logs = [];
const llama = await getLlama({
  gpu: false,
  build: "never",
  logLevel: LlamaLogLevel.warn,
  logger: (level, message) => logs.push(`${level}: ${message.trim()}`),
});

async function greedy(model, sequence, prompt) {
  // Exactly argmax: no repeat penalty, no top-k/p, nothing reused from the last prompt.
  await sequence.clearHistory();
  const promptTokens = [model.tokens.bos, ...model.tokenize(prompt, true)];
  const ids = [];
  let stop = "maxTokens";
  const start = performance.now();
  let firstAt = null;
  for await (const token of sequence.evaluate(promptTokens, {temperature: 0})) {
    firstAt ??= performance.now();
    if (model.isEogToken(token)) {
      stop = "eog";
      break;
    }
    ids.push(token);
    if (request.stopText && model.detokenize(ids).includes(request.stopText)) {
      stop = "stopText";
      break;
    }
    if (ids.length >= request.maxTokens) break;
  }
  const end = performance.now();
  return {
    promptTokens,
    ids,
    text: model.detokenize(ids),
    stop,
    // The first token comes out of the prompt's evaluation; each later one out of one decode step.
    promptSeconds: (firstAt - start) / 1000,
    decodeSeconds: (end - firstAt) / 1000,
    decodeSteps: Math.max(ids.length - (stop === "eog" ? 0 : 1), 0),
  };
}

function chat(model, messages) {
  // The conversation as the file's own Jinja template renders it (what llama.cpp's
  // --jinja chat modes run), ending in an open model turn, and the token sequences
  // that end that turn. "auto" names the wrapper node-llama-cpp itself would pick.
  const wrapper = resolveChatWrapper(model, {type: "jinjaTemplate", fallbackToOtherWrappersOnJinjaError: false});
  const chatHistory = [
    ...messages.map((m) => (m.role === "system" ? {type: "system", text: m.content}
                            : m.role === "user" ? {type: "user", text: m.content}
                            : {type: "model", response: [m.content]})),
    {type: "model", response: []},
  ];
  const state = wrapper.generateContextState({chatHistory});
  return {
    wrapper: wrapper.wrapperName,
    auto: resolveChatWrapper(model).wrapperName,
    contextTokens: state.contextText.tokenize(model.tokenizer),
    stopTriggers: state.stopGenerationTriggers.map((trigger) => trigger.tokenize(model.tokenizer)),
  };
}

const response = {models: []};
for (const entry of request.models) {
  const {path, prompts: count = Infinity} = typeof entry === "string" ? {path: entry} : entry;
  const start = performance.now();
  const model = await llama.loadModel({modelPath: path, gpuLayers: 0});
  const loadSeconds = (performance.now() - start) / 1000;
  const context = await model.createContext({
    contextSize: request.contextSize ?? 1024,
    threads: request.threads ?? 0,
    sequences: 1,
  });
  const sequence = context.getSequence();
  const result = {
    path,
    loadSeconds,
    threads: context.currentThreads,
    tokens: {bos: model.tokens.bos, eos: model.tokens.eos, eot: model.tokens.eot},
    eog: Object.fromEntries([1, 105, 106].map((id) => [id, model.isEogToken(id)])),
    chatTemplate: model.fileInfo.metadata?.tokenizer?.chat_template ?? null,
    fileType: model.fileInfo.metadata?.general?.file_type ?? null,
    tensorTypes: Object.fromEntries((model.fileInfo.fullTensorInfo ?? []).map((t) => [t.name, t.ggmlType])),
    warnings: model.getWarnings(),
    completions: [],
  };
  for (const prompt of (request.prompts ?? []).slice(0, count)) {
    result.completions.push(await greedy(model, sequence, prompt));
  }
  if (request.chat) result.chat = chat(model, request.chat);
  response.models.push(result);
  await context.dispose();
  await model.dispose();
}
response.logs = logs;
fs.writeFileSync(responsePath, JSON.stringify(response));
await llama.dispose();

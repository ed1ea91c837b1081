// The Vercel AI SDK (npm `ai` + `@ai-sdk/openai`) driven by tests/test_client_aisdk.py.
//
// Run from the install folder (.tools/aisdk, where node_modules is) as
//   node --input-type=module --eval "$(cat driver.mjs)"
// with AISDK_BASE_URL (the gateway's /v1) and AISDK_SCENARIO set. Prints one JSON object:
// what the SDK returned (text, steps, tool calls and results, stream parts, objects).
import { generateObject, generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";

const provider = createOpenAI({ baseURL: process.env.AISDK_BASE_URL, apiKey: "test-key" });
const model = provider.responses("scripted-model");

const weather = tool({
  description: "The weather in a city.",
  inputSchema: jsonSchema({
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  }),
  execute: async ({ city }) => ({ city, sky: "sunny" }),
});

function steps(result) {
  return result.steps.map((s) => ({
    text: s.text,
    finishReason: s.finishReason,
    toolCalls: s.toolCalls.map((c) => ({ id: c.toolCallId, name: c.toolName, input: c.input })),
    toolResults: s.toolResults.map((r) => ({ id: r.toolCallId, output: r.output })),
  }));
}

async function generateWithTools() {
  const result = await generateText({
    model,
    system: "Be brief.",
    prompt: "Weather in Paris and Rome?",
    tools: { weather },
    stopWhen: stepCountIs(5),
  });
  return { text: result.text, steps: steps(result), usage: result.totalUsage };
}

async function streamWithTools() {
  const result = streamText({
    model,
    system: "Be brief.",
    prompt: "Weather in Oslo?",
    tools: { weather },
    stopWhen: stepCountIs(5),
  });
  const parts = [];
  const deltas = [];
  for await (const part of result.fullStream) {
    parts.push(part.type);
    if (part.type === "text-delta") deltas.push(part.text);
    if (part.type === "error") throw part.error;
  }
  return {
    text: await result.text,
    steps: steps({ steps: await result.steps }),
    parts,
    deltas,
  };
}

// A chat as an app keeps it: each turn's response messages appended to the history.
async function chat(store) {
  const providerOptions = { openai: { store } };
  const messages = [{ role: "user", content: "My name is Ada." }];
  const turns = [];
  for (const next of ["What is the weather in Lima?", "What is my name?"]) {
    const result = await generateText({
      model,
      system: "Be kind.",
      messages,
      tools: { weather },
      stopWhen: stepCountIs(5),
      providerOptions,
    });
    turns.push({ text: result.text, steps: steps(result) });
    messages.push(...result.responseMessages, { role: "user", content: next });
  }
  const last = await generateText({ model, system: "Be kind.", messages, providerOptions });
  turns.push({ text: last.text, steps: steps(last) });
  return { turns };
}

async function object() {
  const result = await generateObject({
    model,
    schemaName: "forecast",
    schemaDescription: "A weather forecast.",
    schema: jsonSchema({
      type: "object",
      properties: { city: { type: "string" }, high: { type: "integer" } },
      required: ["city", "high"],
      additionalProperties: false,
    }),
    prompt: "Forecast for Rome.",
  });
  return { object: result.object, finishReason: result.finishReason };
}

// Tools in a Responses namespace (provider options), beside a top-level one.
async function namespaceTools() {
  const crm = { openai: { namespace: { name: "crm", description: "The CRM." } } };
  const lookup = tool({
    description: "A customer's record.",
    inputSchema: jsonSchema({ type: "object", properties: { id: { type: "integer" } } }),
    providerOptions: crm,
    execute: async ({ id }) => `customer ${id}: Ada`,
  });
  const result = streamText({
    model,
    prompt: "Who is customer 7?",
    tools: { lookup, weather },
    stopWhen: stepCountIs(5),
  });
  const calls = [];
  for await (const part of result.fullStream) {
    if (part.type === "tool-call") {
      calls.push({ name: part.toolName, metadata: part.providerMetadata?.openai ?? null });
    }
    if (part.type === "error") throw part.error;
  }
  return { text: await result.text, calls, steps: steps({ steps: await result.steps }) };
}

// What the SDK makes of a backend's refusal, and of a stream cut mid-answer.
async function failures() {
  let refused = null;
  try {
    await generateText({ model, prompt: "Hi" });
  } catch (error) {
    refused = { name: error.name, status: error.statusCode ?? null, message: error.message };
  }
  const errors = [];
  const result = streamText({ model, prompt: "Hi", onError: ({ error }) => errors.push(error) });
  const parts = [];
  for await (const part of result.fullStream) {
    parts.push(part.type === "error" ? { error: String(part.error?.message ?? part.error) } : part.type);
  }
  return { refused, parts };
}

// A second turn chained by id (the SDK then sends only the new message).
async function previousResponse() {
  const first = await generateText({ model, prompt: "I am Ada." });
  const id = first.providerMetadata.openai.responseId;
  const second = await generateText({
    model,
    prompt: "What is my name?",
    providerOptions: { openai: { previousResponseId: id } },
  });
  return { id, texts: [first.text, second.text] };
}

// An image and a PDF as file parts.
async function media() {
  const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
  const content = [
    { type: "text", text: "Describe both." },
    { type: "file", data: Buffer.from(png, "base64"), mediaType: "image/png" },
    { type: "file", data: Buffer.from("%PDF-1.4"), mediaType: "application/pdf", filename: "a.pdf" },
  ];
  const result = await generateText({ model, messages: [{ role: "user", content }] });
  return { text: result.text };
}

// A reasoning model asked for summaries: the SDK reads reasoning only from summary events.
async function reasoning() {
  const result = streamText({
    model: provider.responses("gpt-5"),
    prompt: "Think first.",
    providerOptions: { openai: { reasoningSummary: "auto", reasoningEffort: "low" } },
  });
  const deltas = [];
  for await (const part of result.fullStream) {
    if (part.type === "reasoning-delta") deltas.push(part.text);
    if (part.type === "error") throw part.error;
  }
  return { deltas, reasoning: (await result.reasoningText) ?? null, text: await result.text };
}

// Reasoning summaries from a model that also streams raw reasoning, streamed and not.
async function reasoningParts() {
  const options = { openai: { reasoningSummary: "auto" } };
  const streamed = streamText({ model, prompt: "Think first.", providerOptions: options });
  for await (const part of streamed.fullStream) if (part.type === "error") throw part.error;
  const whole = await generateText({ model, prompt: "Think first.", providerOptions: options });
  return {
    streamed: (await streamed.reasoningText) ?? null,
    whole: whole.reasoningText ?? null,
    parts: whole.reasoning.map((r) => r.text),
  };
}

// Citations of a hosted web search, streamed and not: the SDK's sources.
async function sources() {
  const tools = { web_search: provider.tools.webSearch() };
  const streamed = streamText({ model, prompt: "What is streamer?", tools });
  for await (const part of streamed.fullStream) if (part.type === "error") throw part.error;
  const whole = await generateText({ model, prompt: "What is streamer?", tools });
  const urls = (list) => list.filter((s) => s.sourceType === "url").map((s) => s.url);
  return { streamed: urls(await streamed.sources), whole: urls(whole.sources), text: whole.text };
}

// A turn that fails after it started, not streamed: the SDK's error says why.
async function failedTurn() {
  try {
    await generateText({ model, prompt: "Hi" });
    return { error: null };
  } catch (error) {
    return { error: { name: error.name, message: error.message } };
  }
}

// The app gives up mid-answer (abortSignal).
async function abort() {
  const controller = new AbortController();
  const result = streamText({ model, prompt: "Say hello.", abortSignal: controller.signal });
  const parts = [];
  for await (const part of result.fullStream) {
    parts.push(part.type);
    if (part.type === "text-delta") controller.abort();
  }
  return { parts };
}

// OpenAI's client-executed shell tool: the SDK runs the commands the model asks for.
async function shellTool() {
  const actions = [];
  const shell = provider.tools.shell({
    execute: async ({ action }) => {
      actions.push(action);
      return {
        output: [{ stdout: "notes.txt\n", stderr: "", outcome: { type: "exit", exitCode: 0 } }],
      };
    },
  });
  const result = await generateText({
    model,
    system: "Use the shell.",
    prompt: "What files are here?",
    tools: { shell },
    stopWhen: stepCountIs(5),
  });
  return { text: result.text, steps: steps(result), actions };
}

// OpenAI's client-executed apply_patch tool, streamed: the SDK applies the operations.
async function applyPatchTool() {
  const operations = [];
  const applyPatch = provider.tools.applyPatch({
    execute: async ({ operation }) => {
      operations.push(operation);
      return { status: "completed", output: `Created ${operation.path}` };
    },
  });
  const result = streamText({
    model,
    prompt: "Create hello.txt.",
    tools: { apply_patch: applyPatch },
    stopWhen: stepCountIs(5),
  });
  const inputs = {};
  for await (const part of result.fullStream) {
    if (part.type === "tool-input-delta") inputs[part.id] = (inputs[part.id] ?? "") + part.delta;
    if (part.type === "error") throw part.error;
  }
  return { text: await result.text, steps: steps({ steps: await result.steps }), operations, inputs };
}

// A remote MCP server the gateway runs (`openai.tools.mcp`), at AISDK_MCP_URL.
async function mcpTool() {
  const dict = provider.tools.mcp({
    serverLabel: "dict",
    serverUrl: process.env.AISDK_MCP_URL,
    requireApproval: "never",
  });
  const result = await generateText({ model, prompt: "Look it up.", tools: { dict } });
  const content = result.content.map((c) => ({
    type: c.type,
    toolName: c.toolName,
    text: c.text,
    output: c.output,
  }));
  return { text: result.text, content };
}

const scenarios = {
  mcp: mcpTool,
  shell: shellTool,
  apply_patch: applyPatchTool,
  abort,
  previous_response: previousResponse,
  media,
  reasoning,
  reasoning_parts: reasoningParts,
  sources,
  failed_turn: failedTurn,
  namespace_tools: namespaceTools,
  failures,
  generate_tools: generateWithTools,
  stream_tools: streamWithTools,
  chat_store: () => chat(true),
  chat_no_store: () => chat(false),
  object,
};

try {
  const out = await scenarios[process.env.AISDK_SCENARIO]();
  process.stdout.write(JSON.stringify(out));
} catch (error) {
  process.stdout.write(
    JSON.stringify({ error: { name: error?.name, message: String(error?.message ?? error) } }),
  );
  process.exitCode = 3;
}

// The OpenAI Agents SDK for JavaScript (npm `@openai/agents`) driven by
// tests/test_client_agentsjs.py.
//
// Run from the install folder (.tools/agentsjs, where node_modules is) as
//   node --input-type=module --eval "$(cat driver.mjs)"
// with AGENTS_BASE_URL (the gateway's /v1) and AGENTS_SCENARIO set. Prints one JSON object:
// what the SDK returned (final output, the run's items, stream events).
import {
  Agent,
  run,
  setDefaultOpenAIClient,
  setOpenAIAPI,
  setTracingDisabled,
  tool,
  webSearchTool,
} from "@openai/agents";
import OpenAI from "openai";
import { z } from "zod";

setDefaultOpenAIClient(new OpenAI({ baseURL: process.env.AGENTS_BASE_URL, apiKey: "test-key" }));
setOpenAIAPI("responses");
setTracingDisabled(true); // traces would go to api.openai.com

const weather = tool({
  name: "weather",
  description: "The weather in a city.",
  parameters: z.object({ city: z.string() }),
  execute: async ({ city }) => `${city}: sunny`,
});

function items(result) {
  return result.newItems.map((item) => ({ type: item.type, raw: item.rawItem ?? null }));
}

// A tool loop: the agent calls the tool, gets its output, answers.
async function toolLoop() {
  const agent = new Agent({ name: "a", model: "scripted-model", tools: [weather] });
  const result = await run(agent, "Weather in Paris?");
  return { output: result.finalOutput, items: items(result) };
}

// The same, streamed: the text as it arrives.
async function streamed() {
  const agent = new Agent({ name: "a", model: "scripted-model", tools: [weather] });
  const result = await run(agent, "Weather in Oslo?", { stream: true });
  const deltas = [];
  for await (const event of result) {
    if (event.type === "raw_model_stream_event" && event.data.type === "output_text_delta") {
      deltas.push(event.data.delta);
    }
  }
  await result.completed;
  return { output: result.finalOutput, deltas, items: items(result) };
}

// A hosted web search on a /v1/responses backend, streamed: the raw events the SDK got.
async function webSearch() {
  const agent = new Agent({ name: "a", model: "gpt-5", tools: [webSearchTool()] });
  const result = await run(agent, "What is streamer?", { stream: true });
  const events = [];
  for await (const event of result) {
    if (event.type === "raw_model_stream_event" && event.data.type === "model") {
      events.push(event.data.event);
    }
  }
  await result.completed;
  return { output: result.finalOutput, events, items: items(result) };
}

// A reasoning model's summary parts and raw reasoning (not streamed).
async function reasoning() {
  const agent = new Agent({
    name: "a",
    model: "gpt-5",
    modelSettings: { reasoning: { effort: "low", summary: "auto" } },
  });
  const result = await run(agent, "Think first.");
  return { output: result.finalOutput, items: items(result) };
}

// A turn that fails mid-way: what the SDK throws.
async function failure() {
  const agent = new Agent({ name: "a", model: "scripted-model" });
  try {
    await run(agent, "Hi");
    return { error: null };
  } catch (error) {
    return { error: { name: error?.name, message: String(error?.message ?? error) } };
  }
}

const scenarios = {
  tool_loop: toolLoop,
  streamed,
  web_search: webSearch,
  reasoning,
  failure,
};

try {
  const out = await scenarios[process.env.AGENTS_SCENARIO]();
  process.stdout.write(JSON.stringify(out));
} catch (error) {
  process.stdout.write(
    JSON.stringify({ error: { name: error?.name, message: String(error?.message ?? error) } }),
  );
  process.exitCode = 3;
}

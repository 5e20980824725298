// The openai SDK and the Vercel AI SDK against Ferry: `node clients.mjs <check> <base url>`
// prints what the SDK parsed as one JSON line (tests/clients/test_node_clients.py reads it).
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, Output, streamText, tool, jsonSchema } from "ai";
import { z } from "zod";

const [check, url] = process.argv.slice(2);
const MODEL = "SmolLM2-135M-Instruct";
const MAX_TOKENS = 80;
const PERSON_PROMPT = "Add Ada, an admin from London.";
const WEATHER_PROMPT = "What is the weather in Paris?";

const Person = z
  .object({
    name: z.string().max(20),
    role: z.enum(["admin", "guest"]),
    address: z.object({ city: z.string().max(20) }).strict(),
  })
  .strict();
// Closed, as a small model needs (an open schema lets it add keys until max_tokens).
const WEATHER = {
  type: "object",
  properties: { city: { type: "string", maxLength: 20 } },
  required: ["city"],
  additionalProperties: false,
};

// The keys of each request's body, as the SDK sent it.
const sent = [];
const recording = async (input, init) => {
  if (init?.body) sent.push(Object.keys(JSON.parse(init.body)));
  return fetch(input, init);
};
const options = { baseURL: `${url}/v1`, apiKey: "unused", fetch: recording };
const client = new OpenAI({ ...options, maxRetries: 0 });
const provider = createOpenAI(options);
const weatherTool = () =>
  tool({
    description: "The current weather in a city.",
    inputSchema: jsonSchema(WEATHER),
    execute: async ({ city }) => `sunny in ${city}`,
  });

const checks = {
  // openai SDK: the zod model parsed from a json_schema answer.
  "openai-parse": async () => {
    const completion = await client.chat.completions.parse({
      model: MODEL,
      messages: [{ role: "user", content: PERSON_PROMPT }],
      response_format: zodResponseFormat(Person, "person"),
      max_tokens: MAX_TOKENS,
      temperature: 0,
    });
    return { output: completion.choices[0].message.parsed };
  },
  // openai SDK: a forced tool call streamed with the usage chunk, reassembled by the SDK.
  "openai-stream-tool": async () => {
    const stream = client.chat.completions.stream({
      model: MODEL,
      messages: [{ role: "user", content: WEATHER_PROMPT }],
      tools: [{ type: "function", function: { name: "get_weather", parameters: WEATHER } }],
      tool_choice: "required",
      stream: true,
      stream_options: { include_usage: true },
      max_tokens: MAX_TOKENS,
      temperature: 0,
    });
    let usage = null;
    for await (const chunk of stream) usage = chunk.usage ?? usage;
    const final = await stream.finalChatCompletion();
    const calls = final.choices[0].message.tool_calls.map((c) => ({
      name: c.function.name,
      arguments: JSON.parse(c.function.arguments),
    }));
    return { calls, usage: [usage.prompt_tokens, usage.completion_tokens] };
  },
  // AI SDK: a structured output on chat completions or the Responses API.
  "ai-object-chat": async () => aiObject(provider.chat(MODEL)),
  "ai-object-responses": async () => aiObject(provider.responses(MODEL)),
  // AI SDK: a forced tool call streamed; the SDK runs the tool and totals the usage.
  "ai-stream-tool": async () => {
    const result = streamText({
      model: provider.chat(MODEL),
      prompt: WEATHER_PROMPT,
      tools: { get_weather: weatherTool() },
      toolChoice: "required",
      maxOutputTokens: MAX_TOKENS,
      temperature: 0,
    });
    const calls = (await result.toolCalls).map((c) => ({ name: c.toolName, arguments: c.input }));
    const usage = await result.usage;
    return { calls, usage: [usage.inputTokens, usage.outputTokens] };
  },
  // AI SDK: a tool beside the output's format, both in one request.
  "ai-tool-beside-format": async () => {
    const result = await generateText({
      model: provider.chat(MODEL),
      prompt: WEATHER_PROMPT,
      tools: { get_weather: weatherTool() },
      toolChoice: "required",
      output: Output.object({ schema: Person }),
      maxOutputTokens: MAX_TOKENS,
      temperature: 0,
    });
    const calls = result.toolCalls.map((c) => ({ name: c.toolName, arguments: c.input }));
    return { calls };
  },
};

async function aiObject(model) {
  const result = await generateText({
    model,
    prompt: PERSON_PROMPT,
    output: Output.object({ schema: Person }),
    maxOutputTokens: MAX_TOKENS,
    temperature: 0,
  });
  return { output: result.output, usage: [result.usage.inputTokens, result.usage.outputTokens] };
}

console.log(JSON.stringify({ ...(await checks[check]()), sent }));

// Preloaded into the MCP conformance CLI (node --import), which has no option for a header:
// every request it makes carries Room's bearer credential from MCP_BEARER_TOKEN.
const original = globalThis.fetch;
globalThis.fetch = (input, init = {}) => {
  const headers = new Headers(init.headers ?? (input instanceof Request ? input.headers : undefined));
  headers.set("Authorization", `Bearer ${process.env.MCP_BEARER_TOKEN}`);
  return original(input, { ...init, headers });
};

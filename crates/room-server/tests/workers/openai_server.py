"""A local model API for the `openai` and `anthropic` adapters' tests: OpenAI-compatible chat
completions at /v1/chat/completions and the Anthropic Messages API at /v1/messages. It plays a
model by its first argument and logs every request (headers that matter and body, one JSON line
each) to the file named by its second; its port is its first stdout line.

- reply: room_sync, room_sync with the page's receipt as confirm, room_reply to the wake's first
  obligation, then an answer without tool calls (each completion reports its token usage);
- bad_args: a tool call whose arguments are not JSON, then an answer without tool calls;
- length: an answer cut at its token limit (finish_reason "length") with a half-written call;
- malformed: a 200 whose body is not JSON;
- truncated: a 200 that promises more bytes than it sends, then closes;
- status: a 401 with an error body;
- collab: a collaboration's role: room_sync and its confirm, task_claim of the wake's task,
  artifact_put of the kind its prompt says to write (a valid one of each core kind), room_done,
  then an answer without tool calls (each completion reports its token usage);
- steer: a collaboration's orchestrator (its wake names the collaboration for the collab_*
  tools): room_sync and its confirm, collab_status, collab_dispatch of every ready phase (or
  collab_close once all are done), room_sync again and room_reply to the wake (read through
  again while the room moved on), then an answer saying what it dispatched; any other wake
  is a role, as in collab mode;
- steer_announce: as steer, but the orchestrator only replies "noted" and ends its turn
  announcing a dispatch it never made.

In every mode it also serves embeddings at /v1/embeddings (a stand-in model: words on axes,
"defect", "fault" and "flaw" on the axis of "bug")."""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODE, LOG = sys.argv[1], sys.argv[2]
usage = {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107}


def calls(*named):
    return [{"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}} for i, (n, a) in enumerate(named)]


def answer(tool_calls=None, text=None):
    msg = {"role": "assistant", "content": text}
    if tool_calls:
        msg["tool_calls"] = tool_calls
    return {"id": "cmpl", "object": "chat.completion", "model": "test-model",
            "choices": [{"index": 0, "message": msg, "finish_reason": "tool_calls" if tool_calls else "stop"}],
            "usage": usage}


def wake_of(messages):
    user = next(m["content"] for m in messages if m["role"] == "user")
    return json.loads(user.split("The wake, as JSON:\n", 1)[1])


def messages_answer(messages):
    """The reply flow in the Messages API's shapes: tool_use blocks out, tool_result blocks in."""
    wake = wake_of(messages)
    room = wake["room"]
    made = [b for m in messages if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    usage = {"input_tokens": 50, "output_tokens": 5}

    def use(name, args):
        return {"type": "message", "role": "assistant", "stop_reason": "tool_use", "usage": usage,
                "content": [{"type": "text", "text": "working"},
                            {"type": "tool_use", "id": f"tu_{len(made)}", "name": name, "input": args}]}
    if not made:
        return use("room_sync", {"room": room})
    last = made[-1]
    result = messages[-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == last["id"], result
    if last["name"] == "room_sync" and "confirm" not in last["input"]:
        return use("room_sync", {"room": room, "confirm": json.loads(result["content"])["receipt"]})
    if last["name"] == "room_sync":
        return use("room_reply", {"room": room, "reply_to": wake["obligation_ids"][0], "text": "done"})
    return {"type": "message", "role": "assistant", "stop_reason": "end_turn", "usage": usage,
            "content": [{"type": "text", "text": "replied"}]}


def reply_mode(messages):
    wake = wake_of(messages)
    room = wake["room"]
    made = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    if not made:
        return answer(calls(("room_sync", json.dumps({"room": room}))))
    last = made[-1]["function"]
    result = json.loads(messages[-1]["content"])
    if last["name"] == "room_sync" and "confirm" not in json.loads(last["arguments"]):
        return answer(calls(("room_sync", json.dumps({"room": room, "confirm": result["receipt"]}))))
    if last["name"] == "room_sync":
        ob = wake["obligation_ids"][0]
        return answer(calls(("room_reply", json.dumps({"room": room, "reply_to": ob, "text": "done: " + wake["prompt"]}))))
    return answer(text="replied")


CANNED = {
    "findings": {"blocking": [], "non_blocking": [{"title": "say why it is verbose", "file": "greet.sh", "line": 2}],
                 "suggestions": []},
    "spec": {"title": "t", "goal": "g", "requirements": ["r"]},
    "research": {"summary": "s", "findings": [{"claim": "c", "source": "s"}]},
    "adr": {"title": "t", "status": "accepted", "context": "c", "decision": "d"},
}


def collab_mode(messages):
    """A role's flow; a call refused room_sync_required (another agent wrote meanwhile) is
    read through (room_sync and its confirm) and made again."""
    wake = wake_of(messages)
    room, task = wake["room"], wake["task"]
    prompt = wake["prompt"]
    seat = prompt.split("Write: findings with key ", 1)[1].split(" ", 1)[0] if "Write: findings with key " in prompt else None
    kind = "findings" if seat else prompt.split("\nWrite: ", 1)[1].split(" ", 1)[0]
    # each call with its result: the tool messages follow their completion in order (the ids
    # repeat across completions)
    made, results = [], [m["content"] for m in messages if m["role"] == "tool"]
    for m in messages:
        if m["role"] == "assistant":
            made.extend(c["function"] for c in m.get("tool_calls") or [])
    made = list(zip(made, results + [""] * (len(made) - len(results))))
    if not made:
        return answer(calls(("room_sync", json.dumps({"room": room}))))
    last, result = made[-1]
    if last["name"] == "room_sync" and "confirm" not in json.loads(last["arguments"]):
        return answer(calls(("room_sync", json.dumps({"room": room, "confirm": json.loads(result)["receipt"]}))))
    if "room_sync_required" in result:
        return answer(calls(("room_sync", json.dumps({"room": room}))))
    done = {f["name"] for f, r in made if not r.startswith("error[")}
    steps = [
        ("task_claim", {"task": task}),
        ("artifact_put", {"room": room, "kind": kind, "content": CANNED[kind], "expected_version": 0, "task": task}
         | ({"key": seat} if seat else {})),
        ("room_done", {"room": room, "task": task}),
    ]
    for name, args in steps:
        if name not in done:
            return answer(calls((name, json.dumps(args))))
    return answer(text="wrote " + kind)


def steer_mode(messages, announce_only):
    wake = wake_of(messages)
    if "for the collab_* tools" not in wake["prompt"]:
        return collab_mode(messages)
    room = wake["room"]
    made = [c["function"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    names = [c["name"] for c in made]
    sync = ("room_sync", json.dumps({"room": room}))
    reply = ("room_reply", json.dumps({"room": room, "reply_to": wake["obligation_ids"][0], "text": "noted"}))
    if not made:
        return answer(calls(sync))
    last, result = made[-1], messages[-1]["content"]
    if last["name"] == "room_sync" and "confirm" not in json.loads(last["arguments"]):
        return answer(calls(("room_sync", json.dumps({"room": room, "confirm": json.loads(result)["receipt"]}))))
    if last["name"] == "room_sync":
        if announce_only or "collab_status" in names:
            return answer(calls(reply))
        return answer(calls(("collab_status", json.dumps({"id": room}))))
    if last["name"] == "collab_status":
        status = json.loads(result)
        if status["ready"]:
            return answer(calls(*[("collab_dispatch", json.dumps({"id": room, "phase": p})) for p in status["ready"]]))
        if status["all_done"]:
            return answer(calls(("collab_close", json.dumps({"id": room}))))
        return answer(calls(sync))
    if last["name"] in ("collab_dispatch", "collab_close"):
        return answer(calls(sync))
    if last["name"] == "room_reply" and "room_sync_required" in result:
        return answer(calls(sync))
    if announce_only:
        return answer(text="Dispatching spec to reasoning now.")
    dispatched = [json.loads(c["arguments"])["phase"] for c in made if c["name"] == "collab_dispatch"]
    if dispatched:
        return answer(text="Dispatched " + " and ".join(dispatched) + ".")
    return answer(text="Nothing new to dispatch: waiting.")


# A stand-in embeddings model (any mode, at /v1/embeddings): each word on an axis of its own,
# a few words meaning the same on one axis, so a search for one finds the others.
SAME = {"defect": "bug", "fault": "bug", "flaw": "bug", "meal": "lunch", "dinner": "lunch"}
DIMS = 32


def embed_one(text):
    import hashlib
    v = [0.0] * DIMS
    for w in "".join(c if c.isalnum() else " " for c in text.lower()).split():
        w = SAME.get(w, w)
        v[int(hashlib.sha256(w.encode()).hexdigest(), 16) % DIMS] += 1.0
    return v


def embeddings(body):
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    return {"object": "list", "model": body.get("model"),
            "data": [{"object": "embedding", "index": i, "embedding": embed_one(t)} for i, t in enumerate(texts)],
            "usage": {"prompt_tokens": 0, "total_tokens": 0}}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def send(self, code, body, length=None):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open(LOG, "a") as f:
            f.write(json.dumps({"path": self.path, "auth": self.headers.get("Authorization"),
                                "x_api_key": self.headers.get("x-api-key"),
                                "anthropic_version": self.headers.get("anthropic-version"), "body": body}) + "\n")
        if self.path == "/v1/embeddings":
            return self.send(200, json.dumps(embeddings(body)).encode())
        if self.path == "/v1/messages" and MODE == "reply":
            return self.send(200, json.dumps(messages_answer(body["messages"])).encode())
        if self.path not in ("/v1/chat/completions", "/v1/messages"):
            return self.send(404, b'{"error": "no such path"}')
        if MODE == "reply":
            return self.send(200, json.dumps(reply_mode(body["messages"])).encode())
        if MODE == "collab":
            return self.send(200, json.dumps(collab_mode(body["messages"])).encode())
        if MODE in ("steer", "steer_announce"):
            return self.send(200, json.dumps(steer_mode(body["messages"], MODE == "steer_announce")).encode())
        if MODE == "bad_args":
            if body["messages"][-1]["role"] == "tool":
                return self.send(200, json.dumps(answer(text="gave up")).encode())
            return self.send(200, json.dumps(answer(calls(("room_sync", "{not json")))).encode())
        if MODE == "length":
            cut = answer(calls(("room_reply", '{"room": "coord", "reply_to": "obl_x", "te')))
            cut["choices"][0]["finish_reason"] = "length"
            return self.send(200, json.dumps(cut).encode())
        if MODE == "malformed":
            return self.send(200, b'{"choices": [')
        if MODE == "truncated":
            self.send(200, b'{"choices": [{"message": {"role"', length=4096)
            self.close_connection = True
            return
        return self.send(401, b'{"error": {"message": "invalid api key"}}')


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()

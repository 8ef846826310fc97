"""Room's MCP server driven by the official MCP Python SDK client (PyPI `mcp`), over stdio
(`room mcp`) and streamable HTTP (`/mcp` on the daemon), in both protocol generations the client
speaks (`auto`: 2026-07-28 sessionless after `server/discover`; `legacy`: `initialize`).

Run by scripts/test with the venv it creates: python tests/mcp/test_mcp.py path/to/room
Prints 'N passed, N failed' and exits non-zero on any failure."""

import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import traceback
import uuid

import warnings

import httpx2
import mcp.types as types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

ROOM = os.path.abspath(sys.argv[1])
# The SDK warns when rmcp answers a session DELETE with 202 instead of 200/204: harmless noise.
logging.basicConfig(level=logging.ERROR)
ALL_TOOLS = {
    "room_whoami", "room_list", "room_sync", "room_note", "room_say", "room_reply", "room_send",
    "room_handoff", "room_done", "room_blocked", "room_decline", "room_circle", "room_search", "task_create",
    "task_claim", "task_show", "task_accept_check", "task_amend", "task_supersede", "task_cancel", "task_delegate", "task_propose", "room_compose", "source_read",
    "evidence_register", "op_begin", "op_effect", "op_resolve", "room_cancel", "room_wake_take", "room",
}


class Fixture:
    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="room-mcp-")
        root = os.path.realpath(self.tmp.name)
        self.state = os.path.join(root, "state")
        self.env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(root, "config"), ROOM_LOG="error", NO_COLOR="1")
        self.env.pop("ROOM_TOKEN", None)
        self.run("init")
        self.daemon = subprocess.Popen([ROOM, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0"], env=self.env)
        addr = os.path.join(self.state, "http.addr")
        for _ in range(500):
            if os.path.exists(addr) and open(addr).read().strip():
                break
            time.sleep(0.01)
        self.url = "http://" + open(addr).read().strip() + "/mcp"

    def run(self, *args, check=True):
        out = subprocess.run([ROOM, "--state-dir", self.state, "--json", *args], env=self.env, capture_output=True, text=True)
        if check and out.returncode != 0:
            raise AssertionError(f"room {' '.join(args)} failed: {out.stderr}")
        return json.loads(out.stdout) if out.stdout.strip() else None

    def enroll(self, name, host="generic", tier=None):
        args = ["agent", "enroll", name, "--host", host] + (["--max-tier", tier] if tier else [])
        return self.run(*args)["token"]

    def journal_lines(self):
        total = 0
        rooms = os.path.join(self.state, "rooms")
        for d in os.listdir(rooms):
            p = os.path.join(rooms, d, "EVENTS.jsonl")
            if os.path.exists(p):
                total += sum(1 for _ in open(p))
        return total

    def close(self):
        self.daemon.terminate()
        self.daemon.wait(timeout=10)
        self.tmp.cleanup()


def stdio(fx, token, tools="full"):
    env = dict(fx.env, ROOM_TOKEN=token)
    return StdioServerParameters(command=ROOM, args=["mcp", "--state-dir", fx.state, "--tools", tools], env=env)


class Http:
    def __init__(self, url, token):
        self.http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"})
        self.url = url

    def transport(self):
        return streamable_http_client(self.url, http_client=self.http)


def refusal(r):
    assert r.is_error, f"expected a refusal, got {r.structured_content}"
    return r.structured_content["refusal"]


async def catch_up(client, room, meta=None):
    confirm = None
    while True:
        args = {"room": room} | ({"confirm": confirm} if confirm else {})
        r = await client.call_tool("room_sync", args, meta=meta)
        assert not r.is_error, r.structured_content
        page = r.structured_content
        if not page["items"]:
            return
        confirm = page["receipt"]


async def gate_flow(client, fx, name):
    """A blind write is refused with the next page; confirming it opens the gate."""
    tools = await client.list_tools()
    assert {t.name for t in tools.tools} == ALL_TOOLS, [t.name for t in tools.tools]
    assert all(t.input_schema and t.output_schema for t in tools.tools)
    before = fx.journal_lines()
    r = await client.call_tool("room_say", {"room": "lobby", "text": f"hello from {name}"})
    ref = refusal(r)
    assert ref["code"] == "room_sync_required", ref
    assert fx.journal_lines() == before, "the refused call wrote nothing"
    page = ref["detail"]["next_page"]
    assert "read_through" in ref["hint"], ref["hint"]
    if page["more"]:
        await catch_up(client, "lobby")
        args = {}
    else:
        # read and act in one call: the refusal's page, presented with the retry
        args = {"read_through": page["receipt"]}
    r = await client.call_tool("room_say", {"room": "lobby", "text": f"hello from {name}"} | args)
    assert not r.is_error, r.structured_content
    assert r.structured_content["verb"] == "say"
    assert fx.journal_lines() == before + 1
    assert "error[" not in r.content[0].text
    # a page read as an MCP result (text and structuredContent) stays within 24 KiB
    r = await client.call_tool("room_say", {"room": "lobby", "text": "é" * 9000})
    assert not r.is_error, r.structured_content
    r = await client.call_tool("room_sync", {"room": "lobby"})
    size = len(r.model_dump_json(by_alias=True, exclude_none=True).encode())
    assert size <= 24 * 1024, f"a sync result takes {size} bytes"
    before += 1
    # so does a composed page, however much the rooms hold
    for i in range(12):
        r = await client.call_tool("room_note", {"room": "lobby", "text": f"{i} " + "ü" * 700})
        assert not r.is_error, r.structured_content
    before += 12
    r = await client.call_tool("room_compose", {"rooms": ["lobby"], "limit": 200})
    assert not r.is_error, r.structured_content
    size = len(r.model_dump_json(by_alias=True, exclude_none=True).encode())
    assert size <= 24 * 1024, f"a composed page takes {size} bytes"
    # a receipt that is not a receipt names its field
    r = await client.call_tool("room_say", {"room": "lobby", "text": "x", "read_through": "rcpt_nope"})
    assert refusal(r)["code"] == "invalid_argument" and refusal(r)["detail"]["field"] == "read_through"
    assert fx.journal_lines() == before + 1


async def denied_on_both_routes(client, fx, name):
    fx.run("agent", "policy", name, "--deny", "note")
    before = fx.journal_lines()
    r = await client.call_tool("room_note", {"room": "lobby", "text": "status"})
    assert refusal(r)["code"] == "verb_denied"
    r = await client.call_tool("room", {"action": "note", "room": "lobby", "text": "status"})
    assert refusal(r)["code"] == "verb_denied"
    assert fx.journal_lines() == before
    fx.run("agent", "policy", name, "--allow", "note")
    r = await client.call_tool("room", {"action": "note", "room": "lobby", "text": "status"})
    assert not r.is_error, r.structured_content


async def actor_and_bad_args(client, fx, name):
    before = fx.journal_lines()
    r = await client.call_tool("room_say", {"room": "lobby", "text": "x", "actor": "someone-else"})
    assert refusal(r)["code"] == "actor_mismatch"
    r = await client.call_tool("room_say", {"room": "lobby", "text": 5})
    assert refusal(r)["code"] == "invalid_argument"
    r = await client.call_tool("room_say", {"room": "lobby", "text": "x", "bogus": 1})
    assert refusal(r)["code"] == "invalid_argument"
    r = await client.call_tool("room_say", {"room": "../etc", "text": "x"})
    assert refusal(r)["code"] == "invalid_argument"
    r = await client.call_tool("room_note", {"room": "lobby", "text": "x" * ((1 << 20) + 1)})
    assert refusal(r)["code"] == "payload_too_large"
    try:
        r = await client.call_tool("no_such_tool", {})
        assert r.is_error, "an unknown tool is an error"
    except Exception:
        pass  # a JSON-RPC error is as good
    assert fx.journal_lines() == before


async def idempotent_retry(client, fx, name):
    """A retry with the same idempotency key is refused as a repeat naming the first event."""
    key = f"retry-{uuid.uuid4()}"
    args = {"room": "lobby", "text": "build 42 passed", "idempotency_key": key}
    first = await client.call_tool("room_note", args)
    assert not first.is_error, first.structured_content
    before = fx.journal_lines()
    ref = refusal(await client.call_tool("room_note", args))
    assert ref["code"] == "invariant_violation", ref
    assert ref["detail"]["invariant"] == "exactly_once", ref
    assert ref["detail"]["original_event"] == first.structured_content["event"], ref
    assert fx.journal_lines() == before + 1, "only the violation record is written"


async def conversation_binding(client, fx, name):
    """The conversation comes from _meta (codex: threadId), never from arguments."""
    t1, t2 = str(uuid.uuid4()), str(uuid.uuid4())
    await catch_up(client, "lobby", meta={"threadId": t1})
    r = await client.call_tool("room_note", {"room": "lobby", "text": "in thread one"}, meta={"threadId": t1})
    assert not r.is_error, r.structured_content
    r = await client.call_tool("room_note", {"room": "lobby", "text": "in thread two"}, meta={"threadId": t2})
    assert refusal(r)["code"] == "room_sync_required", "a second conversation has its own checkpoint"
    r = await client.call_tool("room_note", {"room": "lobby", "text": "x"}, meta={"threadId": "not-a-uuid"})
    ref = refusal(r)
    assert ref["code"] == "invalid_argument" and "threadId" in ref["message"], ref
    r = await client.call_tool("room_whoami", {}, meta={"threadId": t1})
    assert r.structured_content["conversation"] == f"codex:{t1}"


async def revoked_mid_session(client, fx, name, http):
    r = await client.call_tool("room_whoami", {})
    assert not r.is_error and r.structured_content["agent"] == name
    fx.run("agent", "revoke", name)
    try:
        r = await client.call_tool("room_whoami", {})
    except Exception:
        assert http, "over stdio the refusal is a tool result"
        return
    assert not http, "over HTTP a revoked token gets 401"
    assert refusal(r)["code"] == "credential_revoked"


async def with_client(target, fn, *args):
    async with Client(target, mode=args[-1]) as client:
        await fn(client, *args[:-1])


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def setup_room(fx, agents, host="generic"):
    tokens = {a: fx.enroll(a, host=host) for a in agents}
    fx.run("create", "lobby", *sum((["--member", a] for a in agents), []))
    return tokens


for mode in ("auto", "legacy"):
    for transport in ("stdio", "http"):

        def make(mode=mode, transport=transport):
            async def body(fx):
                host = "codex"
                tokens = setup_room(fx, ["alpha", "beta"], host=host)
                tok = tokens["alpha"]
                h = Http(fx.url, tok) if transport == "http" else None

                def target():
                    return h.transport() if h else stdio(fx, tok)

                # one session throughout: over stdio each `room mcp` process is its own conversation
                async with Client(target(), mode=mode) as client:
                    for fn in (gate_flow, denied_on_both_routes, actor_and_bad_args, idempotent_retry, conversation_binding):
                        await fn(client, fx, "alpha")
                    await revoked_mid_session(client, fx, "alpha", transport == "http")

            body.__name__ = f"{transport}_{mode}_gate_policy_conversation_revocation"
            return body

        test(make())


@test
async def room_cancel_needs_operator_standing_and_an_operator_cancels(fx):
    """Control standing comes from the credential: a member that says it acts for the operator
    is refused (nothing written); an operator-tier member cancels, and its queued wake dies."""
    toks = {"alpha": fx.enroll("alpha"), "ops": fx.enroll("ops", tier="operator")}
    fx.run("create", "lobby", "--member", "alpha", "--member", "ops")
    async with Client(stdio(fx, toks["alpha"]), mode="auto") as alpha, Client(stdio(fx, toks["ops"]), mode="auto") as ops:
        await catch_up(alpha, "lobby")
        sent = await alpha.call_tool("room_send", {"room": "lobby", "text": "please", "to": ["ops"]})
        assert not sent.is_error, sent.structured_content
        before = fx.journal_lines()
        ref = refusal(await alpha.call_tool("room_cancel", {"room": "lobby", "by": "operator"}))
        assert ref["code"] == "control_standing_required", ref
        assert fx.journal_lines() == before, "the refused cancel wrote nothing"
        r = await ops.call_tool("room_cancel", {"room": "lobby", "by": "release manager"})
        assert not r.is_error, r.structured_content
        assert r.structured_content["actor"] == "ops" and r.structured_content["dead_lettered"] == 1
        assert fx.journal_lines() == before + 1
    wakes = fx.run("wakes", "list")["wakes"]
    assert [w["state"] for w in wakes] == ["dead"], wakes


@test
async def delegation_and_cancellation_have_their_own_tools_and_refusals_change_nothing(fx):
    """task_delegate is task_create under a parent, with its lineage checks; task_cancel settles
    a task its owner withdraws, once, and a refused call writes nothing."""
    toks = {"alpha": fx.enroll("alpha", tier="coordinator"), "beta": fx.enroll("beta")}
    fx.run("create", "lobby", "--member", "alpha", "--member", "beta")
    async with Client(stdio(fx, toks["alpha"]), mode="auto") as alpha, Client(stdio(fx, toks["beta"]), mode="auto") as beta:
        made = await alpha.call_tool("task_create", {"room": "lobby", "title": "p", "to": "beta", "scopes": ["file:src"]})
        parent = made.structured_content["task"]["id"]
        child = await alpha.call_tool("task_delegate", {"room": "lobby", "title": "c", "parent": parent, "scopes": ["file:src/a.rs"]})
        assert not child.is_error and child.structured_content["task"]["parent"] == parent, child.structured_content
        for client, tool, args, code in [
            (alpha, "task_delegate", {"room": "lobby", "title": "w", "parent": parent, "scopes": ["file:docs"]}, "task_scope_widened"),
            (alpha, "task_delegate", {"room": "lobby", "title": "orphan"}, "invalid_argument"),
            (beta, "task_cancel", {"task": parent}, "tier_insufficient"),
            (alpha, "task_cancel", {"task": parent, "reason": ""}, "invalid_argument"),
        ]:
            before = fx.journal_lines()
            got = refusal(await client.call_tool(tool, args))["code"]
            assert got == code, f"{tool} {args}: {got} != {code}"
            assert fx.journal_lines() == before, f"{tool}: refused call changed the journal"
        r = await alpha.call_tool("task_cancel", {"task": parent, "reason": "moot"})
        assert not r.is_error and r.structured_content["status"] == "cancelled", r.structured_content
        before = fx.journal_lines()
        assert refusal(await alpha.call_tool("task_cancel", {"task": parent}))["code"] == "task_state_invalid"
        assert fx.journal_lines() == before


@test
async def the_blackboard_tools_are_listed_per_scope_and_fenced(fx):
    """artifact_put, artifact_get and artifact_index are listed to a delegated principal whose
    scopes allow each (an ordinary agent pays nothing for them); a write lands as a version, a
    stale one, a kind outside the scopes and a read without a read scope are refused, and a
    refused call writes nothing."""
    def delegate(name, parent, *scopes):
        args = ["agent", "delegate", name, "--max-tier", "member"] + (["--parent", parent] if parent else [])
        return fx.run(*args, *sum((["--scope", s] for s in scopes), []))["token"]

    orch = delegate("orch", None, "session:read", "session:dispatch")
    writer = delegate("writer", "orch", "artifact:write:spec", "artifact:read:spec")
    implementer = delegate("implementer", "orch", "artifact:write:diff", "project:write")
    plain = fx.enroll("plain")
    fx.run("create", "collab", "--member", "orch", "--member", "writer", "--member", "plain", "--member", "implementer")
    spec = {"title": "t", "goal": "g", "requirements": ["r"]}
    async with Client(stdio(fx, orch), mode="auto") as o, Client(stdio(fx, writer), mode="auto") as w, \
            Client(stdio(fx, plain), mode="auto") as p:
        names = lambda listed: {t.name for t in listed.tools}
        blackboard = {"artifact_put", "artifact_get", "artifact_index"}
        assert names(await o.list_tools()) & blackboard == {"artifact_index"}
        assert names(await w.list_tools()) & blackboard == blackboard
        assert names(await p.list_tools()) == ALL_TOOLS
        # diff_from_tree is listed to a role that writes the diff and the project; outside a
        # collaboration with working trees it has no tree to take from, and writes nothing
        async with Client(stdio(fx, implementer), mode="auto") as i:
            assert "diff_from_tree" in names(await i.list_tools())
            assert "diff_from_tree" not in names(await w.list_tools())
            await catch_up(i, "collab")
            before = fx.journal_lines()
            got = refusal(await i.call_tool("diff_from_tree", {"room": "collab", "expected_version": 0}))
            assert got["code"] == "invalid_argument" and got["detail"]["field"] == "room", got
            assert fx.journal_lines() == before
        await catch_up(w, "collab")
        r = await w.call_tool("artifact_put", {"room": "collab", "kind": "spec", "content": spec, "expected_version": 0})
        assert not r.is_error, r.structured_content
        for client, tool, args, code in [
            (w, "artifact_put", {"room": "collab", "kind": "spec", "content": spec, "expected_version": 0}, "artifact_version_conflict"),
            (w, "artifact_put", {"room": "collab", "kind": "adr", "content": {}, "expected_version": 0}, "artifact_write_denied"),
            (w, "artifact_put", {"room": "collab", "kind": "spec", "content": {"title": "t"}, "expected_version": 1}, "artifact_schema_invalid"),
            (o, "artifact_get", {"room": "collab", "kind": "spec"}, "artifact_read_denied"),
            (o, "artifact_put", {"room": "collab", "kind": "spec", "content": spec, "expected_version": 1}, "artifact_write_denied"),
        ]:
            before = fx.journal_lines()
            got = refusal(await client.call_tool(tool, args))["code"]
            assert got == code, f"{tool} {args}: {got} != {code}"
            assert fx.journal_lines() == before, f"{tool}: refused call changed the journal"
        index = (await o.call_tool("artifact_index", {"room": "collab"})).structured_content
        assert [(a["kind"], a["version"], a["producer"]) for a in index["artifacts"]] == [("spec", 1, "writer")], index
        got = (await w.call_tool("artifact_get", {"room": "collab", "kind": "spec"})).structured_content
        assert got["content"] == spec and got["version"] == 1, got


@test
async def evidence_the_ledger_and_a_dry_run_of_acceptance_through_their_tools(fx):
    """evidence_register, task_accept_check and op_begin/op_effect/op_resolve as a host calls
    them; a second claim on the held scope is lease_conflict and writes only its record."""
    toks = {"alpha": fx.enroll("alpha", tier="coordinator"), "beta": fx.enroll("beta"), "gamma": fx.enroll("gamma")}
    fx.run("create", "lobby", "--member", "alpha", "--member", "beta", "--member", "gamma")
    async with Client(stdio(fx, toks["alpha"]), mode="auto") as alpha, Client(stdio(fx, toks["beta"]), mode="auto") as beta, \
            Client(stdio(fx, toks["gamma"]), mode="auto") as gamma:
        def made(r):
            assert not r.is_error, r.structured_content
            return r.structured_content
        accept = [{"kind": "evidence_origins", "req": "R1", "min": 1}]
        task = made(await alpha.call_tool("task_create", {"room": "lobby", "title": "pay", "to": "beta", "scopes": ["api:stripe"], "accept": accept}))["task"]["id"]
        rival = made(await alpha.call_tool("task_create", {"room": "lobby", "title": "also pay", "to": "gamma", "scopes": ["api:stripe"]}))["task"]["id"]
        made(await beta.call_tool("task_claim", {"task": task}))
        before = fx.journal_lines()
        ref = refusal(await gamma.call_tool("task_claim", {"task": rival}))
        assert ref["code"] == "lease_conflict" and ref["detail"]["conflicts"][0]["holder"] == "beta", ref
        assert fx.journal_lines() == before + 1, "only the exclusive record"
        first = made(await beta.call_tool("task_accept_check", {"task": task}))["acceptance_results"][0]
        assert first["pass"] is False, first
        made(await beta.call_tool("evidence_register", {"room": "lobby", "task": task, "req": "R1", "origin": "url:https://example.com/pricing"}))
        second = made(await beta.call_tool("task_accept_check", {"task": task}))["acceptance_results"][0]
        assert second["pass"] is True, second
        op = made(await beta.call_tool("op_begin", {"room": "lobby", "task": task, "destination": "api:stripe"}))["op"]
        made(await beta.call_tool("op_effect", {"room": "lobby", "op": op}))
        resolved = made(await beta.call_tool("op_resolve", {"room": "lobby", "op": op, "outcome": "succeeded"}))
        assert resolved["op"] == op, resolved


@test
async def an_unrouted_agent_takes_its_wake_in_its_own_session_and_its_reply_proves_it(fx):
    """Without a route, a permit waits for its agent's own session: beta's MCP session takes it
    (the prompt and obligation come back), a second take while it is live is refused
    wake_not_takeable (nothing written), and beta's reply from that same session ends the
    launch replied."""
    toks = setup_room(fx, ["alpha", "beta"])
    async with Client(stdio(fx, toks["alpha"]), mode="auto") as alpha, Client(stdio(fx, toks["beta"]), mode="auto") as beta:
        await catch_up(alpha, "lobby")
        sent = await alpha.call_tool("room_send", {"room": "lobby", "text": "check the build", "to": ["beta"]})
        assert not sent.is_error, sent.structured_content
        r = await beta.call_tool("room_wake_take", {})
        assert not r.is_error, r.structured_content
        taken = r.structured_content["taken"]
        assert taken["prompt"] == "check the build" and taken["proof"] == "delivered_to_body", taken
        before = fx.journal_lines()
        ref = refusal(await beta.call_tool("room_wake_take", {"room": "lobby"}))
        assert ref["code"] == "wake_not_takeable", ref
        assert fx.journal_lines() == before, "the refused take wrote nothing"
        await catch_up(beta, "lobby")
        reply = await beta.call_tool("room_reply", {"room": "lobby", "reply_to": taken["obligation_ids"][0], "text": "green"})
        assert not reply.is_error, reply.structured_content

        def replied():
            w = fx.run("wakes", "list")["wakes"][0]
            return w["state"] == "replied" and w["launches"][0]["outcome"] == "replied"

        await wait_for(replied, "the taken wake ends replied")


@test
async def task_propose_applies_a_change_with_its_version_moved_by_one_and_refusals_change_nothing(fx):
    """A worker's change to a projected source, through the official SDK: applied by the daemon
    (version 1 -> 2), then refused with proposal_version_conflict and proposal_withheld, the
    refused calls writing nothing; the multiplexer reaches the same verb."""
    import hashlib
    toks = {"alpha": fx.enroll("alpha", tier="coordinator"), "beta": fx.enroll("beta")}
    proj = os.path.join(os.path.dirname(fx.state), "project")
    os.makedirs(proj)
    data = os.path.join(proj, "data.json")
    with open(data, "w") as fh:
        fh.write('[{"id": 1, "v": 1, "name": "a", "secret": "s"}]')
    pid = fx.run("project", "open", proj)["id"]
    fx.run("create", "build", "--project", pid, "--member", "alpha", "--member", "beta")
    digest = hashlib.sha256(open(data, "rb").read()).hexdigest()
    stage = [{"path": "data.json", "sha256": digest,
              "project": {"format": "json", "key": "id", "version": "v", "columns": ["name"]}}]
    async with Client(stdio(fx, toks["alpha"]), mode="auto") as alpha, Client(stdio(fx, toks["beta"]), mode="auto") as beta:
        t = await alpha.call_tool("task_create", {"room": "build", "title": "rename", "to": "beta", "stage": stage})
        assert not t.is_error, t.structured_content
        task = t.structured_content["task"]["id"]
        c = await beta.call_tool("task_claim", {"task": task})
        assert not c.is_error, c.structured_content
        change = {"task": task, "path": "data.json", "key": "1", "version": 1, "set": {"name": "z"}}
        r = await beta.call_tool("task_propose", change)
        assert not r.is_error, r.structured_content
        assert r.structured_content["to_version"] == 2, r.structured_content
        assert json.load(open(data)) == [{"id": 1, "v": 2, "name": "z", "secret": "s"}]
        before = fx.journal_lines()
        ref = refusal(await beta.call_tool("task_propose", change))
        assert ref["code"] == "proposal_version_conflict", ref
        ref = refusal(await beta.call_tool("room", dict(change, action="task_propose", version=2, set={"secret": "x"})))
        assert ref["code"] == "proposal_withheld", ref
        assert fx.journal_lines() == before, "the refused proposals wrote nothing"
        r = await beta.call_tool("room", dict(change, action="task_propose", version=2, set={"name": "y"}))
        assert not r.is_error, r.structured_content
        assert json.load(open(data))[0]["v"] == 3


@test
async def compact_mode_lists_two_tools_and_sizes_are_reported(fx):
    tok = setup_room(fx, ["alpha"])["alpha"]
    sizes = {}
    for tools, url in (("full", fx.url), ("compact", fx.url.replace("/mcp", "/mcp-compact"))):
        async with Client(stdio(fx, tok, tools), mode="legacy") as client:
            listed = await client.list_tools()
            names = {t.name for t in listed.tools}
            sizes[tools] = len(json.dumps([t.model_dump(exclude_none=True, by_alias=True) for t in listed.tools]))
        async with Client(Http(url, tok).transport(), mode="legacy") as client:
            assert {t.name for t in (await client.list_tools()).tools} == names
        if tools == "compact":
            assert names == {"room_sync", "room"}, names
            async with Client(stdio(fx, tok, tools), mode="auto") as client:
                await catch_up(client, "lobby")
                r = await client.call_tool("room", {"action": "say", "room": "lobby", "text": "compact works"})
                assert not r.is_error, r.structured_content
    print(f"    tool definitions: full {sizes['full']} bytes (~{sizes['full'] // 4} tokens), compact {sizes['compact']} bytes (~{sizes['compact'] // 4} tokens)")


@test
async def http_without_or_with_a_bad_token_is_401(fx):
    setup_room(fx, ["alpha"])
    body = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    async with httpx2.AsyncClient() as http:
        for headers in ({}, {"Authorization": "Bearer room_tok_" + "0" * 64}, {"Authorization": "Basic abc"}):
            r = await http.post(fx.url, json=body, headers=headers | {"Accept": "application/json, text/event-stream"})
            assert r.status_code == 401, (headers, r.status_code)
        tok = fx.enroll("mallory")
        r = await http.post(fx.url, json=body, headers={"Authorization": f"Bearer {tok}", "Accept": "application/json, text/event-stream", "Host": "evil.example:80"})
        assert r.status_code == 403, f"a foreign Host header is refused (DNS rebinding): {r.status_code}"


@test
async def malformed_wire_input_gets_protocol_errors_and_the_daemon_stays_up(fx):
    tok = setup_room(fx, ["alpha"])["alpha"]
    hdr = {"Authorization": f"Bearer {tok}", "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    before = fx.journal_lines()
    async with httpx2.AsyncClient() as http:
        for raw in (b"{not json", b"[]", b"[1,2,3]", b'{"jsonrpc":"2.0","id":1}', b"\xff\xfe", b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":5}'):
            r = await http.post(fx.url, content=raw, headers=hdr)
            assert 400 <= r.status_code < 500, (raw, r.status_code, r.text[:200])
        big = b'{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"x":"' + b"a" * (3 << 20) + b'"}}'
        r = await http.post(fx.url, content=big, headers=hdr)
        assert r.status_code in (400, 413), r.status_code
        # many sessions at once: each is served or cleanly refused, none crashes the daemon
        async def one():
            async with Client(Http(fx.url, tok).transport(), mode="legacy") as client:
                await client.list_tools()
        await asyncio.gather(*(one() for _ in range(40)))
    assert fx.journal_lines() == before
    assert fx.daemon.poll() is None, "the daemon is still running"
    async with Client(Http(fx.url, tok).transport(), mode="auto") as client:
        assert not (await client.call_tool("room_whoami", {})).is_error


@test
async def every_refusal_over_mcp_changes_nothing(fx):
    """Each refusal an agent can meet over MCP, on both transports: the exact code, and the
    journals, task and wake queue unchanged."""
    toks = {a: fx.enroll(a, tier=("coordinator" if a == "alpha" else None)) for a in ("alpha", "beta", "gamma")}
    proj = os.path.join(os.path.dirname(fx.state), "proj")
    os.makedirs(proj)
    pid = fx.run("project", "open", proj)["id"]
    fx.run("create", "lobby", "--member", "alpha", "--member", "beta")
    fx.run("create", "build", "--project", pid, "--member", "alpha", "--member", "beta")
    fx.run("create", "other", "--member", "alpha")
    fx.run("create", "private", "--member", "gamma")

    def state():
        wakes = fx.run("wakes", "list")["wakes"]
        return fx.journal_lines(), len(wakes)

    for transport in ("stdio", "http"):
        h = {a: Http(fx.url, t) for a, t in toks.items()}

        def target(a):
            return h[a].transport() if transport == "http" else stdio(fx, toks[a])

        async with Client(target("alpha"), mode="auto") as alpha, Client(target("beta"), mode="auto") as beta:
            for c in (alpha, beta):
                for room in ("lobby", "build"):
                    await catch_up(c, room)
            await catch_up(alpha, "other")
            task = (await alpha.call_tool("task_create", {"room": "build", "title": "t", "to": "beta"})).structured_content["task"]["id"]
            other_ev = (await alpha.call_tool("room_note", {"room": "other", "text": "elsewhere"})).structured_content["event"]
            sent = await alpha.call_tool("room_send", {"room": "lobby", "text": "one", "to": ["beta"]})
            assert not sent.is_error, sent.structured_content
            sent2 = await alpha.call_tool("room_say", {"room": "lobby", "text": "two @beta"})
            obl = sent.structured_content["obligations"][0]["id"]
            for c in (alpha, beta):
                await catch_up(c, "lobby")
                await catch_up(c, "build")
            cases = [
                (beta, "task_create", {"room": "build", "title": "x"}, "tier_insufficient"),
                (alpha, "room_sync", {"room": "private"}, "room_not_member"),
                (alpha, "room_sync", {"room": "nowhere"}, "room_not_found"),
                (alpha, "room_note", {"room": "lobby", "text": "hi @beta"}, "note_mentions_refused"),
                (alpha, "room_say", {"room": "lobby", "text": "x", "task": task}, "say_task_refused"),
                (alpha, "room_send", {"room": "build", "text": "x", "to": ["beta"]}, "send_task_required"),
                (alpha, "room_send", {"room": "lobby", "text": "x", "to": ["beta"], "evidence": [other_ev]}, "cross_room_evidence_refused"),
                (alpha, "room_send", {"room": "lobby", "text": "x", "to": ["beta"], "audience": ["alpha"]}, "audience_excludes_recipient"),
                (alpha, "room_reply", {"room": "lobby", "text": "x", "reply_to": sent2.structured_content["event"]}, "reply_target_not_addressed"),
                (beta, "room_say", {"room": "lobby", "text": "which one?"}, "say_reply_target_ambiguous"),
                (alpha, "room_done", {"room": "build"}, "task_required"),
                (alpha, "room_done", {"room": "build", "task": "tsk_0000000000000000"}, "task_not_found"),
                (alpha, "room_done", {"room": "build", "task": task}, "task_not_held"),
                (beta, "room_done", {"room": "build", "task": task}, "task_state_invalid"),
                (beta, "room_circle", {"room": "lobby", "obligation": obl}, "obligation_not_found"),
                (alpha, "room_sync", {"room": "lobby", "confirm": "rcpt_" + "0" * 32}, "receipt_unknown"),
                (alpha, "task_show", {"task": "nonsense"}, "invalid_argument"),
            ]
            for client, tool, args, code in cases:
                before = state()
                r = await client.call_tool(tool, args)
                got = refusal(r)["code"]
                assert got == code, f"{transport} {tool} {args}: {got} != {code}"
                assert state() == before, f"{transport} {tool}: refused call changed state"
            # policy that cannot be loaded: nothing runs, nothing leaves
            cfg = os.path.join(fx.state, "config.toml")
            good = open(cfg).read()
            open(cfg, "w").write(good + '\n[redaction]\npatterns = ["("]\n' if "[redaction]" not in good else good.replace("patterns = []", 'patterns = ["("]'))
            before = state()
            r = await alpha.call_tool("room_note", {"room": "lobby", "text": "withheld?"})
            assert refusal(r)["code"] == "tool_result_withheld"
            assert state() == before
            open(cfg, "w").write(good)
            # secrets never leave: a token in a message is redacted on the way out
            secret = "room_tok_" + "ab" * 32
            r = await alpha.call_tool("room_note", {"room": "lobby", "text": f"leak {secret}"})
            assert not r.is_error
            page = (await beta.call_tool("room_sync", {"room": "lobby"})).structured_content
            assert secret not in json.dumps(page) and "[redacted]" in json.dumps(page)
            # a note for an audience: beta never reads it, and is not held up by it
            r = await alpha.call_tool("room_note", {"room": "lobby", "text": "alpha alone", "audience": ["alpha"]})
            assert not r.is_error and r.structured_content["audience"] == ["alpha"], r.structured_content
            page = (await beta.call_tool("room_sync", {"room": "lobby"})).structured_content
            assert "alpha alone" not in json.dumps(page) and page["to_seq"] == page["tip_seq"], page
            for c in (alpha, beta):
                await catch_up(c, "lobby")
        # clear beta's open items for the next transport round
        async with Client(target("beta"), mode="auto") as beta:
            await catch_up(beta, "lobby")
            for item in (await beta.call_tool("room_sync", {"room": "lobby"})).structured_content["open_items"]:
                r = await beta.call_tool("room_reply", {"room": "lobby", "text": "ok", "reply_to": item["id"]})
                assert not r.is_error, r.structured_content


@test
async def bridges_started_together_share_one_daemon(fx):
    tok = setup_room(fx, ["alpha"])["alpha"]
    fx.daemon.terminate()
    fx.daemon.wait(timeout=10)

    async def one():
        async with Client(stdio(fx, tok), mode="legacy") as client:
            r = await client.call_tool("room_whoami", {})
            assert not r.is_error, r.structured_content

    await asyncio.gather(*(one() for _ in range(4)))
    pid = int(open(os.path.join(fx.state, "room.lock")).read().strip())
    os.kill(pid, 0)  # the one daemon the bridges started is alive
    fx.daemon = subprocess.Popen(["sleep", "0"])  # the fixture stops the daemon it started
    os.kill(pid, 15)


@test
async def stdout_of_room_mcp_carries_only_protocol(fx):
    tok = setup_room(fx, ["alpha"])["alpha"]
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {"extensions": {}}, "clientInfo": {"name": "raw", "version": "0"}, "_meta": {"x": 1}}}
    lines = [init, {"jsonrpc": "2.0", "method": "notifications/initialized"},
             {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": {"progressToken": 1}}},
             {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "room_whoami", "arguments": {}}},
             {"jsonrpc": "2.0", "id": 3, "method": "server/discover", "params": {}}]
    data = "".join(json.dumps(l) + "\n" for l in lines)
    out = subprocess.run([ROOM, "mcp", "--state-dir", fx.state], input=data, capture_output=True, text=True, env=dict(fx.env, ROOM_TOKEN=tok, ROOM_LOG="debug"), timeout=30)
    replies = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]  # every stdout line is JSON-RPC
    by_id = {r.get("id"): r for r in replies}
    assert by_id[0]["result"]["protocolVersion"] == "2025-06-18"
    assert by_id[0]["result"]["serverInfo"]["name"] == "room"
    assert len(by_id[1]["result"]["tools"]) == len(ALL_TOOLS)
    assert by_id[2]["result"]["structuredContent"]["agent"] == "alpha"
    assert "error" in by_id[3], by_id[3]


async def wait_for(pred, what, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@test
async def prompts_resources_subscriptions_and_logging(fx):
    """The MCP features beside tools, on both transports (initialize sessions: subscribe and
    setLevel are the 2025 forms): prompts teach the loop, each room is a resource (under one
    template), arguments complete to what the caller may see, a subscribed room that moves is
    announced, and refusals reach the log at the level the client set."""
    warnings.simplefilter("ignore")  # subscribe and setLevel are deprecated from 2026-07-28 on
    toks = setup_room(fx, ["alpha", "beta"])
    fx.run("create", "private", "--member", "beta")
    # a task in a room alpha is not in
    gamma = fx.enroll("gamma", tier="coordinator")
    fx.run("create", "elsewhere", "--member", "gamma", "--member", "beta")
    fx.run("members", "add", "lobby", "gamma")
    async with Client(stdio(fx, gamma), mode="auto") as g:
        made = {}
        for room in ("elsewhere", "lobby"):
            await catch_up(g, room)
            r = await g.call_tool("task_create", {"room": room, "title": f"a task in {room}", "to": "beta"})
            assert not r.is_error, r.structured_content
            made[room] = r.structured_content["task"]["id"]
        hidden, mine = made["elsewhere"], made["lobby"]
    for transport in ("stdio", "http"):
        updates, logs = [], []

        async def on_message(m):
            if isinstance(m, types.ResourceUpdatedNotification):
                updates.append(m.params.uri)

        async def on_log(params):
            logs.append(params)

        target = Http(fx.url, toks["alpha"]).transport() if transport == "http" else stdio(fx, toks["alpha"])
        async with Client(target, mode="legacy", message_handler=on_message, logging_callback=on_log) as alpha:
            caps = alpha.server_capabilities
            assert caps.prompts is not None and caps.resources is not None and caps.resources.subscribe, caps
            assert caps.logging is not None, caps
            # prompts: listed with their argument, filled with a valid name only
            prompts = {p.name: p for p in (await alpha.list_prompts()).prompts}
            assert set(prompts) == {"catch_up", "answer_addressed", "finish_task"}, set(prompts)
            assert prompts["catch_up"].arguments[0].name == "room" and prompts["catch_up"].arguments[0].required
            got = await alpha.get_prompt("catch_up", {"room": "lobby"})
            text = got.messages[0].content.text
            assert "room_sync" in text and "confirm" in text and "lobby" in text, text
            for bad in ({"room": "../x"}, {}):
                try:
                    await alpha.get_prompt("catch_up", bad)
                    raise AssertionError(f"prompt with {bad} accepted")
                except AssertionError:
                    raise
                except Exception:
                    pass
            # resources: the rooms alpha is a member of, read as its next page and open items
            listed = (await alpha.list_resources()).resources
            assert [str(r.uri) for r in listed] == ["room://lobby"], listed
            read = await alpha.read_resource("room://lobby")
            page = json.loads(read.contents[0].text)
            assert "receipt" in page and "open_items" in page, page
            for uri in ("room://private", "room://nowhere", "https://example.com/"):
                try:
                    await alpha.read_resource(uri)
                    raise AssertionError(f"{uri} was readable")
                except AssertionError:
                    raise
                except Exception:
                    pass
            # completions: a prompt's argument and the room template's complete to the caller's
            # rooms only; the template is listed
            assert caps.completions is not None, caps
            templates = (await alpha.list_resource_templates()).resource_templates
            assert [t.uri_template for t in templates] == ["room://{room}"], templates
            prompt_ref = types.PromptReference(name="catch_up")
            got = await alpha.complete(prompt_ref, {"name": "room", "value": "lo"})
            assert got.completion.values == ["lobby"], got
            got = await alpha.complete(prompt_ref, {"name": "room", "value": "pri"})
            assert got.completion.values == [], f"private is not alpha's: {got}"
            got = await alpha.complete(types.ResourceTemplateReference(uri="room://{room}"), {"name": "room", "value": ""})
            assert got.completion.values == ["lobby"] and got.completion.total == 1, got
            # a task argument completes to the tasks of alpha's rooms, never another room's
            finish = types.PromptReference(name="finish_task")
            got = await alpha.complete(finish, {"name": "task", "value": "tsk_"})
            assert mine in got.completion.values and hidden not in got.completion.values, (got, hidden)
            got = await alpha.complete(finish, {"name": "task", "value": mine[:-2]})
            assert got.completion.values == [mine], got
            got = await alpha.complete(finish, {"name": "task", "value": "x"})
            assert got.completion.values == [], got
            # logging: nothing before a level is set; then refusals at or above it
            await alpha.call_tool("room_say", {"room": "lobby", "text": "blind"})
            await asyncio.sleep(0.3)
            assert logs == [], logs
            await alpha.set_logging_level("info")
            r = await alpha.call_tool("room_say", {"room": "lobby", "text": "blind"})
            assert refusal(r)["code"] == "room_sync_required"
            await wait_for(lambda: any(l.data.get("code") == "room_sync_required" for l in logs), "the refusal log")
            assert logs[-1].level == "info" and logs[-1].logger == "room", logs[-1]
            await alpha.set_logging_level("error")
            logs.clear()
            await alpha.call_tool("room_say", {"room": "lobby", "text": "blind again"})
            await alpha.call_tool("room_sync", {"room": "private"})  # room_not_member: a warning
            await asyncio.sleep(0.5)
            assert logs == [], f"below the level nothing is sent: {logs}"
            # subscriptions: another member's turn in lobby is announced without polling by the host
            await alpha.subscribe_resource("room://lobby")
            try:
                await alpha.subscribe_resource("room://private")
                raise AssertionError("subscribed to a room alpha is not a member of")
            except AssertionError:
                raise
            except Exception:
                pass
            async with Client(stdio(fx, toks["beta"]), mode="auto") as beta:
                await catch_up(beta, "lobby")
                r = await beta.call_tool("room_note", {"room": "lobby", "text": f"moving lobby over {transport}"})
                assert not r.is_error, r.structured_content
            await wait_for(lambda: "room://lobby" in updates, f"notifications/resources/updated over {transport}")
            await alpha.unsubscribe_resource("room://lobby")
            updates.clear()
            async with Client(stdio(fx, toks["beta"]), mode="auto") as beta:
                await catch_up(beta, "lobby")
                assert not (await beta.call_tool("room_note", {"room": "lobby", "text": "after"})).is_error
            await asyncio.sleep(1.5)
            assert updates == [], f"no update after unsubscribe: {updates}"


@test
async def a_session_is_told_when_its_rooms_change(fx):
    """notifications/resources/list_changed: a session that can carry notifications (stdio, a
    streamable HTTP session) is told when the agent is added to a room, without polling."""
    toks = setup_room(fx, ["alpha"])
    for transport in ("stdio", "http"):
        changed = []

        async def on_message(m):
            if isinstance(m, types.ResourceListChangedNotification):
                changed.append(m)

        target = Http(fx.url, toks["alpha"]).transport() if transport == "http" else stdio(fx, toks["alpha"])
        async with Client(target, mode="legacy", message_handler=on_message) as alpha:
            caps = alpha.server_capabilities
            assert caps.resources is not None and caps.resources.list_changed, caps
            before = [str(r.uri) for r in (await alpha.list_resources()).resources]
            await asyncio.sleep(0.5)
            assert changed == [], f"nothing changed yet: {changed}"
            fx.run("create", f"added-{transport}", "--member", "alpha")
            await wait_for(lambda: changed, f"notifications/resources/list_changed over {transport}")
            after = [str(r.uri) for r in (await alpha.list_resources()).resources]
            assert set(after) - set(before) == {f"room://added-{transport}"}, (before, after)


@test
async def a_2026_session_listens_to_its_rooms(fx):
    """2026-07-28's subscriptions/listen on both transports: a subscribed room that moves and a
    change of the agent's rooms arrive as events without polling by the host; a room the agent
    is not a member of ends the stream with an error."""
    from mcp.client.subscriptions import ResourcesListChanged, ResourceUpdated, SubscriptionLost

    toks = setup_room(fx, ["alpha", "beta"])
    fx.run("create", "private", "--member", "beta")
    for transport in ("stdio", "http"):
        target = Http(fx.url, toks["alpha"]).transport() if transport == "http" else stdio(fx, toks["alpha"])
        async with Client(target, mode="auto") as alpha:
            # the server ends it with an error (which this SDK reports as a lost stream, not
            # the graceful close of a stream that ran its course)
            try:
                async with alpha.listen(resource_subscriptions=["room://private"]) as sub:
                    async with asyncio.timeout(15):
                        async for _ in sub:
                            pass
                raise AssertionError("listened to a room alpha is not a member of")
            except SubscriptionLost:
                pass
            async with alpha.listen(resources_list_changed=True, resource_subscriptions=["room://lobby"]) as sub:
                assert sub.honored.resource_subscriptions == ["room://lobby"], sub.honored
                async with Client(stdio(fx, toks["beta"]), mode="auto") as beta:
                    await catch_up(beta, "lobby")
                    r = await beta.call_tool("room_note", {"room": "lobby", "text": f"listen over {transport}"})
                    assert not r.is_error, r.structured_content
                async with asyncio.timeout(15):
                    async for ev in sub:
                        if ev == ResourceUpdated(uri="room://lobby"):
                            break
                fx.run("create", f"heard-{transport}", "--member", "alpha")
                async with asyncio.timeout(15):
                    async for ev in sub:
                        if isinstance(ev, ResourcesListChanged):
                            break


@test
async def a_2026_request_opts_in_to_its_own_log(fx):
    """2026-07-28's logging: a request carrying `io.modelcontextprotocol/logLevel` in `_meta`
    gets its refusals logged at or above that level; without it, nothing is logged."""
    toks = setup_room(fx, ["alpha"])
    for transport in ("stdio", "http"):
        for opt_in, expect in ((None, False), ("error", False), ("info", True)):
            logs = []

            async def on_log(params):
                logs.append(params)

            target = Http(fx.url, toks["alpha"]).transport() if transport == "http" else stdio(fx, toks["alpha"])
            async with Client(target, mode="auto", logging_callback=on_log, log_level=opt_in) as alpha:
                r = await alpha.call_tool("room_say", {"room": "lobby", "text": "blind"})
                assert refusal(r)["code"] == "room_sync_required"
                if expect:
                    await wait_for(lambda: any(l.data.get("code") == "room_sync_required" for l in logs),
                                   f"the refusal log over {transport}")
                    assert logs[-1].level == "info" and logs[-1].logger == "room", logs[-1]
                else:
                    await asyncio.sleep(0.5)
                    assert logs == [], f"{transport} {opt_in}: {logs}"


def main():
    passed = failed = 0
    only = sys.argv[2] if len(sys.argv) > 2 else None
    for t in TESTS:
        if only and only not in t.__name__:
            continue
        fx = Fixture()
        try:
            asyncio.run(t(fx))
            print(f"ok   {t.__name__}")
            passed += 1
        except BaseException:
            print(f"FAIL {t.__name__}")
            traceback.print_exc()
            failed += 1
        finally:
            fx.close()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

"""A real third-party ACP agent for the adapter tests, built on the official ACP Python SDK
(PyPI `agent-client-protocol`); it reaches Room only through the MCP servers it is given in
`session/new`, with the official MCP Python SDK (PyPI `mcp`). Prompted, it acts by its first
argument:

- reply: catches up with `room_sync` and answers each obligation of its wake with `room_reply`,
  then ends its turn;
- silent: ends its turn without replying;
- hang: streams an update and waits for `session/cancel`, then answers `cancelled`;
- ignore_cancel: starts a child process and never answers, not even to `session/cancel`;
- wrong_body: streams its update under another session's id and ends its turn;
- obey: asks permission (`session/request_permission`, an `edit`) to create `room-probe.txt`
  in its session's directory and creates it only if allowed, then asks to run the tests (an
  `execute`, running nothing) and to run a tool it names no kind for, and ends its turn; asked to wait until it is told to stop (the probe's interrupt turn), it waits for
  `session/cancel` and ends its turn `cancelled`;
- obey_ignore_cancel: as obey, but its interrupt turn starts a child process and never ends,
  not even on `session/cancel`;
- ignore_deny: creates `room-probe.txt` in its session's directory without asking, then ends
  its turn (an agent whose tool deny is advisory at best);
- implement: a collaboration's implementer: catches up, claims the wake's task, makes
  `greet.sh` in its session's directory (its working tree) say `hello, verbosely`, has Room
  take its diff (`diff_from_tree`) and closes the task (`room_done`), reading through whenever
  the room moved on; it reports what its session cost (`usage_update`: 0.0421 USD);
- announce: streams "Dispatching spec to reasoning now." in two chunks and ends its turn,
  dispatching nothing (an orchestrator whose words announce what it did not do).

With a second argument (a file that keeps its sessions across processes) it offers
`session/load`: a loaded session replays one update of its history before the prompt; and
`session/list`, one session a page.

Each step is a JSON line on stderr (the dispatcher keeps it in the worker's log)."""

import asyncio
import json
import subprocess
import sys
import uuid

from acp import (
    RequestError,
    Agent,
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import (AgentCapabilities, Cost, ListSessionsResponse, PermissionOption, SessionCapabilities,
                        SessionInfo, SessionListCapabilities, ToolCallUpdate, UsageUpdate)
import os
from mcp import Client, StdioServerParameters

MODE = sys.argv[1] if len(sys.argv) > 1 else "reply"
SESSIONS = sys.argv[2] if len(sys.argv) > 2 else None


def known_entries():
    try:
        with open(SESSIONS) as f:
            return json.load(f)
    except FileNotFoundError:
        return []


def known_sessions():
    return [e["id"] for e in known_entries()]


def log(**kw):
    print(json.dumps(kw), file=sys.stderr, flush=True)


def text_of(block):
    return block.get("text", "") if isinstance(block, dict) else getattr(block, "text", "")


class TestAgent(Agent):
    def on_connect(self, conn):
        self.conn = conn
        self.servers = {}
        self.cancelled = asyncio.Event()

    async def initialize(self, protocol_version, client_capabilities=None, client_info=None, **kw):
        log(step="initialize", client=getattr(client_info, "name", None))
        caps = AgentCapabilities(load_session=SESSIONS is not None)
        if SESSIONS:
            caps.session_capabilities = SessionCapabilities(list=SessionListCapabilities())
        return InitializeResponse(protocol_version=protocol_version, agent_capabilities=caps)

    async def new_session(self, cwd, mcp_servers=None, **kw):
        sid = uuid.uuid4().hex
        self.servers[sid] = list(mcp_servers or [])
        self.cwds = getattr(self, "cwds", {})
        self.cwds[sid] = cwd
        log(step="new_session", session=sid, cwd=cwd, mcp=[s.name for s in self.servers[sid]])
        if SESSIONS:
            kept = known_entries() + [{"id": sid, "cwd": cwd, "title": "session %d" % (len(known_entries()) + 1)}]
            with open(SESSIONS, "w") as f:
                json.dump(kept, f)
        return NewSessionResponse(session_id=sid)

    async def list_sessions(self, cwd=None, cursor=None, **kw):
        # one session a page, so that a client must follow nextCursor
        entries = [e for e in known_entries() if cwd is None or e["cwd"] == cwd]
        at = int(cursor) if cursor else 0
        log(step="list_sessions", cwd=cwd, cursor=cursor, known=len(entries))
        page = [SessionInfo(session_id=e["id"], cwd=e["cwd"], title=e["title"]) for e in entries[at:at + 1]]
        more = str(at + 1) if at + 1 < len(entries) else None
        return ListSessionsResponse(sessions=page, next_cursor=more)

    async def load_session(self, cwd, session_id, mcp_servers=None, **kw):
        if session_id not in known_sessions():
            raise RequestError.invalid_params({"session_id": session_id})
        self.servers[session_id] = list(mcp_servers or [])
        log(step="load_session", session=session_id)
        # the history replays before the prompt
        await self.conn.session_update(session_id=session_id, update=update_agent_message(text_block("earlier turn")))
        return LoadSessionResponse()

    async def cancel(self, session_id, **kw):
        log(step="cancel", session=session_id)
        if MODE != "ignore_cancel":
            self.cancelled.set()

    async def prompt(self, session_id, prompt, **kw):
        texts = [text_of(b) for b in prompt]
        log(step="prompt", session=session_id, blocks=len(texts))
        if MODE == "wrong_body":
            await self.conn.session_update(session_id=uuid.uuid4().hex, update=update_agent_message(text_block("not me")))
            return PromptResponse(stop_reason="end_turn")
        await self.conn.session_update(session_id=session_id, update=update_agent_message(text_block("reading")))
        if MODE == "hang":
            await self.cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        if MODE == "ignore_cancel":
            # the agent runs in a PID namespace of its own: the test finds this child by the
            # marker in its command line, not by a pid of this namespace
            marker = "room-test-child-" + uuid.uuid4().hex
            child = subprocess.Popen(["/bin/sh", "-c", "sleep 600; exit", marker])
            log(step="child", pid=child.pid, marker=marker)
            await asyncio.Event().wait()
        if MODE in ("obey", "obey_ignore_cancel") and any("until you are told to stop" in t for t in texts):
            # the probe's interrupt turn: wait for session/cancel (or, ignoring it, never end)
            if MODE == "obey_ignore_cancel":
                marker = "room-test-child-" + uuid.uuid4().hex
                child = subprocess.Popen(["/bin/sh", "-c", "sleep 600; exit", marker])
                log(step="child", pid=child.pid, marker=marker)
                await asyncio.Event().wait()
            await self.cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        if MODE in ("obey", "ignore_deny", "obey_ignore_cancel"):
            target = os.path.join(self.cwds[session_id], "room-probe.txt")
            allowed = MODE == "ignore_deny"
            if MODE != "ignore_deny":
                options = [PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
                           PermissionOption(option_id="reject", name="Reject", kind="reject_once")]
                call = ToolCallUpdate(tool_call_id="probe-1", title="create room-probe.txt", kind="edit")
                answer = await self.conn.request_permission(session_id=session_id, tool_call=call, options=options)
                outcome = answer.outcome
                allowed = getattr(outcome, "outcome", None) == "selected" and getattr(outcome, "option_id", None) == "allow"
                log(step="permission", allowed=allowed)
                # then a program, as an agent running the tests would ask (it runs nothing)
                run = ToolCallUpdate(tool_call_id="probe-2", title="run the tests", kind="execute")
                ran = await self.conn.request_permission(session_id=session_id, tool_call=run, options=options)
                log(step="permission", kind="execute",
                    allowed=getattr(ran.outcome, "option_id", None) == "allow")
                # and a tool it names no kind for (as bridges label a tool they do not know)
                unknown = ToolCallUpdate(tool_call_id="probe-3", title="a tool of another server")
                got = await self.conn.request_permission(session_id=session_id, tool_call=unknown, options=options)
                log(step="permission", kind=None,
                    allowed=getattr(got.outcome, "option_id", None) == "allow")
            if allowed:
                with open(target, "w") as f:
                    f.write("written by the test agent\n")
                log(step="wrote", path=target)
            return PromptResponse(stop_reason="end_turn")
        if MODE == "reply":
            wake = next(json.loads(t) for t in texts if t.startswith("{"))
            await self.answer(session_id, wake)
        if MODE == "announce":
            # one message in two chunks, after the untagged "reading" above
            for part in ("Dispatching spec ", "to reasoning now."):
                chunk = update_agent_message(text_block(part))
                chunk.message_id = "announce-1"
                await self.conn.session_update(session_id=session_id, update=chunk)
            return PromptResponse(stop_reason="end_turn")
        if MODE == "implement":
            wake = next(json.loads(t) for t in texts if t.startswith("{"))
            await self.implement(session_id, wake)
        return PromptResponse(stop_reason="end_turn")

    async def implement(self, session_id, wake):
        with open(os.path.join(self.cwds[session_id], "greet.sh"), "w") as f:
            f.write("#!/bin/sh\necho hello, verbosely\n")
        log(step="edited", cwd=self.cwds[session_id])
        room_server = next(s for s in self.servers[session_id] if s.name == "room")
        params = StdioServerParameters(
            command=room_server.command, args=list(room_server.args), env={e.name: e.value for e in room_server.env}
        )
        room, task = wake["room"], wake["task"]
        async with Client(params, mode="legacy") as client:
            async def catch_up():
                confirm = None
                while True:
                    args = {"room": room} | ({"confirm": confirm} if confirm else {})
                    r = await client.call_tool("room_sync", args)
                    assert not r.is_error, r.structured_content
                    if not r.structured_content["items"]:
                        return
                    confirm = r.structured_content["receipt"]

            async def gated(tool, args):
                for _ in range(8):
                    await catch_up()
                    r = await client.call_tool(tool, args)
                    refusal = (r.structured_content or {}).get("refusal") if r.is_error else None
                    if not refusal or refusal["code"] != "room_sync_required":
                        return r
                    log(step="sent_back", tool=tool)
                return r

            r = await client.call_tool("task_claim", {"task": task})
            assert not r.is_error, r.structured_content
            index = await client.call_tool("artifact_index", {"room": room})
            newest = next((a["version"] for a in index.structured_content["artifacts"] if a["kind"] == "diff"), 0)
            r = await gated("diff_from_tree", {"room": room, "task": task, "expected_version": newest,
                                               "summary": "a verbose greeting"})
            assert not r.is_error, r.structured_content
            log(step="diff", version=r.structured_content.get("artifact", {}).get("version"))
            r = await gated("room_done", {"room": room, "task": task})
            assert not r.is_error, r.structured_content
            log(step="done", task=task)
        await self.conn.session_update(session_id=session_id, update=UsageUpdate(
            session_update="usage_update", used=1200, size=200000, cost=Cost(amount=0.0421, currency="USD")))
        await self.conn.session_update(session_id=session_id, update=update_agent_message(text_block("implemented")))

    async def answer(self, session_id, wake):
        room_server = next(s for s in self.servers[session_id] if s.name == "room")
        params = StdioServerParameters(
            command=room_server.command, args=list(room_server.args), env={e.name: e.value for e in room_server.env}
        )
        async with Client(params, mode="legacy") as client:
            confirm = None
            while True:
                args = {"room": wake["room"]} | ({"confirm": confirm} if confirm else {})
                r = await client.call_tool("room_sync", args)
                assert not r.is_error, r.structured_content
                if not r.structured_content["items"]:
                    break
                confirm = r.structured_content["receipt"]
            for ob in wake["obligation_ids"]:
                args = {"room": wake["room"], "reply_to": ob, "text": "done: " + wake["prompt"]}
                # the loop every tool describes: sent back to read, read the page and retry with
                # read_through (someone may write between our reading and our reply)
                for _ in range(5):
                    r = await client.call_tool("room_reply", args)
                    refusal = (r.structured_content or {}).get("refusal") if r.is_error else None
                    if not refusal or refusal["code"] != "room_sync_required":
                        break
                    log(step="sent_back", code=refusal["code"])
                    args = args | {"read_through": refusal["detail"]["next_page"]["receipt"]}
                assert not r.is_error, r.structured_content
                log(step="replied", obligation=ob)
        await self.conn.session_update(session_id=session_id, update=update_agent_message(text_block("replied")))


if __name__ == "__main__":
    asyncio.run(run_agent(TestAgent()))

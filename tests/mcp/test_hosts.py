"""Room's streamable HTTP endpoint as hosts other than the Python SDK meet it: raw HTTP clients
(priming events per protocol version, parse errors and batches, refusals on a kept-alive
connection, session DELETE, the bearer scheme in any case), the Python SDK's view of the tool
schemas, Gemini CLI as an ACP agent given Room in `session/new`, and the MCP Inspector CLI over
stdio and HTTP.

Run by scripts/test: python tests/mcp/test_hosts.py path/to/room [--gemini BIN] [--inspector NODE SCRIPT]
Prints 'N passed, N failed' and exits non-zero on any failure."""

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
import traceback

import httpx2
from mcp import Client

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import acp_gemini  # noqa: E402
from test_mcp import ROOM, Http, catch_up, stdio  # noqa: E402

ARGS = sys.argv[2:]


def option(name, n=1):
    if name not in ARGS:
        return None
    i = ARGS.index(name)
    return ARGS[i + 1:i + 1 + n]


GEMINI = [os.path.abspath(p) for p in option("--gemini") or []]
INSPECTOR = [os.path.abspath(p) for p in option("--inspector", 2) or []]
CONFORMANCE = [os.path.abspath(p) for p in option("--conformance", 2) or []]
ONLY = option("--only")


class Fixture:
    """A daemon with an HTTP listener and its log (the MCP edge's debug lines) in a file."""

    def __init__(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="room-hosts-")
        self.root = os.path.realpath(self.tmp.name)
        self.state = os.path.join(self.root, "state")
        self.env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self.root, "config"), NO_COLOR="1",
                        ROOM_LOG="warn,room_server::mcp=debug")
        self.env.pop("ROOM_TOKEN", None)
        self.run("init")
        self.log_path = os.path.join(self.root, "daemon.log")
        self.daemon = subprocess.Popen([ROOM, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0"],
                                       env=self.env, stderr=open(self.log_path, "w"))
        addr = os.path.join(self.state, "http.addr")
        for _ in range(500):
            if os.path.exists(addr) and open(addr).read().strip():
                break
            time.sleep(0.01)
        self.addr = open(addr).read().strip()
        self.url = f"http://{self.addr}/mcp"
        self.token = self.enroll("alpha")
        self.run("create", "lobby", "--member", "alpha")

    def run(self, *args):
        out = subprocess.run([ROOM, "--state-dir", self.state, "--json", *args], env=self.env, capture_output=True, text=True)
        assert out.returncode == 0, f"room {' '.join(args)} failed: {out.stderr}"
        return json.loads(out.stdout) if out.stdout.strip() else None

    def enroll(self, name):
        return self.run("agent", "enroll", name, "--host", "generic")["token"]

    def log(self):
        return open(self.log_path).read()

    def close(self):
        self.daemon.terminate()
        self.daemon.wait(timeout=10)
        self.tmp.cleanup()


def hdr(fx, version=None, session=None, **extra):
    h = {"Authorization": f"Bearer {fx.token}", "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if version:
        h["MCP-Protocol-Version"] = version
    if session:
        h["Mcp-Session-Id"] = session
    return h | extra


def init_body(version):
    return {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}


def sse_events(text):
    """Each event of an SSE body as a dict of its fields (data lines joined)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        ev = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            ev[field] = ev[field] + "\n" + value if field == "data" and field in ev else value
        if ev:
            events.append(ev)
    return events


TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


@test
async def priming_event_only_where_the_negotiated_version_has_it(fx):
    async with httpx2.AsyncClient() as http:
        for version, primed in (("2025-03-26", False), ("2025-06-18", False), ("2025-11-25", True)):
            r = await http.post(fx.url, json=init_body(version), headers=hdr(fx))
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), (version, r.status_code)
            events = sse_events(r.text)
            empty = [e for e in events if "data" in e and not e["data"].strip()]
            for e in events:
                if e.get("data", "").strip():
                    json.loads(e["data"])  # every event with data is a JSON-RPC message
            assert bool(empty) == primed, (version, events)
            result = json.loads([e for e in events if e.get("data", "").strip()][0]["data"])["result"]
            assert result["protocolVersion"] == version
            session = r.headers["mcp-session-id"]
            sent_version = version if version >= "2025-06-18" else None
            r = await http.post(fx.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=hdr(fx, sent_version, session))
            assert r.status_code == 202, r.status_code
            # a request on the session: a stream again, primed as the session's version says
            r = await http.post(fx.url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, headers=hdr(fx, sent_version, session))
            events = sse_events(r.text)
            assert any(not e.get("data", "x").strip() for e in events) == primed, (version, events)
            assert len(json.loads([e for e in events if e.get("data", "").strip()][-1]["data"])["result"]["tools"]) == 31
            # the standalone stream (GET): its first event is the priming one only from 2025-11-25
            async with http.stream("GET", fx.url, headers=hdr(fx, sent_version, session) | {"Accept": "text/event-stream"}) as s:
                assert s.status_code == 200, s.status_code
                first = b""
                try:
                    async with asyncio.timeout(0.7):
                        async for chunk in s.aiter_bytes():
                            first += chunk
                            if b"\n\n" in first:
                                break
                except TimeoutError:
                    pass
                assert (b"data:" in first) == primed, (version, first)
            r = await http.delete(fx.url, headers=hdr(fx, sent_version, session))
            assert r.status_code == 200, f"session DELETE answered {r.status_code}"
            r = await http.post(fx.url, json={"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, headers=hdr(fx, sent_version, session))
            assert r.status_code == 404, "a deleted session is gone"


@test
async def bearer_scheme_is_case_insensitive(fx):
    async with httpx2.AsyncClient() as http:
        for scheme in ("bearer", "BEARER", "Bearer"):
            r = await http.post(fx.url, json=init_body("2025-06-18"), headers=hdr(fx) | {"Authorization": f"{scheme} {fx.token}"})
            assert r.status_code == 200, (scheme, r.status_code)
        r = await http.post(fx.url, json=init_body("2025-06-18"), headers=hdr(fx) | {"Authorization": f"Basic {fx.token}"})
        assert r.status_code == 401
    # and a whole SDK session with the lower-case scheme, tool calls included
    h = Http(fx.url, fx.token)
    h.http.headers["Authorization"] = f"bearer {fx.token}"
    for mode in ("legacy", "auto"):
        async with Client(h.transport(), mode=mode) as client:
            await catch_up(client, "lobby")
            r = await client.call_tool("room_note", {"room": "lobby", "text": f"lower-case scheme, {mode}"})
            assert not r.is_error, r.structured_content


@test
async def parse_errors_and_batches_are_json_rpc_errors(fx):
    async with httpx2.AsyncClient() as http:
        cases = [
            (b"{not json", -32700, None),
            (b"\xff\xfe", -32700, None),
            (b"", -32700, None),
            (b"[]", -32600, None),
            (json.dumps([init_body("2025-03-26")]).encode(), -32600, None),
            (json.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}]).encode(), -32600, None),
            (b'{"jsonrpc":"2.0","id":7}', -32600, 7),
            (b'{"jsonrpc":"2.0","id":"x","method":5}', -32600, "x"),
        ]
        for raw, code, id_ in cases:
            r = await http.post(fx.url, content=raw, headers=hdr(fx))
            assert r.status_code == 400, (raw, r.status_code, r.text[:200])
            assert r.headers["content-type"].startswith("application/json"), (raw, r.headers)
            body = r.json()
            assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code and body["id"] == id_, (raw, body)
        # a wrong media type is still 415, a wrong Accept 406
        r = await http.post(fx.url, content=b"{}", headers=hdr(fx, **{"Content-Type": "text/plain"}))
        assert r.status_code == 415, r.status_code
        r = await http.post(fx.url, json=init_body("2025-06-18"), headers=hdr(fx, Accept="application/json"))
        assert r.status_code == 406, r.status_code


def raw_request(sock, method, path, headers, body=b""):
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    sock.sendall(head.encode() + body)


def raw_response(sock):
    """One HTTP/1.1 response with a Content-Length or chunked body: (status, headers, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"connection closed before a response: {buf!r}")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(rest) < n:
            rest += sock.recv(65536)
        return status, headers, rest[:n]
    if headers.get("transfer-encoding") == "chunked":
        while not rest.endswith(b"0\r\n\r\n"):
            rest += sock.recv(65536)
        return status, headers, rest
    return status, headers, rest


@test
async def no_request_lost_on_a_kept_connection_after_an_early_refusal(fx):
    host, port = fx.addr.split(":")
    big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"pad": "x" * 200_000}}).encode()
    base = {"Host": fx.addr, "Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    good = base | {"Authorization": f"Bearer {fx.token}", "MCP-Protocol-Version": "2025-06-18"}
    refusals = [
        ("401 no token", base, 401),
        ("401 unknown token", base | {"Authorization": "Bearer room_tok_" + "0" * 64}, 401),
        ("406", good | {"Accept": "application/json"}, 406),
        ("415", good | {"Content-Type": "text/plain"}, 415),
        ("400 parse", good, 400),
    ]
    for _ in range(3):
        with socket.create_connection((host, int(port))) as sock:
            sock.settimeout(10)
            for name, headers, status in refusals:
                body = b"{broken" + big if status == 400 else big
                raw_request(sock, "POST", "/mcp", headers, body)
                got, h, _ = raw_response(sock)
                assert got == status, (name, got)
                assert h.get("connection", "").lower() != "close", f"{name}: the connection is kept"
                # the next request on the same connection is answered
                ping = json.dumps({"jsonrpc": "2.0", "id": 9, "method": "ping", "params": {"_meta": {}}}).encode()
                raw_request(sock, "POST", "/mcp", good | {"Accept": "application/json, text/event-stream"}, ping)
                got, h, b = raw_response(sock)
                assert got in (200, 400), (name, "next request", got, b[:200])
    # a body over the limit is refused and the connection is closed, saying so
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(10)
        head = "POST /mcp HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in good.items()) + f"Content-Length: {3 << 20}\r\n\r\n"
        sock.sendall(head.encode() + b"x" * (2 << 20) + b"x" * 4096)
        got, h, _ = raw_response(sock)
        assert got == 413 and h.get("connection", "").lower() == "close", (got, h)


@test
async def every_tool_schema_is_typed_and_delete_is_quiet(fx):
    """The SDK sees a typed schema for every property of every tool, and closing its session
    logs no 'Session termination failed'."""
    records = []

    class Catch(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler = Catch(level=logging.DEBUG)
    sdk = logging.getLogger("mcp")
    saved = sdk.level, sdk.propagate
    sdk.setLevel(logging.DEBUG)
    sdk.propagate = False
    sdk.addHandler(handler)
    try:
        for path in ("/mcp", "/mcp-compact"):
            async with Client(Http(fx.url.replace("/mcp", path), fx.token).transport(), mode="legacy") as client:
                for tool in (await client.list_tools()).tools:
                    def walk(schema, at):
                        assert isinstance(schema.get("type"), str), f"{at} is not typed with one type: {schema}"
                        for k, v in schema.get("properties", {}).items():
                            walk(v, f"{at}.{k}")
                        if "items" in schema:
                            walk(schema["items"], f"{at}[]")
                    walk(tool.input_schema, tool.name)
    finally:
        sdk.removeHandler(handler)
        sdk.setLevel(saved[0])
        sdk.propagate = saved[1]
    failed = [m for m in records if "termination" in m.lower()]
    assert not failed, failed


async def gemini_session(fx, settings=None):
    """Gemini CLI as an ACP agent with Room over HTTP: no MCP error in its --debug log, and Room
    served its tools/list in a session that negotiated a version without priming events."""
    if not GEMINI:
        raise RuntimeError("no --gemini BIN given (scripts/test installs @google/gemini-cli)")
    work = os.path.join(fx.root, "work")
    home = os.path.join(fx.root, "home")
    os.makedirs(work, exist_ok=True)
    os.makedirs(home, exist_ok=True)
    answers, log = await asyncio.to_thread(acp_gemini.run, GEMINI, fx.url, fx.token, work, home, 120, "bearer", settings)
    assert "result" in answers.get(1, {}), f"session/new unanswered: {answers.get(1)}\n{log[-3000:]}"
    bad = [l for l in log.splitlines() if any(s in l for s in (
        "Client is not connected", "Error connecting to MCP server", "MCP ERROR", "failed to start or connect",
        "Error discovering", "Discovery failed", "SyntaxError", "Unexpected end of JSON"))]
    assert not bad, "\n".join(bad)
    assert "Registering notification handlers for server 'room'" in log, log[-3000:]
    served = [l for l in fx.log().splitlines() if "mcp request" in l]
    sessions = {l.split('session="')[1].split('"')[0] for l in served if 'method="tools/list"' in l}
    sessions.discard("-")
    assert sessions, "\n".join(served)
    assert all("primed=false" in l for l in served if 'method="initialize"' in l), served


@test
async def gemini_cli_discovers_rooms_tools_over_http(fx):
    # given Room in session/new, with the lower-case bearer scheme
    await gemini_session(fx)


@test
async def gemini_cli_takes_the_configuration_room_connect_prints(fx):
    out = fx.run("connect", "gemini", "gemma")
    fx.token = out["token"]
    fx.run("members", "add", "lobby", "gemma")
    await gemini_session(fx, settings=json.loads(out["config"]["http"]))


def inspector(fx, args):
    """The Inspector CLI's JSON answer (and its stderr), with a home of its own (its catalog)."""
    node, script = INSPECTOR
    home = os.path.join(fx.root, "inspector-home")
    os.makedirs(home, exist_ok=True)
    out = subprocess.run([node, script, "--cli", *args], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HOME=home, NO_COLOR="1"))
    assert out.returncode == 0, f"inspector {args}: {out.stdout[-2000:]}\n{out.stderr[-2000:]}"
    return json.loads(out.stdout), out.stderr


@test
async def inspector_cli_lists_and_calls_tools_prompts_and_resources_over_stdio_and_http(fx):
    if not INSPECTOR:
        raise RuntimeError("no --inspector NODE SCRIPT given (scripts/test installs @modelcontextprotocol/inspector)")
    stdio_target = ["-e", f"ROOM_TOKEN={fx.token}", "-e", f"ROOM_STATE_DIR={fx.state}",
                    "-e", f"XDG_CONFIG_HOME={fx.env['XDG_CONFIG_HOME']}", "--", ROOM, "mcp"]
    http_target = [fx.url, "--transport", "http", "--header", f"Authorization: Bearer {fx.token}"]
    for target, stdio_ in ((http_target, False), (stdio_target, True)):
        def cli(*method):
            # a stdio server's command comes last, after `--`
            return inspector(fx, [*method, *target] if stdio_ else [*target, *method])

        # --strict: every schema portable (one type per field), else exit 6
        listed, err = cli("--method", "tools/list", "--strict")
        names = {t["name"] for t in listed["tools"]}
        assert "room_sync" in names and "room" in names and len(names) == 31, names
        assert "Warning" not in err and "Error" not in err, err
        r, _ = cli("--method", "tools/call", "--tool-name", "room_whoami")
        assert r["structuredContent"]["agent"] == "alpha", r
        r, _ = cli("--method", "tools/call", "--tool-name", "room_sync", "--tool-arg", "room=lobby")
        assert not r.get("isError") and "receipt" in r["structuredContent"], r
        # prompts and resources, listed and called the same way
        listed, _ = cli("--method", "prompts/list")
        assert {p["name"] for p in listed["prompts"]} == {"catch_up", "answer_addressed", "finish_task"}, listed
        got, _ = cli("--method", "prompts/get", "--prompt-name", "catch_up", "--prompt-args", "room=lobby")
        assert "room_sync" in got["messages"][0]["content"]["text"], got
        listed, _ = cli("--method", "resources/list")
        assert [r["uri"] for r in listed["resources"]] == ["room://lobby"], listed
        read, _ = cli("--method", "resources/read", "--uri", "room://lobby")
        page = json.loads(read["contents"][0]["text"])
        assert "receipt" in page and "open_items" in page, page


@test
async def the_mcp_conformance_suites_completion_scenario_passes(fx):
    """The official conformance suite's `completion-complete` server scenario over streamable
    HTTP (its CLI sends no header of its own: a preload adds the bearer credential)."""
    if not CONFORMANCE:
        raise RuntimeError("no --conformance NODE SCRIPT given (scripts/test installs @modelcontextprotocol/conformance)")
    node, script = CONFORMANCE
    out_dir = os.path.join(fx.root, "conformance")
    preload = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conformance_auth.mjs")
    out = subprocess.run([node, "--import", preload, script, "server", "--url", fx.url,
                          "--scenario", "completion-complete", "-o", out_dir],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, MCP_BEARER_TOKEN=fx.token, NO_COLOR="1"))
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-2000:]}"
    [run] = os.listdir(out_dir)
    checks = json.load(open(os.path.join(out_dir, run, "checks.json")))
    assert [(c["id"], c["status"]) for c in checks] == [("completion-complete", "SUCCESS")], checks


def main():
    passed = failed = 0
    for t in TESTS:
        if ONLY and ONLY[0] not in t.__name__:
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

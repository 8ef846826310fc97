"""Drive Gemini CLI as an ACP agent (`gemini --acp`) and give it Room over streamable HTTP in
`session/new`, as an ACP client (an editor) would. Used by test_hosts.py; runnable alone:
python acp_gemini.py GEMINI_BIN URL TOKEN WORKDIR  -> prints the agent's stderr log."""

import json
import os
import signal
import subprocess
import sys
import threading
import time


def run(gemini, url, token, workdir, home, timeout=90, scheme="Bearer", settings=None):
    """Start `gemini --acp --debug`, initialize, open a session with Room as its one MCP server,
    wait until the session is answered, and return (answers by id, stderr text). With
    `settings` (merged into ~/.gemini/settings.json, e.g. the mcpServers `room connect gemini`
    prints), `session/new` names no server: Gemini takes Room from its settings."""
    # no telemetry and no update check: the test talks to loopback only
    os.makedirs(os.path.join(home, ".gemini"), exist_ok=True)
    with open(os.path.join(home, ".gemini", "settings.json"), "w") as f:
        json.dump({"privacy": {"usageStatisticsEnabled": False}, "telemetry": {"enabled": False},
                   "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False}} | (settings or {}), f)
    env = dict(os.environ, GEMINI_API_KEY="dummy-key-for-tests", GEMINI_CLI_TRUST_WORKSPACE="true",
               HOME=home, NO_COLOR="1", CI="1")
    p = subprocess.Popen([*gemini, "--acp", "--debug"], cwd=workdir, env=env, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    err = []
    threading.Thread(target=lambda: err.extend(l.decode("utf-8", "replace") for l in p.stderr), daemon=True).start()
    answers, lock = {}, threading.Condition()

    def reader():
        for line in p.stdout:
            try:
                m = json.loads(line)
            except ValueError:
                continue
            with lock:
                if "id" in m and ("result" in m or "error" in m):
                    answers[m["id"]] = m
                elif "id" in m and "method" in m:
                    # a request from the agent (permissions, files): refuse politely
                    p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "not supported"}}) + "\n").encode())
                    p.stdin.flush()
                else:
                    answers.setdefault("notifications", []).append(m)
                lock.notify_all()

    threading.Thread(target=reader, daemon=True).start()

    def send(i, method, params):
        p.stdin.write((json.dumps({"jsonrpc": "2.0", "id": i, "method": method, "params": params}) + "\n").encode())
        p.stdin.flush()
        deadline = time.time() + timeout
        with lock:
            while i not in answers and time.time() < deadline and p.poll() is None:
                lock.wait(0.5)
        return answers.get(i)

    try:
        send(0, "initialize", {"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}})
        servers = [] if settings else [
            {"type": "http", "name": "room", "url": url, "headers": [{"name": "Authorization", "value": f"{scheme} {token}"}]}]
        send(1, "session/new", {"cwd": workdir, "mcpServers": servers})
        time.sleep(2)  # let discovery finish and its log lines arrive
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    time.sleep(0.2)
    return answers, "".join(err)


if __name__ == "__main__":
    g, url, tok, wd = sys.argv[1:5]
    home = os.path.join(wd, "home")
    os.makedirs(home, exist_ok=True)
    a, log = run([g], url, tok, wd, home)
    print(json.dumps({k: v for k, v in a.items() if k != "notifications"}, indent=1)[:3000])
    print(log)

"""A worker for the dispatcher tests: a real process that reads its wake prompt on stdin and,
by its first argument, replies through the daemon socket with its one-launch credential
(reply), exits without replying (exit), fails (fail), never ends, with a child (hang), exits
leaving a grandchild that left its process group (escape), or never ends, ignoring SIGTERM,
with such a grandchild (stubborn)."""
import json
import os
import socket
import subprocess
import sys
import time

prompt = json.loads(sys.stdin.readline())
mode = sys.argv[1] if len(sys.argv) > 1 else "reply"
token = os.environ["ROOM_TOKEN"]
print(json.dumps({"token": token, "launch": os.environ.get("ROOM_LAUNCH"), "env": sorted(os.environ),
                  "evidence": prompt.get("evidence")}), flush=True)
if mode == "exit":
    sys.exit(0)
if mode == "fail":
    sys.exit(3)
if mode == "escape":
    # a grandchild in a session of its own (out of the worker's process group) outlives this exit
    child = subprocess.Popen(["/usr/bin/setsid", "/usr/bin/sleep", "600"])
    print(json.dumps({"child": child.pid}), flush=True)
    sys.exit(0)
if mode == "stubborn":
    # ignores SIGTERM and leaves a grandchild in a session of its own that ignores it too
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["/usr/bin/setsid", "/bin/sh", "-c", "trap '' TERM; sleep 600"])
    print(json.dumps({"child": child.pid}), flush=True)
    while True:
        time.sleep(1)
if mode == "hang":
    child = subprocess.Popen(["/usr/bin/sleep", "600"])
    print(json.dumps({"child": child.pid}), flush=True)
    while True:
        time.sleep(1)

sock = socket.socket(socket.AF_UNIX)
sock.connect(os.environ["ROOM_SOCKET"])
f = sock.makefile("rwb")


def call(op, args):
    f.write(json.dumps({"op": op, "token": token, "args": args}).encode() + b"\n")
    f.flush()
    return json.loads(f.readline())


room = prompt["room"]
while True:
    page = call("sync", {"room": room})["result"]
    call("sync", {"room": room, "confirm": page["receipt"]})
    if not page["more"]:
        break
for ob in prompt["obligation_ids"]:
    r = call("reply", {"room": room, "reply_to": ob, "text": "done: " + prompt["prompt"]})
    assert r["ok"], r
print(json.dumps({"whoami": call("whoami", {})["result"]}), flush=True)

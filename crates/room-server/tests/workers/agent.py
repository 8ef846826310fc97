"""A worker for the dispatcher tests: a real process that reads its wake prompt on stdin and,
by its first argument, replies through the daemon socket with its one-launch credential
(reply), exits without replying (exit), fails (fail), never ends, with a child (hang), exits
leaving a grandchild that left its process group (escape), or never ends, ignoring SIGTERM,
with such a grandchild (stubborn); takes only the start of a page and waits (sever); reports what staging handed it (staged), or changes a
read-only project only through proposals (propose)."""
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
def marker(what):
    # the worker runs in a PID namespace of its own, so the pids it sees are not the
    # machine's: the test finds its processes by this word in their command line
    return "room-test-%s-%s" % (what, os.environ.get("ROOM_LAUNCH"))
def marked_env(what):
    # every process below inherits it, the sleep as well as the marked sh
    return dict(os.environ, ROOM_TEST_MARK=marker(what))
if mode == "exit":
    sys.exit(0)
if mode == "fail":
    sys.exit(3)
if mode == "escape":
    # a grandchild in a session of its own (out of the worker's process group) outlives this exit
    child = subprocess.Popen(["/usr/bin/setsid", "/bin/sh", "-c", "sleep 600; exit", marker("escape")], env=marked_env("escape"))
    print(json.dumps({"child": child.pid, "marker": marker("escape")}), flush=True)
    sys.exit(0)
if mode == "sever":
    # asks for a page, takes only its first bytes, says so, and waits: the test revokes it then
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["ROOM_SOCKET"])
    s.sendall(json.dumps({"op": "sync", "token": token, "args": {"room": prompt["room"]}}).encode() + b"\n")
    got = s.recv(256)
    print(json.dumps({"partial": len(got)}), flush=True)
    time.sleep(60)
    sys.exit(0)
if mode == "probe":
    # what a worker can reach: the state dir's control.db, the owner's socket with no
    # credential, an owner operation under its own credential, and its own identity
    seen = {}
    try:
        open(os.path.join(os.environ["ROOM_STATE_DIR"], "control.db"), "rb").read(16)
        seen["control_db"] = "read"
    except OSError as e:
        seen["control_db"] = type(e).__name__
    def raw(req):
        s = socket.socket(socket.AF_UNIX)
        s.connect(os.environ["ROOM_SOCKET"])
        fh = s.makefile("rwb")
        fh.write(json.dumps(req).encode() + b"\n")
        fh.flush()
        return json.loads(fh.readline())
    def code(r):
        return "ok" if r.get("ok") else r["refusal"]["code"]
    seen["no_token_owner_op"] = code(raw({"op": "agent_list", "args": {}}))
    seen["no_token_enroll"] = code(raw({"op": "agent_enroll", "args": {"name": "intruder", "max_tier": "operator"}}))
    seen["own_token_owner_op"] = code(raw({"op": "agent_list", "token": token, "args": {}}))
    seen["own_token_whoami"] = code(raw({"op": "whoami", "token": token, "args": {}}))
    seen["other_token"] = code(raw({"op": "whoami", "token": "room_tok_" + "0" * 64, "args": {}}))
    # another program of the job (a tool the agent ran) with the worker's own credential
    perl = ("use IO::Socket::UNIX; my $s = IO::Socket::UNIX->new(Peer => $ENV{ROOM_SOCKET}) or die $!;"
            " print $s '{\"op\":\"whoami\",\"token\":\"' . $ENV{ROOM_TOKEN} . '\",\"args\":{}}' . \"\\n\";"
            " print scalar <$s>;")
    out = subprocess.run(["/usr/bin/perl", "-e", perl], capture_output=True, text=True, timeout=10)
    try:
        answer = json.loads(out.stdout)
        seen["other_program"] = code(answer)
        seen["other_program_reason"] = answer.get("refusal", {}).get("detail", {}).get("reason")
    except ValueError:
        seen["other_program"] = "no answer: " + out.stderr
    # a process admitted at connect (a fork of this worker, the route's program) that then
    # execs another program with the connection open is refused from its next request
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(os.environ["ROOM_SOCKET"])
            fh = s.makefile("rwb")
            fh.write(json.dumps({"op": "whoami", "token": token, "args": {}}).encode() + b"\n")
            fh.flush()
            first = code(json.loads(fh.readline()))
            fd = s.detach()
            os.set_inheritable(fd, True)
            os.dup2(w, 1)
            again = ("open(my $s, '+<&=', %d) or die $!; select((select($s), $| = 1)[0]);"
                     " print $s '{\"op\":\"whoami\",\"token\":\"' . $ENV{ROOM_TOKEN} . '\",\"args\":{}}' . \"\\n\";"
                     " my $l = <$s>; print STDOUT '%s ' . (defined $l ? $l : '{}');") % (fd, first)
            os.execv("/usr/bin/perl", ["perl", "-e", again])
        finally:
            os._exit(1)
    os.close(w)
    with os.fdopen(r) as out:
        before, _, after = out.read().partition(" ")
    os.waitpid(child, 0)
    seen["before_exec"] = before
    after = json.loads(after) if after.strip() else {}
    seen["after_exec"] = code(after) if after else "closed"
    seen["after_exec_reason"] = after.get("refusal", {}).get("detail", {}).get("reason")
    # leaving its job: writing itself into a cgroup outside it, through every cgroup2 mount
    escapes = []
    for line in open("/proc/self/mountinfo"):
        left, _, right = line.partition(" - ")
        if right.split()[:1] == ["cgroup2"]:
            try:
                with open(os.path.join(left.split()[4], "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
                escapes.append("escaped")
            except OSError as e:
                import errno
                escapes.append(errno.errorcode.get(e.errno, str(e.errno)))
    seen["cgroup_escape"] = escapes
    seen["own_cgroup"] = open("/proc/self/cgroup").read().strip().splitlines()[-1]
    seen["state_dir_entries"] = sorted(os.listdir(os.environ["ROOM_STATE_DIR"]))
    # where it starts (its own launch directory) is inside its view too: above it, only itself
    seen["cwd_parent_entries"] = sorted(os.listdir(".."))
    # another process's view of the machine through /proc/<pid>/root (the daemon's, a shell's):
    # the state directory and the owner socket must not be reachable that way either
    state = os.environ["ROOM_STATE_DIR"]
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    seen["proc_pids"] = len(pids)
    leaks = []
    for p in pids:
        root = "/proc/%s/root" % p
        try:
            if "control.db" in os.listdir(root + state):
                leaks.append("state_dir")
        except OSError:
            pass
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(2)
            # relative to the socket's directory: sun_path is 108 bytes at most
            here = os.getcwd()
            os.chdir(root + os.path.dirname(os.environ["ROOM_SOCKET"]))
            try:
                s.connect(os.path.basename(os.environ["ROOM_SOCKET"]))
            finally:
                os.chdir(here)
            fh = s.makefile("rwb")
            fh.write(json.dumps({"op": "agent_list", "args": {}}).encode() + b"\n")
            fh.flush()
            if json.loads(fh.readline()).get("ok"):
                leaks.append("owner_socket")
        except (OSError, ValueError):
            pass
    seen["proc_root_leaks"] = sorted(set(leaks))
    # undoing the mount that hides the state directory (a worker of a root daemon is root)
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.umount2(state.encode(), 2) == 0:
        seen["umount_state_dir"] = "unmounted"
    else:
        import errno
        seen["umount_state_dir"] = errno.errorcode.get(ctypes.get_errno(), "?")
    seen["state_dir_after_umount"] = sorted(os.listdir(state))
    if len(sys.argv) > 2:
        # a TCP listener of the test, on this machine's loopback
        try:
            socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=2).close()
            seen["network"] = "reached"
        except OSError as e:
            seen["network"] = type(e).__name__
    print(json.dumps({"probe": seen}), flush=True)
    sys.exit(0)
if mode == "staged":
    # what staging handed this worker: the manifest in its wake and the files beside it
    stage = os.path.join(os.getcwd(), "stage")
    files = sorted(os.path.relpath(os.path.join(d, f), stage) for d, _, fs in os.walk(stage) for f in fs)
    notes = open(os.path.join(stage, "notes.txt")).read() if os.path.exists(os.path.join(stage, "notes.txt")) else None
    print(json.dumps({"staged": prompt.get("staged"), "files": files, "notes": notes}), flush=True)
    sys.exit(0)
if mode == "propose":
    # a read-only project (argv[2]): a direct write fails; the change goes back as a proposal
    stage = os.path.join(os.getcwd(), "stage")
    rows = json.load(open(os.path.join(stage, "data.json.projection.json")))["rows"]
    seen = {"read": rows}
    try:
        with open(os.path.join(sys.argv[2], "data.json"), "w") as fh:
            fh.write("[]")
        seen["direct_write"] = "wrote"
    except OSError as e:
        seen["direct_write"] = type(e).__name__ + ":" + str(e.errno)
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["ROOM_SOCKET"])
    fh = s.makefile("rwb")
    def call(op, args):
        fh.write(json.dumps({"op": op, "token": token, "args": args}).encode() + b"\n")
        fh.flush()
        return json.loads(fh.readline())
    def code(r):
        return "ok" if r.get("ok") else r["refusal"]["code"]
    task = prompt["task"]
    row = rows[0]
    change = {"task": task, "path": "data.json", "key": str(row["id"]), "version": row["v"]}
    seen["before_claim"] = code(call("task_propose", dict(change, set={"name": "z"})))
    seen["claim"] = code(call("task_claim", {"task": task}))
    r = call("task_propose", dict(change, set={"name": "z"}))
    seen["applied"] = r.get("result") or r["refusal"]
    seen["again"] = code(call("task_propose", dict(change, set={"name": "y"})))
    seen["withheld"] = code(call("task_propose", dict(change, version=row["v"] + 1, set={"secret": "s"})))
    print(json.dumps({"proposals": seen}), flush=True)
    sys.exit(0)
if mode == "stubborn":
    # ignores SIGTERM and leaves a grandchild in a session of its own that ignores it too
    import signal
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen(["/usr/bin/setsid", "/bin/sh", "-c", "trap '' TERM; sleep 600; exit", marker("stubborn")], env=marked_env("stubborn"))
    print(json.dumps({"child": child.pid, "marker": marker("stubborn")}), flush=True)
    while True:
        time.sleep(1)
if mode == "hang":
    child = subprocess.Popen(["/bin/sh", "-c", "sleep 600; exit", marker("hang")], env=marked_env("hang"))
    print(json.dumps({"child": child.pid, "marker": marker("hang")}), flush=True)
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

"""The dashboard in a real browser: Debian's Chromium, driven by Playwright (Python).

A real daemon on a throw-away state dir with its HTTP listener; `room dashboard` prints the
login link. The test logs in with it, creates a collaboration with scripted roles in the
create dialog, watches its phases advance without a reload, sees the panel's findings side by
side, approves the dispatch waiting for the person, pages a long timeline, revokes an agent in
the identity tree and sees its next call refused, and finally stops the daemon and reads the
page's message that it is unreachable. Each view is checked with axe-core (no serious or
critical violation) and saved as a screenshot under target/dashboard/.

usage: test_dashboard.py ROOM_BIN --axe AXE_MIN_JS [--chromium /usr/bin/chromium] [--out DIR]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

GREET = '#!/bin/sh\necho "hello"\n'
TEST = '#!/bin/sh\nset -e\n[ "$(sh greet.sh)" = "hello" ]\n[ "$(sh greet.sh --verbose)" = "hello, verbosely" ]\necho "2 tests passed"\n'
MAKEFILE = "test:\n\tsh test.sh\n"
PATCH = '--- a/greet.sh\n+++ b/greet.sh\n@@ -1,2 +1,6 @@\n #!/bin/sh\n+if [ "$1" = "--verbose" ]; then\n+  echo "hello, verbosely"\n+  exit 0\n+fi\n echo "hello"\n'

ARTIFACTS = {
    "spec": {"title": "a --verbose flag", "goal": "greet.sh --verbose says how it greets",
             "requirements": ["greet.sh --verbose prints 'hello, verbosely'"], "acceptance": ["make test passes"]},
    "research": {"question": "how do shell scripts take flags?", "summary": "compare $1 for one flag",
                 "findings": [{"claim": "POSIX sh sets $1 to the first argument", "source": "POSIX 2.5.1"}]},
    "adr": {"title": "compare $1", "status": "accepted", "context": "one flag", "decision": "test $1 first"},
}
# two reviewers that disagree: one sees nothing, the other a non-blocking finding
FINDINGS_A = {"blocking": [], "non_blocking": [], "suggestions": [{"title": "move to getopts if a second flag comes"}]}
FINDINGS_B = {"blocking": [], "non_blocking": [{"title": "--verbose is in no usage line", "file": "greet.sh", "line": 2}],
              "suggestions": []}

SERIOUS = ("serious", "critical")


class Fixture:
    def __init__(self, room):
        self.room = room
        self.tmp = tempfile.TemporaryDirectory(prefix="room-dashboard-")
        self.root = os.path.realpath(self.tmp.name)
        self.state = os.path.join(self.root, "state")
        self.env = dict(os.environ, XDG_CONFIG_HOME=os.path.join(self.root, "config"), ROOM_LOG="error", NO_COLOR="1")
        self.env.pop("ROOM_TOKEN", None)
        self.run("init")
        with open(os.path.join(self.state, "config.toml"), "w") as f:
            f.write('[acceptance]\ncommands = ["/usr/bin/make", "/bin/sh"]\n')
        self.daemon = subprocess.Popen([room, "serve", "--state-dir", self.state, "--listen", "127.0.0.1:0"], env=self.env)
        addr = os.path.join(self.state, "http.addr")
        for _ in range(1000):
            if os.path.exists(addr) and open(addr).read().strip():
                break
            time.sleep(0.01)
        self.base = "http://" + open(addr).read().strip()

    def run(self, *args, check=True, env=None):
        out = subprocess.run([self.room, "--state-dir", self.state, "--json", *args], env=env or self.env,
                             capture_output=True, text=True)
        if check and out.returncode != 0:
            raise AssertionError(f"room {' '.join(args)} failed: {out.stderr}")
        return json.loads(out.stdout) if out.stdout.strip() else None

    def agent(self, token, op, args):
        """One call as an agent over `/v1/call`."""
        req = urllib.request.Request(self.base + "/v1/call", data=json.dumps({"op": op, "args": args}).encode(),
                                     headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            return json.loads(e.read())

    def say(self, token, room, text, verb="say", **extra):
        page = self.agent(token, "sync", {"room": room})["result"]
        for _ in range(1000):
            nxt = self.agent(token, "sync", {"room": room, "confirm": page["receipt"]})["result"]
            if nxt["more"] is False and not nxt["items"]:
                break
            page = nxt
        r = self.agent(token, verb, {"room": room, "text": text, **extra})
        assert r["ok"], r

    def materials(self):
        project = os.path.join(self.root, "sample")
        os.makedirs(project)
        for name, text in [("greet.sh", GREET), ("test.sh", TEST), ("Makefile", MAKEFILE)]:
            with open(os.path.join(project, name), "w") as f:
                f.write(text)
        kits = {}
        for kit, findings in [("kit-a", FINDINGS_A), ("kit-b", FINDINGS_B)]:
            d = os.path.join(self.root, kit)
            os.makedirs(d)
            for kind, content in list(ARTIFACTS.items()) + [("findings", findings)]:
                with open(os.path.join(d, kind + ".json"), "w") as f:
                    json.dump(content, f)
            kits[kit] = d
        patch = os.path.join(self.root, "change.diff")
        with open(patch, "w") as f:
            f.write(PATCH)
        implement = os.path.join(self.root, "implement.sh")
        with open(implement, "w") as f:
            f.write(f'#!/bin/sh\nset -e\ngit apply {patch}\nexec "$ROOM_BRIDGE" agent-script --steps read,claim,diff,done\n')
        os.chmod(implement, 0o755)
        return project, kits, implement

    def close(self):
        if self.daemon.poll() is None:
            self.daemon.terminate()
            self.daemon.wait(timeout=20)
        self.tmp.cleanup()


class Checks:
    def __init__(self, page, axe, out):
        self.page, self.axe, self.out = page, axe, out
        self.shots = []

    def view(self, name):
        """No violation of the page's own policy, axe-core on the page as it stands, then a screenshot."""
        csp = self.page.evaluate("window.__csp")
        assert not csp, f"{name}: content security policy violations: {csp}"
        result = self.page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
        bad = [v for v in result["violations"] if v.get("impact") in SERIOUS]
        assert not bad, f"{name}: accessibility violations: " + json.dumps(
            [{"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"][:3]]} for v in bad], indent=1)
        path = os.path.join(self.out, f"{len(self.shots) + 1:02d}-{name}.png")
        self.page.screenshot(path=path, full_page=True)
        self.shots.append(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("room")
    ap.add_argument("--axe", required=True)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out", default=os.path.join("target", "dashboard"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    fx = Fixture(os.path.realpath(a.room))
    try:
        run(fx, a)
    finally:
        fx.close()
    print("dashboard ok")


def run(fx, a):
    project_dir, kits, implement = fx.materials()
    project = fx.run("project", "open", project_dir)["id"]
    alpha = fx.run("agent", "enroll", "alpha", "--max-tier", "coordinator")["token"]
    fx.run("create", "coord", "--member", "alpha")
    for i in range(60):
        fx.say(alpha, "coord", f"message {i + 1}")
    # one with causal parents on the same page: drawn
    events = fx.run("log", "coord")["events"]
    fx.say(alpha, "coord", "after 58 and 59", parents=[events[-2]["id"], events[-1]["id"]])
    # a routed agent whose worker runs until it is stopped
    beta = fx.run("agent", "enroll", "beta")["token"]
    fx.run("agent", "enroll", "gamma")
    fx.run("route", "set", "gamma", "--adapter", "script", "--steps", "read,hang")
    fx.run("create", "work", "--member", "beta", "--member", "gamma")
    link = fx.run("dashboard")["url"]
    assert link.startswith(fx.base + "/login?code="), link
    # room doctor finds the listener the dashboard is on
    checks = {c["check"]: c for c in fx.run("doctor", check=False)["checks"]}
    assert checks["http"]["status"] == "ok" and fx.base[len("http://"):] in checks["http"]["detail"], checks["http"]

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=a.chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        # the page runs under its own policy (its own script and styles only); axe-core and a
        # recorder of that policy's violations come in as init scripts, which it does not cover
        ctx = browser.new_context(viewport={"width": 1366, "height": 800})
        ctx.add_init_script(path=a.axe)
        ctx.add_init_script(script="window.__csp = []; document.addEventListener('securitypolicyviolation', "
                                   "(e) => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI));")
        page = ctx.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: d.accept())
        c = Checks(page, a.axe, a.out)

        # no session yet: the page says how to get one
        page.goto(fx.base + "/")
        expect(page.get_by_role("heading", name="Not logged in")).to_be_visible()

        # the one-time link: logged in, and the code is spent
        page.goto(link)
        expect(page.get_by_role("heading", name="Rooms")).to_be_visible()
        expect(page.locator("#conn")).to_have_text("live")
        cookies = ctx.cookies()
        port = fx.base.rsplit(":", 1)[1]
        session = [k for k in cookies if k["name"] == f"room_session_{port}"][0]
        assert session["httpOnly"] and session["sameSite"] == "Strict", session
        # the page key left the address bar; the page holds it in its origin's storage
        assert "#k=" not in page.url, page.url
        assert page.evaluate("localStorage.getItem('room-dashboard-key')")
        c.view("rooms")
        other = browser.new_context()
        op = other.new_page()
        r = op.goto(link)
        assert r.status == 401, r.status
        other.close()

        # a long timeline is paged, never loaded whole; causal parents are drawn
        page.get_by_role("link", name="coord").click()
        expect(page.get_by_role("heading", name="Room coord")).to_be_visible()
        expect(page.locator("li.ev")).to_have_count(50)
        expect(page.get_by_text("message 60", exact=True)).to_be_visible()
        expect(page.locator("svg#edges path")).to_have_count(2)
        assert page.evaluate("document.getElementById('edges') instanceof SVGSVGElement")
        assert page.locator("svg#edges path").first.bounding_box()["height"] > 0, "the edge is drawn"
        expect(page.get_by_text("message 5", exact=True)).to_have_count(0)
        page.get_by_role("button", name="Older 50").click()
        expect(page.get_by_text("message 5", exact=True)).to_be_visible()
        c.view("room")
        # a new event appears without a reload
        page.evaluate("window.__kept = 1")
        page.get_by_role("button", name="Newest").click()
        fx.say(alpha, "coord", "said while you watch")
        expect(page.get_by_text("said while you watch")).to_be_visible(timeout=15000)
        # a refusal the journal holds (an assignment declined) is marked in place
        t = fx.agent(alpha, "task_create", {"room": "coord", "title": "not mine to do", "to": "alpha"})
        assert t["ok"], t
        fx.say(alpha, "coord", "this is not mine", verb="decline", task=t["result"]["task"]["id"])
        expect(page.locator("li.ev.refusal", has_text="declined").first).to_be_visible(timeout=15000)

        # the create dialog: Collaborative first, a backend and model per seat
        page.get_by_role("link", name="Collaborations").click()
        expect(page.get_by_role("heading", name="Collaborations")).to_be_visible()
        c.view("collaborations")
        page.get_by_role("button", name="New collaboration").click()
        dlg = page.locator("dialog")
        expect(dlg.get_by_label("Collaborative: several models in roles")).to_be_checked()
        dlg.get_by_label("Goal").fill("greet.sh learns --verbose")
        dlg.get_by_label("Project").select_option(project)
        steps = lambda kit: f"read,claim,fulfil:{kits[kit]},done"
        for seat, adapter, model in [
            ("architecture", "script", steps("kit-a")),
            ("search", "script", steps("kit-a")),
            ("reasoning", "command", implement),
            ("review", "script", steps("kit-a")),
            ("review-2", "script", steps("kit-b")),
        ]:
            dlg.get_by_label(f"{seat} backend").select_option(adapter)
            dlg.get_by_label(f"{seat} model").fill(model)
        # an adapter whose tool denial is advisory is flagged
        orch = dlg.locator(".row", has=page.get_by_label("orchestrator backend"))
        expect(orch.get_by_text("advisory confinement")).to_have_count(0)
        dlg.get_by_label("orchestrator backend").select_option("acp")
        expect(orch.get_by_text("advisory confinement")).to_be_visible()
        # the model picker offers what the backend has: an ACP backend's presets
        offered = page.eval_on_selector_all("#models-orchestrator option", "os => os.map(o => o.value)")
        assert "claude" in offered, offered
        dlg.get_by_label("orchestrator backend").select_option("script")
        expect(page.locator("#models-orchestrator option")).to_have_count(0)
        dlg.get_by_label("orchestrator backend").select_option("")
        c.view("create-dialog")
        dlg.get_by_role("button", name="Start").click()
        page.wait_for_timeout(500)
        assert not dlg.is_visible(), "the start was refused: " + dlg.inner_text()
        expect(page.get_by_role("heading", name="Collaboration", exact=False).first).to_be_visible()
        page.evaluate("window.__kept = 2")

        # phases advance while the page is watched, with no reload
        collab = page.url.rsplit("/", 1)[1]

        def done(*phases):
            try:
                for phase in phases:
                    expect(page.locator(f'.phase[data-phase="{phase}"]')).to_have_class("phase done", timeout=120000)
            except AssertionError:
                status = fx.run("collab", "status", collab, check=False)
                print(json.dumps({k: status.get(k) for k in ("state", "phases", "runs", "flags")}, indent=1)[:6000])
                raise

        done("spec")
        # the search role's dispatch waits for the person, with its full delegation input
        expect(page.get_by_role("heading", name="Waiting for you (1)")).to_be_visible(timeout=60000)
        expect(page.locator("#approval-count")).to_have_text("1")
        c.view("collaboration-waiting")
        page.get_by_role("link", name="Approvals").click()
        expect(page.get_by_role("heading", name="Approvals")).to_be_visible()
        expect(page.locator(".approval")).to_have_count(1)
        expect(page.locator(".approval pre")).to_contain_text("research")
        c.view("approvals")
        # this one is approved with a revised prompt: the child gets the person's words
        card = page.locator(".approval")
        card.get_by_text("Revise the prompt").click()
        card.get_by_label("Prompt to approve instead").fill("Research how shell scripts take a --verbose flag.")
        card.get_by_role("button", name="Approve revised").click()
        # decided, it leaves the queue (the next phase's dispatch may already wait behind it:
        # a fast run reaches the implementation's approval within this wait)
        expect(page.get_by_role("heading", name="research (run 1) pending")).to_have_count(0, timeout=30000)
        decided = [x for x in fx.run("collab", "status", collab)["approvals"] if x["state"] != "pending"]
        assert [(x["state"], x["note"].split(":")[0]) for x in decided] == [("approved", "revised")], decided
        assert "a --verbose flag" in decided[0]["note"], decided
        page.go_back()
        # every dispatch that waits for the person is approved here, as it comes, until the
        # last phase (the person's approval of the diff) is done
        approved = 1
        deadline = time.time() + 300
        phase = page.locator('.phase[data-phase="approval"]')
        while "done" not in (phase.get_attribute("class") or ""):
            assert time.time() < deadline, "the collaboration did not finish"
            waiting = page.locator(".approval").get_by_role("button", name="Approve", exact=True)
            if waiting.count():
                waiting.first.click()
                approved += 1
                page.wait_for_timeout(500)
            else:
                page.wait_for_timeout(250)
        done("research", "architecture", "implementation", "gate", "review", "approval")
        assert approved >= 3, approved
        # the panel: both reviewers, their findings side by side
        expect(page.get_by_label("findings of review-2")).to_contain_text("--verbose is in no usage line")
        expect(page.get_by_label("findings of review", exact=True)).to_contain_text("move to getopts")
        # each finding only one reviewer made is a disagreement, shown with both columns
        expect(page.get_by_role("heading", name="Disagreements (2): kept, never voted")).to_be_visible()
        c.view("collaboration")
        # a diff is shown as a diff
        page.get_by_role("button", name="View diff").first.click()
        expect(page.locator(".diff .add").first).to_be_visible()
        c.view("artifact-diff")
        assert page.evaluate("window.__kept") == 2, "the page reloaded"

        # a task with its lineage, lease and acceptance rendered
        page.get_by_role("link", name=page.locator("dl.kv a[href^='#/task/']").inner_text()).click()
        expect(page.get_by_role("heading", name="Task")).to_be_visible()
        expect(page.get_by_role("heading", name="Lineage")).to_be_visible()
        expect(page.locator("table").first).to_contain_text("this")
        expect(page.get_by_role("heading", name="Lease")).to_be_visible()
        page.get_by_role("button", name="Measure acceptance now").click()
        expect(page.get_by_role("heading", name="Measured now")).to_be_visible()
        c.view("task")

        # a worker in its owned job: its live processes, then the owner's cancel stops it at zero
        fx.say(beta, "work", "gamma, look at this", verb="send", to=["gamma"])
        page.get_by_role("link", name="Sessions").click()
        expect(page.get_by_role("heading", name="Sessions and workers")).to_be_visible()
        worker = page.locator("tr", has_text="gamma").filter(has=page.locator("code"))
        expect(worker.first).to_be_visible(timeout=60000)
        expect(worker.first.locator("td").nth(5)).not_to_have_text("0", timeout=30000)
        c.view("sessions")
        page.get_by_role("link", name="Wakes").click()
        expect(page.get_by_role("heading", name="Wakes")).to_be_visible()
        expect(page.locator("tr", has_text="gamma").locator(".state")).to_have_text("dispatched")
        c.view("wakes")
        page.locator("tr", has_text="gamma").get_by_role("link").first.click()
        expect(page.get_by_role("heading", name="Wake permit")).to_be_visible()
        expect(page.get_by_text("the sealed fields match their digest")).to_be_visible()
        c.view("wake")
        page.goto(fx.base + "/#/room/work")
        expect(page.get_by_role("heading", name="Room work")).to_be_visible()
        page.get_by_role("button", name="Cancel all work").click()
        page.get_by_role("link", name="Sessions").click()
        expect(page.locator("tr", has_text="gamma").filter(has=page.locator(".state.done"))).to_be_visible(timeout=60000)
        expect(page.locator("table").first).to_contain_text("none")
        # what the cancel held until reconciled (nothing reached a destination here: none)
        page.goto(fx.base + "/#/room/work")
        page.get_by_role("button", name="Show holds").click()
        expect(page.get_by_role("heading", name="Held until reconciled (0 unresolved)")).to_be_visible()
        c.view("holds")

        # revoke an agent from the identity tree; its next call is refused
        page.get_by_role("link", name="Identity").click()
        expect(page.get_by_role("heading", name="Identity")).to_be_visible()
        c.view("identity")
        assert fx.agent(alpha, "whoami", {})["ok"]
        page.get_by_role("button", name="Revoke alpha", exact=True).click()
        expect(page.locator(".tree > li", has_text="alpha").first.locator(".state.revoked")).to_be_visible()
        r = fx.agent(alpha, "whoami", {})
        assert not r["ok"] and r["refusal"]["code"] == "credential_revoked", r

        # keyboard: the skip link and the navigation reach the main view
        page.locator(".skip").focus()
        box = page.locator(".skip").bounding_box()
        assert box and box["x"] >= 0, f"the skip link shows when focused: {box}"
        page.keyboard.press("Tab")
        expect(page.get_by_role("link", name="Room", exact=True)).to_be_focused()
        page.keyboard.press("Tab")
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name="Rooms")).to_be_focused()
        page.get_by_role("link", name="Identity").click()
        expect(page.get_by_role("heading", name="Identity")).to_be_visible()

        # no agent credential anywhere in the page
        html = page.content()
        assert alpha[len("room_tok_"):] not in html

        # the daemon goes away: the page says so
        fx.daemon.terminate()
        fx.daemon.wait(timeout=20)
        page.get_by_role("link", name="Rooms").click()
        expect(page.locator("#banner")).to_contain_text("not answering", timeout=30000)
        c.view("unreachable")
        assert not errors, errors
        browser.close()
    print(f"screenshots: {', '.join(c.shots)}")


if __name__ == "__main__":
    sys.exit(main())

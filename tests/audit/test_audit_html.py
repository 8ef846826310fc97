"""The HTML form of `room audit TASK` in a real browser: Debian's Chromium, driven by Playwright (Python).

`room audit TASK --html FILE` writes one self-contained page a person can send. The test opens
that file from disk with every request recorded and every request but the document's own
refused, and checks that the page asked for nothing else (no style sheet, font, image, frame or
script from anywhere), holds no script element and no element that would load something, logged
no console error, has a title, and shows the verdict it is expected to show in its verdict
heading. With --axe, axe-core is run on the page as well (no serious or critical violation), in
the light and the dark color scheme. A screenshot is saved as OUT/audit.png when --out is given.

usage: test_audit_html.py HTML_FILE [--chromium /usr/bin/chromium] [--out DIR] [--expect-verdict VERDICT]
                          [--axe AXE_MIN_JS]
"""

import argparse
import json
import os
import pathlib
import re
import sys

from playwright.sync_api import expect, sync_playwright

SERIOUS = ("serious", "critical")

# elements and attributes through which a page loads something; the page should have none
LOADERS = ("script, link, img, iframe, frame, object, embed, video, audio, source, track, picture, base, form, "
           "[src], [srcset], [href], [background], [poster]")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("html")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--out")
    ap.add_argument("--expect-verdict")
    ap.add_argument("--axe")
    a = ap.parse_args()
    if not os.path.isfile(a.html):
        print(f"audit html: no such file: {a.html}", file=sys.stderr)
        return 2
    try:
        run(a)
    except AssertionError as e:
        print(f"audit html: {e}", file=sys.stderr)
        return 1
    print("audit html ok")
    return 0


def run(a):
    url = pathlib.Path(a.html).resolve().as_uri()
    with sync_playwright() as p:
        # no background traffic of the browser's own, so any request seen is the page's
        browser = p.chromium.launch(executable_path=a.chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            check(browser, url, a)
        finally:
            browser.close()


def check(browser, url, a):
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    if a.axe:
        # an init script is not a <script> element and is outside the page's policy
        ctx.add_init_script(path=a.axe)
    requests, refused, errors = [], [], []

    def only_the_document(route):
        if route.request.url == url:
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    ctx.route("**/*", only_the_document)
    page = ctx.new_page()
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url, wait_until="load")
    # a late load (a lazy image, a font a style asks for) would come after "load"
    page.wait_for_timeout(500)

    assert requests == [url], f"the page made requests beyond itself: {json.dumps(requests, indent=1)}"
    assert not refused, f"requests were refused: {json.dumps(refused, indent=1)}"
    assert not errors, f"console errors: {json.dumps(errors, indent=1)}"
    assert page.title().strip(), "the page has no title"
    assert page.locator("script").count() == 0, "the page has a <script> element"
    loaders = page.eval_on_selector_all(LOADERS, "els => els.map(e => e.outerHTML.slice(0, 120))")
    assert not loaders, f"elements that load something: {json.dumps(loaders, indent=1)}"
    assert page.evaluate("document.documentElement.lang"), "the page declares no language"
    assert page.evaluate("performance.getEntriesByType('resource').length") == 0, "the page loaded resources"

    heading = page.get_by_role("heading", name=re.compile(r"^\s*Verdict:"))
    expect(heading).to_be_visible()
    if a.expect_verdict:
        shown = heading.inner_text()
        # a word of its own: "proven" is not found in "unproven"
        assert re.search(r"(?<![\w-])" + re.escape(a.expect_verdict) + r"(?![\w-])", shown), \
            f"the verdict shown is {shown!r}, expected {a.expect_verdict!r}"
        expect(heading.get_by_text(a.expect_verdict, exact=True)).to_be_visible()

    if a.axe:
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            accessible(page, scheme)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        page.emulate_media(color_scheme="light")
        page.screenshot(path=os.path.join(a.out, "audit.png"), full_page=True)
    ctx.close()


def accessible(page, scheme):
    """axe-core on the page as it stands: no serious or critical violation."""
    result = page.evaluate("async () => await axe.run(document, {resultTypes: ['violations']})")
    bad = [v for v in result["violations"] if v.get("impact") in SERIOUS]
    assert not bad, f"{scheme}: accessibility violations: " + json.dumps(
        [{"id": v["id"], "impact": v["impact"], "nodes": [n["target"] for n in v["nodes"][:3]]} for v in bad], indent=1)


if __name__ == "__main__":
    sys.exit(main())

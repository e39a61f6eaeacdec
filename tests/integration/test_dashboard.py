"""The dashboard in a real browser: headless Chromium loads the page a real head serves, runs its script
against the API with the token `gpupool ui` puts in the address, and the DOM it leaves is read back."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support import plain_http
from tests.support.browser import Page
from tests.support.server import ServerProcess

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def browser() -> str:
    """A Chromium binary. In CI it must exist (.ci/run installs Debian's chromium): missing, it fails."""
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("Chromium is not installed; .ci/run installs Debian's chromium package")
    pytest.skip("Chromium not installed (apt-get install chromium)")


def render(browser: str, url: str, profile: Path) -> str:
    """The page's DOM once its scripts ran and their requests were answered (virtual time runs ahead
    while the page is idle, so this takes about as long as the page's own work)."""
    done = subprocess.run(
        [
            browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
            f"--user-data-dir={profile}", "--virtual-time-budget=8000", "--dump-dom", url,
        ],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


class Rows(HTMLParser):
    """Each table row's cells as text, by its data-* attribute (data-queue="nlp": ("queue", "nlp"))."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[tuple[str, str], list[str]] = {}
        self.text: list[str] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._error = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            keys = [(k[5:], v or "") for k, v in attrs if k.startswith("data-")]
            if keys:
                self._row = self.rows[keys[0]] = []
        elif tag == "td" and self._row is not None:
            self._cell = []
        elif tag == "div" and ("id", "error") in attrs:
            self._error = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr":
            self._row = None
        elif tag == "div":
            self._error = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        if self._error:
            self.text.append(data)


def _endpoint(server: ServerProcess, workload_id: int, timeout: float = 15.0) -> str:
    """The running service's address, once its process runs (the attempt is stored before it is launched,
    its address after)."""
    deadline = time.time() + timeout
    while not (endpoint := server.workload(workload_id)["endpoint"]):
        assert time.time() < deadline, server.workload(workload_id)
        time.sleep(0.05)
    return str(endpoint)


def parse(dom: str) -> Rows:
    rows = Rows()
    rows.feed(dom)
    return rows


def line(dom: str, element_id: str) -> str:
    """The text of the page's element of that id (a div or span holding text alone)."""
    found = re.search(rf'<(div|span)[^>]* id="{element_id}"[^>]*>([^<]*)</\1>', dom)
    assert found is not None, element_id
    return found.group(2).strip()


def test_the_page_is_served_without_a_token_and_holds_no_data(server: ServerProcess) -> None:
    page = plain_http.get(f"{server.url}/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    # the page's own script alone runs, by its hash (the rest of this test shows it runs): none injected
    assert "script-src 'sha256-" in page.headers["content-security-policy"]
    assert "script-src 'unsafe-inline'" not in page.headers["content-security-policy"]
    assert server.token not in page.text
    assert plain_http.get(f"{server.url}/", follow_redirects=False).headers["location"] == "/ui"
    assert plain_http.get(f"{server.url}/api/v1/queues").status_code == 401  # the data still needs the token
    refused = server.cli("--token", "nope", "ui")
    assert refused.returncode == 1 and "invalid token" in refused.stderr and "/ui" not in refused.stdout


def test_the_dashboard_shows_queues_nodes_and_why_work_waits_in_a_real_browser(
    server: ServerProcess, browser: str, tmp_path: Path
) -> None:
    server.cli(
        "queue", "create", "nlp", "--gpu-quota", "2", "--gpu-limit", "3", "--budget", "1000", check=True
    )  # fmt: skip
    running = server.submit(
        {"name": "train", "queue": "nlp", "resources": {"gpu": 2}, "commands": ["sleep 60"]}
    )
    half = server.submit(
        {"name": "half", "queue": "nlp", "resources": {"gpu": 0.5}, "commands": ["sleep 60"]}
    )
    huge = server.submit({"name": "huge", "resources": {"gpu": 16}, "commands": ["true"]})
    web = server.submit({"kind": "service", "name": "web", "resources": {"gpu": 1}, "commands": ["sleep 60"]})
    sweep = server.submit({"name": "sweep", "array": "0-1%1", "commands": ["sleep 60"]})
    after = server.submit(
        {"name": "next", "resources": {"gpu": 1}, "commands": ["true"], "after": [sweep["id"]]}
    )
    server.wait_for(running["id"], ("running",))
    server.wait_for(half["id"], ("running",))
    server.wait_for(web["id"], ("running",))
    endpoint = _endpoint(server, web["id"])
    server.wait_for_reason(huge["id"])
    held = server.wait_for_reason(sweep["array_ids"][1])
    assert held["reason_code"] == "array-limit", held
    assert server.wait_for_reason(after["id"])["reason_code"] == "dependency"
    url = server.cli("ui", check=True).stdout.strip()
    assert url == f"{server.url}/ui#token={server.token}"

    dom = render(browser, url, tmp_path / "profile")
    shown = parse(dom)

    assert not "".join(shown.text).strip(), shown.text
    nlp = shown.rows[("queue", "nlp")]
    # quota, GPU limit, fair share, allocated: half a GPU as written, 2.5 (not 2.50)
    assert nlp[:5] == ["nlp", "2", "3", "2.5", "2.5"], nlp
    assert nlp[8].endswith(" of 1000 a month"), nlp  # its budget, as the head last counted it
    # huge's 16 GPUs, which never fit, and next's 1, which waits on its dependency: no fair share counts them
    default = shown.rows[("queue", "default")]
    assert default[2] == "-" and default[5] == "17 (17 held back)", default
    held_back = re.search(r'title="(held back: [^"]*)"', dom)
    assert held_back is not None and "reclaiming GPUs from other queues cannot fix" in held_back.group(1)
    assert "a size or GPU model the pool cannot give" in held_back.group(1)
    assert shown.rows[("node", "node-1")][1] == "ready"
    assert shown.rows[("node", "node-1")][3:5] == ["8 x H100", "4 / 8"]  # train, half and web
    train = shown.rows[("workload", str(running["id"]))]
    assert train[1:7] == ["train", "job", "nlp", "admin", "running", "2"] and train[10] == ""
    assert re.fullmatch(r"\d+s", train[7]) and train[8] == "node-1", train  # its age, as ps says it
    assert shown.rows[("workload", str(half["id"]))][6] == "0.5"
    service = shown.rows[("workload", str(web["id"]))]
    assert service[2] == "service" and service[10] == endpoint and endpoint.startswith("127.0.0.1:")
    waiting = shown.rows[("workload", str(huge["id"]))]
    assert waiting[5] == "pending" and "can never fit this pool" in waiting[11]
    first, second = (shown.rows[("workload", str(wid))] for wid in sweep["array_ids"])
    assert first[1:6] == ["sweep[0]", "job", "default", "admin", "running"]
    assert second[1] == "sweep[1]" and "runs at most 1 of its tasks at once" in second[11]
    usage = shown.rows[("usage", "nlp")]  # train's GPU-hours so far, out of a quota of 2 GPUs
    assert usage[0] == "nlp" and usage[1] not in ("", "0.00") and usage[3] == "" and usage[4] == "0%", usage
    waits = shown.rows[("workload", str(after["id"]))]
    assert f"waits for array {sweep['id']} (sweep) to succeed" in waits[11]
    assert line(dom, "work-note") == ""  # all of it is shown
    assert line(dom, "who-name") == "admin (admin)"
    server.cli(
        "cancel", *(str(w["id"]) for w in (running, half, huge, web, sweep)), check=True
    )  # fmt: skip


def test_past_a_thousand_active_workloads_the_longest_waiting_stays_and_the_page_says_what_it_left_out(
    server: ServerProcess, browser: str, tmp_path: Path
) -> None:
    oldest = server.submit({"name": "huge", "resources": {"gpu": 16}, "commands": ["true"]})
    with server.http() as client:  # 1,000 tasks, held: newer than huge, and more than one page of 1,000
        response = client.post(
            "/api/v1/workloads", params={"hold": "true"},
            json={"name": "sweep", "array": "0-999", "commands": ["true"]},
        )  # fmt: skip
        assert response.status_code == 201, response.text
    tasks = response.json()["array_ids"]

    dom = render(browser, server.cli("ui", check=True).stdout.strip(), tmp_path / "profile")
    shown = parse(dom)

    assert ("workload", str(oldest["id"])) in shown.rows  # the longest-waiting work never vanishes
    assert ("workload", str(tasks[0])) in shown.rows and ("workload", str(tasks[-1])) not in shown.rows
    assert sum(key == "workload" for key, _ in shown.rows) == 1000
    note = line(dom, "work-note")
    assert note.startswith("showing 1,000 of 1,001 active workloads: all running work and the pending"), note


def test_a_warning_node_shows_its_health_and_the_evidence(
    server: ServerProcess, browser: str, tmp_path: Path
) -> None:
    server.cli("node", "inject-fault", "node-1", "--gpu", "0", "--throttle", "thermal", check=True)
    deadline = time.time() + 30
    while (node := server.cli("nodes", "--json", check=True).stdout).count('"warning"') == 0:
        assert time.time() < deadline, node
        time.sleep(0.2)

    dom = render(browser, server.cli("ui", check=True).stdout.strip(), tmp_path / "profile")
    row = parse(dom).rows[("node", "node-1")]

    assert row[1:3] == ["ready", "warning"], row  # in service, and running hot
    assert "GPU 0: thermal throttling" in row[7] and "C > 85 C" in row[7], row
    assert re.search(r'class="health-warning" title="[^"]*GPU 0: thermal throttling', dom)


def test_a_refused_token_says_so_and_shows_no_pool(
    server: ServerProcess, browser: str, tmp_path: Path
) -> None:
    dom = render(browser, f"{server.url}/ui#token=not-a-token", tmp_path / "profile")
    shown = parse(dom)
    assert "the token was refused (401)" in "".join(shown.text)
    assert line(dom, "status") == "not signed in: the token was refused"  # not "loading..."
    assert not shown.rows


def test_the_page_says_who_is_signed_in_and_forgets_the_token_when_asked(
    server: ServerProcess, browser: str, tmp_path: Path
) -> None:
    made = server.cli("token", "create", "bob", "--role", "viewer", check=True)
    page = Page(browser, f"{server.url}/ui#token={made.stdout.splitlines()[-1]}", tmp_path / "viewer")
    try:
        who = "document.getElementById('who')"
        assert page.wait_for(f"{who} && !{who}.hidden && {who}.textContent.replace(/\\s+/g, ' ').trim()") == (
            "signed in as bob (viewer) · forget token"
        )
        page.evaluate("document.getElementById('forget').click()")
        assert page.evaluate("localStorage.getItem('gpupool-token')") is None
        assert page.evaluate(f"{who}.hidden && document.getElementById('pool').hidden")
        assert not page.evaluate("document.getElementById('login').hidden")
        assert page.evaluate("document.querySelectorAll('#workloads tbody tr, #queues tbody tr').length") == 0
        assert page.evaluate("document.getElementById('status').textContent") == (
            "the token is forgotten: this browser no longer keeps it"
        )
    finally:
        page.close()


def _menu(workload_id: int, action: str) -> str:
    return f'document.querySelector(\'tr[data-workload="{workload_id}"] select[data-action="{action}"]\')'


def _button(workload_id: int, action: str) -> str:
    return f'document.querySelector(\'tr[data-workload="{workload_id}"] button[data-action="{action}"]\')'


def test_work_is_held_released_and_cancelled_from_the_dashboard_by_those_allowed_to(
    server: ServerProcess, browser: str, tmp_path: Path
) -> None:
    server.cli("queue", "create", "nlp", check=True)
    train = server.submit({"name": "train", "resources": {"gpu": 2}, "commands": ["sleep 60"]})
    huge = server.submit({"name": "huge", "resources": {"gpu": 16}, "commands": ["true"]})
    wide = server.submit({"name": "wide", "resources": {"gpu": 16}, "commands": ["true"]})
    server.wait_for(train["id"], ("running",))
    page = Page(browser, server.cli("ui", check=True).stdout.strip(), tmp_path / "admin")
    try:
        page.wait_for(f"{_button(train['id'], 'hold')} !== null")
        page.evaluate(f"{_button(train['id'], 'hold')}.click()")
        server.wait_until(train["id"], lambda w: w["held"] and w["state"] == "pending")
        assert (
            page.wait_for("document.getElementById('notice').textContent") == f"hold: {train['id']} (train)"
        )
        page.wait_for(f"{_button(train['id'], 'release')} !== null")  # the page shows it held
        page.evaluate(f"{_button(train['id'], 'release')}.click()")
        server.wait_until(train["id"], lambda w: not w["held"] and w["state"] == "running")
        page.wait_for(f"{_button(train['id'], 'requeue')} !== null")
        page.evaluate(f"{_button(train['id'], 'requeue')}.click()")
        server.wait_until(train["id"], lambda w: w["attempts"] == 3 and w["state"] == "running")

        # Cancel takes a second click: the first only arms the button.
        page.evaluate(f"{_button(huge['id'], 'cancel')}.click()")
        assert page.evaluate(f"{_button(huge['id'], 'cancel')}.textContent") == "confirm cancel"
        time.sleep(1.0)
        assert server.workload(huge["id"])["state"] == "pending"
        page.evaluate(f"{_button(huge['id'], 'cancel')}.click()")
        assert server.wait_for(huge["id"])["state"] == "cancelled"

        # Waiting work moves to another queue, and any work gets another priority, from two menus.
        for action, value in (("queue", "nlp"), ("priority", "100")):
            menu = _menu(wide["id"], action)
            page.wait_for(f"{menu} !== null && !{menu}.disabled")
            page.evaluate(f"{menu}.value = '{value}'; {menu}.dispatchEvent(new Event('change'))")
            said = f"{action} {value}: {wide['id']} (wide)"
            assert page.wait_for(f"document.getElementById('notice').textContent === '{said}'")
        moved = server.workload(wide["id"])
        assert (moved["queue"], moved["priority"]) == ("nlp", 100), moved
        assert page.evaluate(f"{_menu(train['id'], 'queue')} === null")  # running work does not move
    finally:
        page.close()

    made = server.cli("token", "create", "bob", "--role", "viewer", check=True)
    viewer = Page(browser, f"{server.url}/ui#token={made.stdout.splitlines()[-1]}", tmp_path / "viewer")
    try:
        cancel = _button(train["id"], "cancel")
        viewer.wait_for(f"{cancel} !== null")
        viewer.evaluate(f"{cancel}.click(); {cancel}.click()")
        said = viewer.wait_for("document.getElementById('notice').textContent")
        assert said.startswith(f"cancel {train['id']} refused: ") and "viewer" in said, said
        assert viewer.evaluate("document.getElementById('notice').className") == "error"
    finally:
        viewer.close()
    assert server.workload(train["id"])["state"] in ("pending", "running")  # the viewer changed nothing
    server.cli("cancel", str(train["id"]), str(wide["id"]), check=True)

"""The web UI, driven in a real headless browser (Debian's chromium and chromium-driver, through
selenium) against a real node: log in, watch a queue's depth change after a publish, browse,
purge, close a connection; and the HTTP rules the UI's files are served under.

The browser and its driver are one per module, quit by the fixture's finalizer whatever the
tests do. Waits are WebDriverWait with bounded timeouts on what the page shows; the page
refreshes by itself every 5 s, so a change made outside it (a pika publish) shows within one
refresh. Screenshots of the overview and the cluster page go to MAXQ_UI_SCREENSHOT_DIR when set
(docs/ui-overview.png and docs/ui-cluster.png were taken so, against a 3-node cluster:
MAXQ_TEST_CLUSTER=3), else to the test's tmp_path.
"""

from __future__ import annotations

import http.client
import os
import shutil
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pytest
from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import Select, WebDriverWait

from ..helpers import api, wait_for

PAGE_TIMEOUT_S = 15.0  # a page element appears within this (three refreshes)
BROWSER_START_TIMEOUT_S = 30.0


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    """A headless chromium driven by chromedriver; quit (browser and driver) when the module ends."""
    browser_path = _find("chromium", "chromium-browser", "google-chrome")
    driver_path = _find("chromedriver")
    if browser_path is None or driver_path is None:
        pytest.skip("no chromium with chromedriver found (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for argument in ("--headless=new", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    if os.geteuid() == 0:
        options.add_argument("--no-sandbox")  # chromium refuses to run as root with its sandbox
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # chromium keeps its profile and its singleton socket folder (org.chromium.Chromium.*) under
    # TMPDIR and leaves the latter behind after quit: both go to the test's own temporary folder.
    browser_tmp = tmp_path_factory.mktemp("chromium")
    options.add_argument(f"--user-data-dir={browser_tmp / 'profile'}")
    service = webdriver.ChromeService(executable_path=driver_path, env={**os.environ, "TMPDIR": str(browser_tmp)})
    browser = webdriver.Chrome(options=options, service=service)
    try:
        browser.set_page_load_timeout(BROWSER_START_TIMEOUT_S)
        browser.set_script_timeout(PAGE_TIMEOUT_S)
        yield browser
    finally:
        browser.quit()  # ends chromium and stops chromedriver


@pytest.fixture
def ui(driver, broker):
    """The driver, with the UI's page open; after the test, the page's console has no errors
    (a Content-Security-Policy refusal or a script error is one)."""
    base = f"http://127.0.0.1:{broker.http_port}"
    driver.get(base + "/")
    driver.get_log("browser")  # drop what earlier tests left
    yield Page(driver, base)
    errors = [
        entry["message"]
        for entry in driver.get_log("browser")
        if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]
    ]
    assert not errors, errors


class Page:
    def __init__(self, driver, base: str) -> None:
        self.driver = driver
        self.base = base
        self.wait = WebDriverWait(driver, PAGE_TIMEOUT_S)

    def element(self, css: str):
        return self.wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, css)))

    def text_of(self, css: str, predicate, what: str) -> str:
        """The text of `css` once `predicate(text)` holds (bounded by PAGE_TIMEOUT_S)."""

        def seen(driver):
            try:
                text = driver.find_element(By.CSS_SELECTOR, css).text
            except Exception:  # not there yet, or replaced by a refresh while read
                return False
            return text if predicate(text) else False

        return self.wait.until(seen, message=f"waiting for {what}")

    def click(self, by: str, value: str, what: str) -> None:
        """Click an element of the page's live part, found again if a refresh replaced it between
        finding and clicking (bounded by PAGE_TIMEOUT_S)."""

        def clicked(driver) -> bool:
            try:
                driver.find_element(by, value).click()
            except (NoSuchElementException, StaleElementReferenceException):
                return False
            return True

        self.wait.until(clicked, f"clicking {what}")

    def log_in(self, username: str = "guest", password: str = "guest") -> None:
        self.driver.get(self.base + "/")
        self.driver.execute_script("sessionStorage.clear()")
        self.driver.refresh()
        name = self.element("#login-username")
        name.clear()
        name.send_keys(username)
        self.driver.find_element(By.ID, "login-password").send_keys(password)
        self.driver.find_element(By.ID, "login-button").click()

    def open(self, hash_path: str) -> None:
        self.driver.get(self.base + "/#/" + hash_path)

    def accept_confirm(self) -> None:
        self.wait.until(ec.alert_is_present()).accept()

    def screenshot(self, name: str, tmp_path: Path) -> Path:
        folder = Path(os.environ.get("MAXQ_UI_SCREENSHOT_DIR") or tmp_path)
        target = folder / name
        assert self.driver.save_screenshot(str(target))
        return target


# ----------------------------------------------------------------------- HTTP, no browser


def _get(broker, path: str, host: str | None = None) -> tuple[int, dict[str, str], bytes]:
    """(status, headers by lower-case name, body) of a GET without credentials."""
    conn = http.client.HTTPConnection("127.0.0.1", broker.http_port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host} if host else {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_the_ui_is_served_without_credentials_with_a_strict_policy(broker):
    status, headers, body = _get(broker, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'src="/ui/app.js"' in body
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    status, headers, _ = _get(broker, "/ui/app.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript")
    assert _get(broker, "/ui/no-such.js")[0] == 404
    assert _get(broker, "/ui/..%2fadmin.py")[0] == 404
    assert _get(broker, "/favicon.ico")[0] == 204  # asked for by browsers on their own
    # the API is as it was: credentials wanted, the Host checked for the page too
    assert api(broker, "GET", "/api/overview", auth=None)[0] == 401
    assert _get(broker, "/", host="evil.example")[0] == 403


# ------------------------------------------------------------------------------ the browser


def test_a_wrong_password_shows_an_error(ui):
    ui.log_in("guest", "not-the-password")
    assert "Login failed" in ui.text_of("#login-error", bool, "the login error")
    assert not ui.driver.find_element(By.ID, "app-view").is_displayed()


def test_log_in_see_a_publish_browse_and_purge_a_queue(ui, broker, env, tmp_path):
    queue = env.queue_name("ui")
    channel = env.channel()
    channel.queue_declare(queue, durable=True)
    ui.log_in()
    ui.element("#whoami")
    ui.open("queues")
    row = f'#live tr[data-key="{queue}"] td[data-col="messages"]'  # (the queue's name is letters, digits, '-')
    assert ui.text_of(row, lambda t: t == "0", "the queue listed empty")
    # the list of one vhost (asked for as /api/queues/%2F), narrowed to names holding a piece of it
    Select(ui.element("#queues-vhost")).select_by_value("/")
    ui.element("#queues-filter").send_keys(queue[-6:])
    ui.wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#live tbody tr")) == 1, "the filtered list")
    for i in range(3):
        channel.basic_publish("", queue, f"message {i}".encode())
    # shown by the page's own refresh, nothing clicked
    assert ui.text_of(row, lambda t: t == "3", "the queue's depth to reach 3")

    ui.click(By.LINK_TEXT, queue, "the queue's name")
    assert ui.element("#queue-name").text == queue
    form = ui.element("#publish-form")
    form.find_element(By.NAME, "payload").send_keys("from the UI")
    form.find_element(By.CSS_SELECTOR, "button").click()
    assert ui.text_of("#notice", lambda t: t == "published", "the publish to be confirmed")
    depth = '#live td[data-col="messages"]'
    ui.text_of(depth, lambda t: t == "4", "the depth to reach 4")

    # get with requeue: the message is shown and stays in the queue
    ui.driver.find_element(By.CSS_SELECTOR, "#get-form button").click()
    assert "message 0" in ui.text_of("#get-results", bool, "the message got")
    assert wait_for(lambda: api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 4, 10, "the requeue")

    ui.driver.find_element(By.ID, "purge-queue").click()
    ui.accept_confirm()
    assert ui.text_of("#notice", lambda t: t == "purged", "the purge to be confirmed")
    ui.text_of(depth, lambda t: t == "0", "the depth to drop to 0")
    assert api(broker, "GET", f"/api/queues/%2F/{queue}")[1]["messages"] == 0


def test_close_a_connection(ui, broker):
    label = f"ui-close-{uuid.uuid4().hex[:8]}"
    params = pika.ConnectionParameters("127.0.0.1", broker.amqp_port, client_properties={"connection_name": label})
    connection = pika.BlockingConnection(params)
    try:
        connections = api(broker, "GET", "/api/connections")[1]
        name = next(c["name"] for c in connections if c["client_properties"].get("connection_name") == label)
        ui.log_in()
        ui.element("#whoami")
        ui.open("connections")
        reason = ui.element("#close-reason")
        reason.clear()
        reason.send_keys("closed by the UI test")
        ui.click(By.CSS_SELECTOR, f'button.close-connection[data-name="{name}"]', "the connection's Close")
        ui.accept_confirm()
        assert ui.text_of("#notice", lambda t: t == f"connection {name} closed", "the close to be confirmed")
        closed: list[Exception] = []

        def is_closed() -> bool:
            try:
                connection.process_data_events(time_limit=0.1)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                closed.append(exc)
            return bool(closed) or not connection.is_open

        wait_for(is_closed, 10, "the broker to close the connection")
        assert closed and closed[0].reply_code == 320 and "closed by the UI test" in closed[0].reply_text
        ui.text_of("#live", lambda t: name not in t, "the connection to leave the list")
    finally:
        if connection.is_open:
            connection.close()


def test_overview_and_cluster_pages(ui, broker, env, tmp_path):
    queue = env.queue_name("ui-rates")
    channel = env.channel()
    channel.queue_declare(queue)
    ui.log_in()
    ui.element("#whoami")
    ui.open("overview")
    ui.element("#rate-chart")
    for i in range(50):
        channel.basic_publish("", queue, b"x" * i)
    # two samples make a line; the page samples at each refresh
    ui.wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#rate-chart polyline")) > 0)
    ui.text_of("#total-messages", lambda t: t.split()[0] != "0", "the published messages in the totals")
    ui.text_of("#live", lambda t: "maintenance" in t, "the nodes' table with its maintenance column")
    ui.driver.set_window_size(1280, 1250)  # the whole overview, nodes and listeners too
    assert ui.screenshot("ui-overview.png", tmp_path).stat().st_size > 10_000
    ui.driver.set_window_size(1280, 900)
    ui.open("cluster")
    text = ui.text_of("#live", lambda t: "Raft groups" in t and "Members" in t, "the cluster page")
    status = api(broker, "GET", "/api/cluster/status")[1]
    for group in status["groups"]:
        assert group["group"] in text
    for member in status["members"]:
        assert member["node"] in text
    assert ui.screenshot("ui-cluster.png", tmp_path).stat().st_size > 10_000


def test_names_are_shown_as_text_not_markup(ui, env):
    # AMQP names may hold anything; the page puts them in as text (and its CSP would refuse an
    # inline handler anyway): the name is shown as written, and no element comes of it.
    queue = f'<img src=x id="injected">{env.queue_name("ui-markup")}'
    env.queues.append(queue)
    env.channel().queue_declare(queue)
    ui.log_in()
    ui.element("#whoami")
    ui.open("queues")
    ui.click(By.LINK_TEXT, queue, "the name, shown as text")
    assert not ui.driver.find_elements(By.ID, "injected")
    assert ui.element("#queue-name").text == queue
    ui.text_of('#live td[data-col="messages"]', lambda t: t == "0", "the queue's figures")


def test_a_user_without_the_tag_a_page_needs_sees_the_refusal_and_stays_logged_in(ui, broker):
    name = f"ui-mgmt-{uuid.uuid4().hex[:8]}"
    assert api(broker, "PUT", f"/api/users/{name}", {"password": "pw-123456", "tags": "management"})[0] in (201, 204)
    try:
        ui.log_in(name, "pw-123456")
        assert ui.element("#whoami").text == f"{name} (management)"
        ui.open("access")
        assert "Not administrator user" in ui.text_of("#notice", bool, "the refusal")
        assert ui.driver.find_element(By.ID, "app-view").is_displayed()
        ui.driver.find_element(By.ID, "logout").click()
        ui.element("#login-username")
        assert ui.driver.execute_script("return sessionStorage.length") == 0
    finally:
        api(broker, "DELETE", f"/api/users/{name}")


@pytest.mark.parametrize(
    "page, shows",
    [
        ("exchanges", "amq.topic"),
        ("exchange/%2F/amq.topic", "Bindings from this exchange"),
        ("channels", "Channels"),
        ("access", "Permissions"),
        ("policies", "Policies"),
        ("trace", "x-trace"),
    ],
)
def test_every_other_page_opens_without_errors(ui, page, shows):
    # the pages the tests above do not go through: each loads its live part, and the console
    # stays clean (the `ui` fixture's check)
    ui.log_in()
    ui.element("#whoami")
    ui.open(page)
    assert shows in ui.text_of("#live", lambda t: shows in t, f"the {page} page")
    assert ui.driver.find_element(By.ID, "notice").text == ""


def test_the_trace_page_shows_a_messages_steps(ui, env):
    channel = env.channel()
    queue = env.queue_name("ui-trace")
    channel.queue_declare(queue, arguments={"x-trace": True})
    channel.confirm_delivery()
    message_id = f"ui-{uuid.uuid4().hex[:8]}"
    channel.basic_publish("", queue, b"seen", pika.BasicProperties(message_id=message_id))
    ui.log_in()
    ui.element("#whoami")
    ui.open("trace")
    ui.element("#trace-form input[name=value]").send_keys(message_id)
    ui.driver.find_element(By.CSS_SELECTOR, "#trace-form button").click()
    shown = ui.text_of("#live", lambda t: "enqueued" in t, "the trace of the message")
    assert "published" in shown and queue in shown and "user=guest" in shown
    assert ui.driver.current_url.endswith(f"#/trace/%2F/message_id/{message_id}")


def test_declare_with_arguments_from_the_forms(ui, broker, env):
    """The add forms take arguments as JSON (as RabbitMQ's UI does): a deduplicating exchange,
    which needs x-cache-size, and a length-limited queue; text that is not a JSON object is
    refused in the page with nothing sent, and the node's refusal is shown as it gives it."""
    ui.log_in()
    ui.element("#whoami")
    ui.open("exchanges")
    exchange = env.exchange_name()

    def add_exchange(arguments: str) -> str:
        form = ui.element("#add-exchange-form")
        for name, value in (("name", exchange), ("arguments", arguments)):
            box = form.find_element(By.NAME, name)
            box.clear()
            box.send_keys(value)
        Select(form.find_element(By.NAME, "type")).select_by_value("x-message-deduplication")
        ui.driver.execute_script('document.getElementById("notice").textContent = ""')
        form.find_element(By.CSS_SELECTOR, "button").click()
        return ui.text_of("#notice", bool, "the form's answer")

    assert add_exchange('{"x-cache-size": 5').startswith("arguments: not JSON")
    assert add_exchange("[1]").startswith("arguments: a JSON object is needed")
    assert api(broker, "GET", f"/api/exchanges/%2F/{exchange}")[0] == 404  # nothing was sent
    refused = add_exchange("")
    assert refused.startswith("400: ") and "'x-cache-size' must be an integer" in refused
    assert add_exchange('{"x-cache-size": 5}') == f"exchange {exchange} declared"
    status, shown, _ = api(broker, "GET", f"/api/exchanges/%2F/{exchange}")
    assert status == 200 and shown["type"] == "x-message-deduplication" and shown["arguments"] == {"x-cache-size": 5}
    api(broker, "DELETE", f"/api/exchanges/%2F/{exchange}")

    ui.open("queues")
    queue = env.queue_name("ui-args")
    form = ui.element("#add-queue-form")
    form.find_element(By.NAME, "name").send_keys(queue)
    form.find_element(By.NAME, "arguments").send_keys('{"x-max-length": 3}')
    form.find_element(By.CSS_SELECTOR, "button").click()
    assert ui.text_of("#notice", bool, "the form's answer") == f"queue {queue} declared"
    status, shown, _ = api(broker, "GET", f"/api/queues/%2F/{queue}")
    assert status == 200 and shown["arguments"] == {"x-max-length": 3}
    api(broker, "DELETE", f"/api/queues/%2F/{queue}")

"""The web page at `/` in a real browser (Debian's headless Chromium through Selenium): it asks
for the API key, streams a reply, stops it, and its live panel's counters and heat map move
while the request runs. A screenshot of each state goes to $SLUICE_WEB_SHOTS; the browser's
console must stay free of errors. Run by tests/web/run.sh, which starts the server."""

import json
import os
import shutil
import tempfile
import time
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

URL = os.environ.get("SLUICE_WEB_URL", "")
KEY = os.environ.get("SLUICE_API_KEY", "")
SHOTS = os.environ.get("SLUICE_WEB_SHOTS", "target/web-shots")
# The synthetic model's stop tokens (<|endoftext|>, <|im_end|>): biased away so the reply runs
# until it is stopped.
NO_EOS = json.dumps({"logit_bias": {"1000": -100, "1002": -100}})


@pytest.fixture(scope="module")
def browser():
    if not URL:
        pytest.fail("SLUICE_WEB_URL is not set: run tests/web/run.sh")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="sluice-chromium-")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(
        service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=opts)
    driver.set_script_timeout(10)
    yield driver
    driver.quit()


def wait(what, ok, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = ok()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def shot(driver, name):
    os.makedirs(SHOTS, exist_ok=True)
    assert driver.save_screenshot(os.path.join(SHOTS, name))


def last_reply(driver):
    replies = driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")
    return replies[-1] if replies else None


def running_on_server():
    req = urllib.request.Request(URL + "/health")
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)["active_sequences"]


def test_chat_streams_stops_and_the_live_panel_moves(browser):
    d = browser
    d.get(URL + "/")
    # The server has a key: the page asks for it before calling /v1/.
    wait("the API key prompt", lambda: "shown" in d.find_element(By.ID, "keybar").get_attribute("class"))
    shot(d, "01-asks-for-key.png")
    d.find_element(By.ID, "api-key").send_keys(KEY)
    d.find_element(By.ID, "key-save").click()
    wait("the live panel to connect", lambda: text(d, "status") == "live")
    assert text(d, "model") == "small"
    wait("a first live frame", lambda: text(d, "live-tokens") != "–")
    tokens_before = int(text(d, "live-tokens"))
    heat_before = int(d.find_element(By.ID, "heat").get_attribute("data-sum"))

    d.find_element(By.ID, "thinking").click()  # off: the reply streams as content
    d.find_element(By.ID, "max-tokens").send_keys("20000")
    d.find_element(By.ID, "advanced").click()
    d.find_element(By.ID, "extra").send_keys(NO_EOS)
    d.find_element(By.ID, "prompt").send_keys("Write a long poem about the sea")
    d.find_element(By.ID, "send").click()

    body = lambda: last_reply(d).find_element(By.CSS_SELECTOR, ".body").text
    wait("streamed tokens", lambda: last_reply(d) is not None and len(body()) > 40)
    first = len(body())
    wait("more streamed tokens", lambda: len(body()) > first + 40)
    assert d.find_element(By.ID, "stop").is_enabled()
    shot(d, "02-streaming.png")

    wait("the live token counter to move", lambda: int(text(d, "live-tokens")) > tokens_before + 50)
    wait(
        "the heat map to fill",
        lambda: int(d.find_element(By.ID, "heat").get_attribute("data-sum")) > heat_before,
    )
    wait("the running request in the panel", lambda: text(d, "live-reqs").startswith("1 /"))
    assert text(d, "live-toks") not in ("–", "0.0")
    assert d.find_elements(By.CSS_SELECTOR, "#sessions tbody tr"), "the daemon's sessions"
    assert "/" in text(d, "live-cache") and "MiB" in text(d, "live-cache")
    # The private daemon started cold: its first reads show as misses and disk reads.
    assert int(d.find_element(By.ID, "misses").get_attribute("data-sum")) > 0
    assert text(d, "live-rss").count("MiB") == 2, text(d, "live-rss")
    shot(d, "03-live-panel.png")

    d.find_element(By.ID, "stop").click()
    wait("the reply to say stopped", lambda: last_reply(d).get_attribute("data-finish") == "stopped")
    assert d.find_element(By.ID, "send").is_enabled()
    assert not d.find_element(By.ID, "stop").is_enabled()
    # The server stops generating for the closed stream, and the panel shows it.
    wait("the server to stop generating", lambda: running_on_server() == 0, timeout=10)
    wait("the panel to show no running request", lambda: text(d, "live-reqs").startswith("0 /"))
    settled = int(text(d, "live-tokens"))
    time.sleep(2.5)
    assert int(text(d, "live-tokens")) == settled, "tokens kept coming after stop"
    shot(d, "04-stopped.png")

    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors

"""The controller's dashboard (``/ui``) in a real headless Chromium, driven by Selenium.

Debian's ``chromium`` and ``chromium-driver`` packages (``.ci/run`` installs them): the test skips
only where no Chromium is installed. The page logs in with the API token (a form), lists the job,
and shows its report picture (the browser decoded a PNG of the expected size).
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest

from support import run_cli, start_controller, write_pw_spec

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "FAILED_NO_RESOURCE", "FAILED_BUDGET"}


def wait_done(url: str, token: str, job_id: str, timeout_s: float = 40) -> dict:
    deadline = time.time() + timeout_s
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}) as c:
        while time.time() < deadline:
            job = c.get(f"/v1/jobs/{job_id}").json()
            if job["state"] in TERMINAL:
                return job
            time.sleep(0.2)
    raise AssertionError(f"{job_id} did not end")


def chrome(tmp_path: Path):  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    driver_path = shutil.which("chromedriver")
    assert driver_path, "chromium is installed but chromedriver is not (Debian: apt-get install chromium-driver)"
    opts = Options()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1200,1000"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver_path))


def check_cookie_opens_ui_pages_only(url: str, token: str) -> None:
    """Without a browser: the login form sets the cookie; it opens /ui, never the API."""
    with httpx.Client(base_url=url) as c:
        r = c.get("/ui")
        assert r.status_code == 303 and r.headers["location"] == "/ui/login"
        login = c.get("/ui/login")
        assert login.status_code == 200
        found = re.search(r'name="csrf" value="([^"]+)"', login.text)  # the form's CSRF token (its cookie is in c)
        assert found, login.text
        csrf = found.group(1)
        form = {"content-type": "application/x-www-form-urlencoded"}
        bad = c.post("/ui/login", content=f"csrf={csrf}&token=wrong", headers=form)
        assert bad.status_code == 401 and "spotrain_token" not in bad.headers.get("set-cookie", "")
        assert c.post("/ui/login", content=f"token={token}", headers=form).status_code == 403  # no CSRF token
        ok = c.post("/ui/login", content=f"csrf={csrf}&token={token}", headers=form)
        assert ok.status_code == 303 and "HttpOnly" in ok.headers["set-cookie"]
        cookie = {"cookie": f"spotrain_token={token}"}
        assert c.get("/ui", headers=cookie).status_code == 200
        assert c.get("/v1/jobs", headers=cookie).status_code == 401
        assert c.get("/ui", headers={"cookie": "spotrain_token=wrong"}).status_code == 303


@pytest.mark.e2e
def test_dashboard_in_headless_chromium(spotrain_home: Path, tmp_path: Path) -> None:

    ctl = start_controller(spotrain_home, env={"PW_STEPS": "15", "PW_STEP_S": "0.05"})
    driver = None
    try:
        url = json.loads((spotrain_home / "controller.json").read_text())["url"]
        token = (spotrain_home / "token").read_text().strip()
        r = run_cli("submit", str(write_pw_spec(tmp_path, name="dash")), "--json")
        assert r.returncode == 0, r.stderr
        job_id = json.loads(r.stdout.strip().splitlines()[-1])["job_id"]
        assert wait_done(url, token, job_id)["state"] == "SUCCEEDED"
        check_cookie_opens_ui_pages_only(url, token)
        if CHROMIUM is None:
            pytest.skip("no Chromium installed (CI installs Debian's chromium in .ci/run)")
        from selenium.webdriver.common.by import By

        driver = chrome(tmp_path)
        driver.set_page_load_timeout(30)
        driver.get(url + "/ui")
        assert driver.current_url.endswith("/ui/login")  # no cookie yet: the login form
        driver.find_element(By.ID, "token").send_keys(token)
        driver.find_element(By.ID, "login").click()
        deadline = time.time() + 10
        while time.time() < deadline and not driver.find_elements(By.ID, "jobs"):
            time.sleep(0.1)
        assert driver.current_url.rstrip("/").endswith("/ui"), driver.page_source[-500:]
        rows = driver.find_elements(By.CSS_SELECTOR, "#jobs tr.job")
        assert [row.find_element(By.TAG_NAME, "a").text for row in rows] == [job_id]
        assert "SUCCEEDED" in rows[0].text and "15/15" in rows[0].text
        rows[0].find_element(By.TAG_NAME, "a").click()
        assert job_id in driver.find_element(By.TAG_NAME, "h1").text
        img = driver.find_element(By.ID, "report")
        deadline = time.time() + 20
        while time.time() < deadline and not driver.execute_script("return arguments[0].complete", img):
            time.sleep(0.2)
        # The browser fetched and decoded the PNG (with the cookie alone): the picture is on the page.
        assert driver.execute_script("return [arguments[0].naturalWidth, arguments[0].naturalHeight]", img) == [900, 800]
        assert "SUCCEEDED" in driver.find_element(By.ID, "events").text
    finally:
        if driver is not None:
            driver.quit()
        ctl.terminate()
        ctl.wait(timeout=30)


@pytest.mark.e2e
def test_spotrain_dashboard_link_shows_output_and_cancels_in_headless_chromium(spotrain_home: Path, tmp_path: Path) -> None:
    """Issue 24, item 5: `spotrain dashboard` prints a link that logs the browser in (no token pasted);
    the job page shows the workers' output and its cancel button cancels the running job."""
    ctl = start_controller(spotrain_home, env={"PW_STEPS": "4000", "PW_STEP_S": "0.05", "PW_PRINT": "1"})
    driver = None
    try:
        url = json.loads((spotrain_home / "controller.json").read_text())["url"]
        # `controller start` says where the dashboard is, and how to log in (just after it records its URL).
        said = f"dashboard: {url}/ui (a one-time login link: spotrain dashboard --open)"
        deadline = time.time() + 15
        while time.time() < deadline and said not in (spotrain_home / "controller.log").read_text():
            time.sleep(0.1)
        assert said in (spotrain_home / "controller.log").read_text()
        if CHROMIUM is None:
            pytest.skip("no Chromium installed (CI installs Debian's chromium in .ci/run)")
        from selenium.webdriver.common.by import By

        r = run_cli("submit", str(write_pw_spec(tmp_path, name="dash-cancel", workers="{min: 1, max: 1}")), "--json")
        assert r.returncode == 0, r.stderr
        job_id = json.loads(r.stdout.strip().splitlines()[-1])["job_id"]
        deadline = time.time() + 40  # running, and rank 0 has printed a few steps
        while time.time() < deadline:
            st = json.loads(run_cli("status", job_id, "--json").stdout.strip().splitlines()[-1])
            if st["state"] == "RUNNING" and (st.get("step") or 0) >= 3:
                break
            time.sleep(0.3)
        assert st["state"] == "RUNNING", st
        link = run_cli("dashboard")
        assert link.returncode == 0, link.stderr
        login_url = link.stdout.strip().splitlines()[-1]
        assert login_url.startswith(url + "/ui/link?t="), link.stdout
        assert "one-time" in link.stderr

        driver = chrome(tmp_path)
        driver.set_page_load_timeout(30)
        driver.get(login_url)  # the link alone logs in: no token pasted anywhere
        deadline = time.time() + 15
        while time.time() < deadline and not driver.find_elements(By.ID, "jobs"):
            time.sleep(0.1)
        assert driver.current_url.rstrip("/").endswith("/ui"), driver.page_source[-500:]
        rows = driver.find_elements(By.CSS_SELECTOR, "#jobs tr.job")
        assert [row.find_element(By.TAG_NAME, "a").text for row in rows] == [job_id]
        rows[0].find_element(By.TAG_NAME, "a").click()
        assert job_id in driver.find_element(By.TAG_NAME, "h1").text
        output = driver.find_element(By.ID, "output").text
        assert re.search(r"rank 0: step \d+ of 4000", output), output[-500:]
        from selenium.webdriver.support.ui import WebDriverWait

        def element(element_id: str):  # type: ignore[no-untyped-def]
            # A click that submits a form returns before the next page has loaded.
            return WebDriverWait(driver, 15).until(lambda d: (d.find_elements(By.ID, element_id) or [None])[0])

        driver.find_element(By.ID, "cancel").click()
        element("confirm-cancel").click()  # the confirmation page's POST, with its CSRF token
        assert "cancelling" in element("note").text
        assert driver.current_url.endswith(f"/ui/jobs/{job_id}?note=cancelled")
        deadline = time.time() + 30
        while time.time() < deadline:
            st = json.loads(run_cli("status", job_id, "--json").stdout.strip().splitlines()[-1])
            if st["state"] == "CANCELLED":
                break
            time.sleep(0.3)
        assert st["state"] == "CANCELLED" and st["step"] < 4000, st
        driver.refresh()
        assert "CANCELLED" in driver.find_element(By.ID, "facts").text
        assert not driver.find_elements(By.ID, "cancel")  # nothing left to cancel
        # The link was used up: opened again (a second browser, or the first after logout) it says so.
        driver.delete_all_cookies()
        driver.get(login_url)
        assert "already used" in driver.find_element(By.ID, "link-refused").text
    finally:
        if driver is not None:
            driver.quit()
        ctl.terminate()
        ctl.wait(timeout=30)

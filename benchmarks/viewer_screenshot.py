"""Screenshot of the offline attention explorer (``qkv viz RUN --html``) for the README.

    python benchmarks/viewer_screenshot.py PAGE.html OUT.png [--group "cross L1"] [--head H0] [--query 3]

Opens the page in headless Chromium (Debian's chromium + chromium-driver, through Selenium),
picks the layer and head, hovers one query token, and saves the window as a PNG.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("page")
    parser.add_argument("out")
    parser.add_argument("--group", default=None, help="layer / group to select (default: the page's first)")
    parser.add_argument("--head", default=None, help="head to select (default: the first)")
    parser.add_argument("--query", type=int, default=0, help="query token to hover")
    parser.add_argument("--size", default="1280,820", help="window size W,H")
    args = parser.parse_args()

    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", f"--window-size={args.size}"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium") or shutil.which("google-chrome") or ""
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        driver.get(Path(args.page).resolve().as_uri())
        if args.group:
            Select(driver.find_element(By.ID, "group")).select_by_visible_text(args.group)
        if args.head:
            Select(driver.find_element(By.ID, "head")).select_by_visible_text(args.head)
        tokens = driver.find_elements(By.CSS_SELECTOR, "#queries .tok")
        ActionChains(driver).move_to_element(tokens[min(args.query, len(tokens) - 1)]).perform()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}: {driver.find_element(By.ID, 'readout').text}")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()

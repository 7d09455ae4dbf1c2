"""The built site: it builds with warnings as errors, its generated pages hold
what the code says, and a real headless browser renders every page, follows
no broken internal link or image, and finds words with the site's search."""
import html
import os
import re
import shutil
import urllib.parse

import pytest

import doc_blocks as db


def test_site_builds_with_warnings_as_errors(site):
    pages = {os.path.relpath(p, db.DOCS)[:-3] + ".html" for p in map(
        lambda p: os.path.join(db.DOCS, p), db.pages())}
    built = {os.path.relpath(os.path.join(d, f), site) for d, _, fs in os.walk(site)
             for f in fs if f.endswith(".html")}
    assert pages <= built, f"pages not built: {sorted(pages - built)}"


_CODE_DIV = re.compile(r'<div class="highlight-(python|py|python3|bash|sh|shell|console)\b[^"]*">'
                       r'<div class="highlight"><pre>(.*?)</pre>', re.S)


def _normal(code):
    return "\n".join(line.rstrip() for line in code.strip().splitlines())


def test_every_code_block_of_the_site_comes_from_a_checked_source(site):
    # a python or shell block in the HTML is a Markdown block (test_code_blocks.py),
    # a docstring example (run there too) or an included example (test_examples.py)
    known = {_normal(b.text) for b in db.all_blocks()}
    for page in db.pages():
        for path in db.literal_includes(page):
            with open(os.path.join(db.REPO, path)) as f:
                known.add(_normal(f.read()))
    for folder, _, files in os.walk(os.path.join(db.REPO, "tarantella")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    known.update(_normal(code) for code in db.fences_in_docstrings(f.read()))
    unknown = []
    for folder, _, files in os.walk(site):
        for name in (f for f in files if f.endswith(".html")):
            with open(os.path.join(folder, name)) as f:
                for m in _CODE_DIV.finditer(f.read()):
                    code = _normal(html.unescape(re.sub(r"<[^>]+>", "", m.group(2))))
                    if code not in known:
                        unknown.append(f"{os.path.relpath(os.path.join(folder, name), site)}: "
                                       f"{code[:200]}")
    assert not unknown, "code blocks that no test runs:\n" + "\n".join(unknown)


def test_every_public_name_is_in_the_python_reference(site):
    import tarantella

    html = (site / "reference" / "python.html").read_text()
    missing = [n for n in tarantella.__all__
               if f'id="tarantella.common.{n}"' not in html
               and f'id="tarantella.tensorflow.{n}"' not in html
               and f'id="tarantella.tensorflow.{n.lower()}"' not in html
               and n not in ("data", "keras", "models", "optimizers")]
    for module in ("data", "models", "keras.callbacks", "optimizers"):
        assert f'id="module-tarantella.tensorflow.{module}"' in html, module
    assert not missing, f"public names not in reference/python.html: {missing}"


def test_tntrun_reference_lists_every_option_of_the_parser(site):
    from tarantella.runner import cli

    html = (site / "reference" / "tntrun.html").read_text()
    options = [s for a in cli.build_parser()._actions for s in a.option_strings]
    missing = [o for o in options if o not in html]
    assert len(options) > 30 and not missing, f"options not in reference/tntrun.html: {missing}"


def test_launcher_guide_and_parser_name_the_same_options():
    # docs/cli.md is written by hand: every long option of the parser is
    # mentioned there, and every option its tables explain exists
    from tarantella.runner import cli

    with open(os.path.join(db.DOCS, "cli.md")) as f:
        text = f.read()
    parser = {s for a in cli.build_parser()._actions for s in a.option_strings}
    first_cells = re.findall(r"^\| (`-.*?) \|", text, re.M)
    named = {o for cell in first_cells for o in re.findall(r"`(-[\w-]+)", cell)}
    unknown = named - parser
    unexplained = {o for o in parser if o.startswith("--") and o not in text}
    assert not unknown, f"cli.md names options tntrun does not have: {sorted(unknown)}"
    assert not unexplained, f"cli.md does not mention these options: {sorted(unexplained)}"


def test_environment_page_is_the_settings_table(site):
    from tarantella.common import config

    html = (site / "environment.html").read_text()
    for param in config.PARAMS:
        row = re.search(rf"<code[^>]*><span class=\"pre\">{param.name}</span></code></p>?</td>"
                        rf"\s*<td>(.*?)</td>\s*<td>(.*?)</td>", html, re.S)
        assert row, f"{param.name} has no row in environment.html"
        default = "" if param.default is None else str(param.default)
        assert re.sub(r"<[^>]+>", "", row.group(1)).strip() == default, param.name


# ---- in a headless browser -------------------------------------------------------------------

PAGE_INFO = """
const main = document.querySelector('div.body') || document.querySelector('[role=main]');
return {
  mainText: main ? main.innerText.trim().length : 0,
  h1: document.querySelectorAll('h1').length,
  problems: [...document.querySelectorAll('.system-message, .problematic')].map(e => e.innerText),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  images: [...document.images].map(i => [i.src, i.complete && i.naturalWidth > 0]),
};
"""


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e \".[docs]\"")
    binary = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                   "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("no headless browser: install chromium and its driver "
                    "(Debian: apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--allow-file-access-from-files"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # the driver is named, so Selenium never looks for one on the network
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    yield chrome
    chrome.quit()


def _file_path(url):
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.unquote(parts.path), urllib.parse.unquote(parts.fragment)


def test_every_page_renders_with_no_broken_link_or_image(site, browser):
    html_files = sorted(os.path.join(d, f) for d, _, fs in os.walk(site) for f in fs
                        if f.endswith(".html"))
    ids, links, problems = {}, [], []
    for path in html_files:
        page = os.path.relpath(path, site)
        browser.get("file://" + path)
        info = browser.execute_script(PAGE_INFO)
        errors = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        ids[path] = set(info["ids"])
        if errors:
            problems.append(f"{page}: errors in the browser console: {errors}")
        if info["problems"]:
            problems.append(f"{page}: docutils error boxes: {info['problems']}")
        if info["mainText"] == 0 or info["h1"] == 0:
            problems.append(f"{page}: empty main content or no title")
        for src, loaded in info["images"]:
            if src.startswith("file://") and not loaded:
                problems.append(f"{page}: image {src} does not load")
        links += [(page, url) for url in info["links"] if url.startswith("file://")]
    checked = 0
    for page, url in links:
        target, fragment = _file_path(url)
        if not os.path.isfile(target):
            problems.append(f"{page}: broken link {url}")
        elif fragment and target in ids and fragment not in ids[target]:
            where = os.path.relpath(target, site)
            problems.append(f"{page}: link {url}: no #{fragment} in {where}")
        checked += 1
    assert len(html_files) >= 20 and checked > 100, (len(html_files), checked)
    assert not problems, "\n".join(problems)


def _search(browser, site, word):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"file://{site}/search.html?q={urllib.parse.quote(word)}")
    # the heading says "Searching" until every result is listed (Sphinx's searchtools.js)
    WebDriverWait(browser, 60).until(lambda b: any(
        h.text.strip() == "Search Results"
        for h in b.find_elements(By.CSS_SELECTOR, "#search-results h2")))
    results = browser.find_elements(By.CSS_SELECTOR, "#search-results ul.search li a")
    return [r.get_attribute("href") for r in results]


def test_search_finds_pages(site, browser):
    found = _search(browser, site, "allreduce")
    assert any(h.split("#")[0].endswith("/api.html") for h in found), found
    assert any("custom-training-loops.html" in h for h in _search(browser, site, "GradientTape"))
    assert _search(browser, site, "xylophonequartz") == []

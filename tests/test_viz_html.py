"""The offline attention page (``qkv viz RUN --html``): its content, and a real browser using it.

The browser test drives headless Chromium (Debian's ``chromium`` + ``chromium-driver``, through
Selenium): it picks a layer and a head, hovers a query token and reads the weights the page shows
on the key tokens, then switches to all heads side by side and clicks one. It skips, saying why,
when Selenium or the browser is not installed (``make test`` installs them where it can).
"""

import json
import re
import shutil
from html.parser import HTMLParser

import pytest
import torch

from qkv.tasks.base import Task
from qkv.viz import AttentionView, attention_view
from qkv.viz_html import render_html, script_json, split_panel_name, write_html

TOKENS = ["R", "O", "M", "E", "O", ":"]


def _known_view() -> AttentionView:
    """2 layers x 2 heads over 6 tokens; head h of layer l puts most weight on key (i + l + h) % 6."""
    g = torch.Generator().manual_seed(0)
    layers = []
    for l in range(2):
        heads = []
        for h in range(2):
            w = torch.rand(6, 6, generator=g) * 0.1
            for i in range(6):
                w[i, (i + l + h) % 6] += 1.0
            heads.append(w / w.sum(-1, keepdim=True))
        layers.append(torch.stack(heads)[None])  # (1, H, M, N)
    return AttentionView.from_weights(layers, x_labels=TOKENS, y_labels=TOKENS, title="toy", caption="ROMEO:")


def _payload(page: str) -> dict:
    m = re.search(r'<script id="qkv-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_page_is_self_contained_and_holds_every_panel():
    view = _known_view()
    page = render_html([("toy", view)])
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page must not load anything from a network"
    data = _payload(page)
    panels = data["models"][0]["panels"]
    assert [p["name"] for p in panels] == ["attention L0 H0", "attention L0 H1", "attention L1 H0", "attention L1 H1"]
    for (name, w), p in zip(view.panels, panels):
        assert p["x"] == TOKENS and p["y"] == TOKENS and (p["rows"], p["cols"]) == (6, 6)
        assert torch.allclose(torch.tensor(p["w"]).view(6, 6), w, atol=1e-4)


def test_labels_are_escaped():
    view = AttentionView([("attention", torch.eye(2))], x_labels=["</script>", "<b>"], y_labels=["&", '"'])
    page = render_html([("m", view)])
    assert page.count("</script>") == 2  # the two real closing tags only
    assert _payload(page)["models"][0]["panels"][0]["x"] == ["</script>", "<b>"]


HOSTILE = ["</script><svg onload=alert(1)>", "__DATA__", "__DATA__ <svg onload=alert(1)>", "__TITLE__", "${alert(1)}", "<!--", "<script>x</script>",
           "a & b \u2028 c \u2029 d", "<img src=x onerror=alert(1)>", "]]><x>", "\"'`"]


class _Markup(HTMLParser):
    """The elements and attributes a browser's tokenizer would build, and the text of <title>, <h1>
    and the data element."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.attrs, self.text, self._open = [], [], {}, None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [name for name, _ in attrs]
        key = "data" if ("id", "qkv-data") in attrs else tag
        self._open = key if key in ("title", "h1", "data") else None

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open:
            self.text[self._open] = self.text.get(self._open, "") + data


def _markup(page: str) -> _Markup:
    parser = _Markup()
    parser.feed(page)
    parser.close()
    return parser


@pytest.mark.parametrize("hostile", HOSTILE)
def test_hostile_strings_stay_text(hostile):
    """A title, model name, panel name, label or caption holding markup, a template slot name or a
    line separator is shown as text: the page has exactly the elements of a plain page, no event
    attribute, and the data element holds every string unchanged."""
    plain = _markup(render_html([("m", AttentionView([("attention", torch.eye(2))], x_labels=["a", "b"],
                                                                y_labels=["a", "b"]))], title="plain"))
    view = AttentionView([(f"{hostile} H0", torch.eye(2))], x_labels=[hostile, "b"], y_labels=["a", hostile],
                         title=hostile, caption=hostile)
    page = render_html([(hostile, view)], title=hostile)
    found = _markup(page)
    assert found.tags == plain.tags
    assert found.attrs == plain.attrs and not any(a.startswith("on") for a in found.attrs)
    assert found.text["title"] == hostile and found.text["h1"] == hostile
    data = json.loads(found.text["data"])
    model = data["models"][0]
    assert data["title"] == hostile and model["name"] == hostile
    assert model["title"] == hostile and model["caption"] == hostile
    assert model["panels"][0]["name"] == f"{hostile} H0"
    assert model["panels"][0]["x"] == [hostile, "b"] and model["panels"][0]["y"] == ["a", hostile]
    assert page.count("<script") == 2 and page.count("</script>") == 2


def test_script_json_escapes_what_could_end_a_script():
    text = script_json({"s": "</script><!--&\u2028\u2029"})
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == {"s": "</script><!--&\u2028\u2029"}


def test_title_must_be_text():
    with pytest.raises(TypeError, match="title must be a string"):
        render_html([("m", AttentionView([("a", torch.eye(2))]))], title=None)


def test_panel_names_split_into_layer_and_head():
    assert split_panel_name("decoder L1 H3") == ("decoder L1", "H3")
    assert split_panel_name("cross L0 H10") == ("cross L0", "H10")
    assert split_panel_name("hop 2") == ("hop 2", "")


def test_bad_input_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one"):
        render_html([])
    with pytest.raises(ValueError, match="no attention panels"):
        render_html([("m", AttentionView([]))])
    with pytest.raises(ValueError, match="2-D"):
        render_html([("m", AttentionView([("a", torch.ones(2, 2, 2))]))])


def test_view_chooses_cross_attention_first():
    panels = [(f"decoder_self L{i} H0", torch.eye(2)) for i in range(4)] + [("decoder_cross L0 H0", torch.eye(2))]
    assert [n for n, _ in AttentionView(panels).chosen(2)] == ["decoder_cross L0 H0", "decoder_self L0 H0"]


def test_the_most_specific_label_prefix_wins():
    src, tgt = ["a", "b", "c"], ["x", "y"]
    view = AttentionView([], labels={"decoder": (tgt, tgt), "decoder_cross": (src, tgt), "encoder": (src, src)})
    assert view.labels_for("decoder_cross L1 H0") == (src, tgt)
    assert view.labels_for("decoder_self L0 H1") == (tgt, tgt)
    assert view.labels_for("encoder L0 H0") == (src, src)


def test_attention_view_refuses_unknown_task_kinds():
    class Odd(Task):
        kind = "graph"

    with pytest.raises(ValueError, match="no attention view"):
        attention_view(Odd(), torch.nn.Linear(1, 1))


def _browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e .[dev])")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver_path = shutil.which("chromedriver")
    if not binary or not driver_path:
        pytest.skip("no headless Chromium and chromedriver on PATH (Debian: apt-get install chromium chromium-driver)")
    options = Options()
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1280,900"):
        options.add_argument(flag)
    options.binary_location = binary
    return webdriver.Chrome(service=Service(driver_path), options=options)


def test_in_a_real_browser(tmp_path):
    view = _known_view()
    page = write_html(tmp_path / "attention.html", [("toy", view), ("toy-2", view)])
    driver = _browser()
    try:
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select

        driver.get(page.resolve().as_uri())
        assert driver.find_element(By.ID, "caption").text.startswith("toy")
        Select(driver.find_element(By.ID, "group")).select_by_visible_text("attention L1")
        Select(driver.find_element(By.ID, "head")).select_by_visible_text("H1")
        query = driver.find_elements(By.CSS_SELECTOR, "#queries .tok")[3]
        ActionChains(driver).move_to_element(query).perform()
        shown = [float(k.get_attribute("data-weight")) for k in driver.find_elements(By.CSS_SELECTOR, "#keys .tok")]
        expected = dict(view.panels)["attention L1 H1"][3]
        assert shown == pytest.approx(expected.tolist(), abs=1e-4)
        assert max(range(6), key=lambda j: shown[j]) == (3 + 1 + 1) % 6
        assert "query 3" in driver.find_element(By.ID, "readout").text
        driver.save_screenshot(str(tmp_path / "viewer.png"))
        assert (tmp_path / "viewer.png").stat().st_size > 10_000

        driver.find_element(By.ID, "allheads").click()
        boxes = driver.find_elements(By.CSS_SELECTOR, "#heads .head")
        assert [b.get_attribute("data-head") for b in boxes] == ["H0", "H1"]
        boxes[0].click()
        assert Select(driver.find_element(By.ID, "head")).first_selected_option.text == "H0"
        Select(driver.find_element(By.ID, "model")).select_by_visible_text("toy-2")
        assert len(driver.find_elements(By.CSS_SELECTOR, "#keys .tok")) == 6
    finally:
        driver.quit()

"""The web page of `nmt serve` (nmt/serve/page.html) in a real headless Chromium, driven by
Selenium, against a real server of a trained checkpoint: it translates as you type and shows
what `POST /v1/translate` answers, highlights the aligned pieces of source and translation,
lists the alternatives, draws the attention map, honours must-include and avoid phrases, and
shows the server's errors; on torch and on CTranslate2 (the `engine` fixture), which refuses
must-include and avoid phrases. Screenshots go to $NMT_SCREENSHOTS (else the test's tmp_path).

Skipped where Chromium, chromedriver or selenium is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

BROWSER, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")  # Debian: /usr/bin/...
if not (BROWSER and DRIVER):
    pytest.skip("no Chromium: apt-get install chromium chromium-driver", allow_module_level=True)
if importlib.util.find_spec("selenium") is None:
    pytest.skip("no selenium: pip install selenium", allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from serving import Engine, Server, slow_on_ctranslate2  # noqa: E402

pytestmark = slow_on_ctranslate2  # a browser
WAIT = 60  # s: a loaded CI machine
MODEL = "en-de"
NBEST = 4  # min(the trained checkpoint's beam 4, 5): what the page asks for
MUST = "Fahrrad"

Span = tuple[int, int]


# ------------------------------------------------------------------ fixtures and helpers


@pytest.fixture(scope="module")
def server(engine: Engine, trained_checkpoint: Path) -> Iterator[Server]:
    with Server(*engine.args, "--model", f"{MODEL}={trained_checkpoint}") as s:
        yield s


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    options = webdriver.ChromeOptions()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
    ):
        options.add_argument(arg)
    options.binary_location = BROWSER
    d = webdriver.Chrome(options=options, service=Service(DRIVER))
    try:
        yield d
    finally:
        d.quit()


@pytest.fixture(scope="module")
def sentence(raw_corpus: Any) -> str:
    """The first source line of the test split (Multi30k's, or the synthetic stand-in's)."""
    return raw_corpus.lines("test", "en")[0].strip()


def body(
    text: str, constraints: Sequence[str] = (), avoid: Sequence[str] = (), **extra: Any
) -> dict[str, Any]:
    """The request the page sends for `text`."""
    return {
        "model": MODEL,
        "texts": [{"text": text, "constraints": list(constraints), "avoid": list(avoid)}],
        "nbest": NBEST,
        "alignment": True,
        **extra,
    }


def translate(server: Server, text: str, **kw: Any) -> dict[str, Any]:
    """The best hypothesis of the API for what the page sends (its "nbest" in "alternatives")."""
    status, answer, _ = server.post("/v1/translate", body(text, **kw))
    assert status == 200, answer
    (result,) = answer["translations"]
    return {**result["nbest"][0], "alternatives": result["nbest"]}


def find(d: Any, css: str) -> WebElement:
    return d.find_element(By.CSS_SELECTOR, css)


def text_of(element: WebElement) -> str:
    return element.get_property("textContent")


def wait(d: Any, condition: Callable[[Any], Any], what: str) -> Any:
    """Wait for `condition` to be truthy; on timeout fail with `what` and what the page shows."""
    try:
        return WebDriverWait(d, WAIT).until(condition)
    except TimeoutException:
        shown = {k: text_of(find(d, f"#{k}")) for k in ("translation", "source-view", "error")}
        raise AssertionError(f"{what}: not within {WAIT} s; the page shows {shown}") from None


def open_page(d: Any, url: str, source: str | None = None, **fields: str) -> None:
    """Load the page afresh, wait until it knows its models, and type `source` and `fields`
    (by the element's id: must, avoid)."""
    d.get(url + "/")
    wait(d, lambda d: find(d, "#model option"), "the page lists the models")
    for name, value in fields.items():
        find(d, f"#{name}").send_keys(value)
    if source is not None:
        find(d, "#source").send_keys(source)


def wait_translation(d: Any, expected: str) -> None:
    wait(
        d,
        lambda d: text_of(find(d, "#translation")) == expected,
        f"#translation shows {expected!r}",
    )


def wait_error(d: Any, message: str) -> None:
    wait(d, lambda d: text_of(find(d, "#error")) == message, f"#error shows {message!r}")


def spans(d: Any, css: str) -> dict[Span, WebElement]:
    return {
        (int(e.get_attribute("data-start")), int(e.get_attribute("data-end"))): e
        for e in d.find_elements(By.CSS_SELECTOR, css)
    }


def linked(alignment: list[dict[str, Any]], side: str, span: Span) -> set[Span]:
    other = "source" if side == "target" else "target"
    return {tuple(link[other]) for link in alignment if tuple(link[side]) == span}


def save_png(d: Any, folder: Path, name: str) -> Path:
    path = folder / name
    assert d.save_screenshot(str(path)), path
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    return path


# ------------------------------------------------------------------ the tests


def test_translates_as_you_type_what_the_api_answers(
    server: Server, driver: Any, sentence: str
) -> None:
    expected = translate(server, sentence)
    assert expected["text"]
    open_page(driver, server.url, sentence)
    wait_translation(driver, expected["text"])
    assert text_of(find(driver, "#source-view")) == sentence
    assert not find(driver, "#model-field").is_displayed()  # one model: nothing to choose
    assert not find(driver, "#api-key").is_displayed()  # no key asked for
    assert text_of(find(driver, "#error")) == ""
    # emptying the source empties the translation
    find(driver, "#source").send_keys(Keys.BACKSPACE * (len(sentence) + 2))
    wait(
        driver,
        lambda d: text_of(find(d, "#translation")) == "" and text_of(find(d, "#source-view")) == "",
        "an empty source clears the output",
    )
    assert driver.find_elements(By.CSS_SELECTOR, "#alternatives li") == []


def test_lines_and_sentences_are_each_translated(server: Server, driver: Any) -> None:
    """The page's text is split as the server splits every text: each line and each sentence
    translated, the line breaks kept, a line of emoji kept as typed."""
    source = "A dog runs. A cat sleeps on the sofa.\n\nTwo men talk.\n🙂🙂"
    expected = translate(server, source)["text"]
    one_by_one = [
        translate(server, s)["text"] for s in ("A dog runs.", "A cat sleeps on the sofa.")
    ]
    assert expected.split("\n") == [
        " ".join(one_by_one),
        "",
        translate(server, "Two men talk.")["text"],
        "🙂🙂",
    ]
    open_page(driver, server.url, source)
    wait_translation(driver, expected)


def test_text_is_never_markup(server: Server, driver: Any) -> None:
    source = '<img src=x onerror="document.title=1"> <b>A man</b> & a dog .'
    open_page(driver, server.url, source)
    wait(
        driver,
        lambda d: text_of(find(d, "#source-view")) == source,
        "#source-view shows the source",
    )
    assert not driver.find_elements(By.CSS_SELECTOR, "main img, main b")
    assert {
        e.tag_name for e in driver.find_elements(By.CSS_SELECTOR, "#source-view *, #translation *")
    } <= {"span"}


def test_hovering_highlights_the_aligned_pieces(server: Server, driver: Any, sentence: str) -> None:
    expected = translate(server, sentence)
    alignment = expected["alignment"]
    assert alignment, "the trained model aligns nothing"
    open_page(driver, server.url, sentence)
    wait_translation(driver, expected["text"])
    targets, sources = spans(driver, "#translation .seg"), spans(driver, "#source-view .seg")
    assert set(targets) == {tuple(link["target"]) for link in alignment}
    assert set(sources) == {tuple(link["source"]) for link in alignment}
    for span, element in targets.items():
        assert text_of(element) == expected["text"][span[0] : span[1]]
    for span, element in sources.items():
        assert text_of(element) == sentence[span[0] : span[1]]

    def highlighted(css: str) -> set[Span]:
        return set(spans(driver, f"{css} .seg.hl"))

    # each way: a few pieces of one side, each lighting exactly its linked pieces of the other
    for side, pieces, here, there in (
        ("target", targets, "#translation", "#source-view"),
        ("source", sources, "#source-view", "#translation"),
    ):
        for span in list(pieces)[:3]:
            ActionChains(driver).move_to_element(pieces[span]).perform()
            want = linked(alignment, side, span)
            wait(
                driver,
                lambda d, want=want, there=there: highlighted(there) == want,
                f"hovering {side} {span} highlights {sorted(want)} in {there}",
            )
            assert highlighted(here) == set()
    # leaving clears
    ActionChains(driver).move_to_element(find(driver, "h1")).perform()
    wait(
        driver,
        lambda d: not d.find_elements(By.CSS_SELECTOR, ".seg.hl"),
        "leaving clears the highlight",
    )


def test_alternatives_are_listed_with_scores(server: Server, driver: Any, sentence: str) -> None:
    expected = translate(server, sentence)["alternatives"]
    open_page(driver, server.url, sentence)
    wait_translation(driver, expected[0]["text"])
    items = driver.find_elements(By.CSS_SELECTOR, "#alternatives li")
    assert len(items) == len(expected) >= 2
    for item, hyp in zip(items, expected, strict=True):
        assert hyp["text"] in text_of(item)
        assert f"{hyp['score']:.3f}" in text_of(item)
    # clicking an alternative shows it, with its own alignment
    items[1].find_element(By.TAG_NAME, "button").click()
    wait_translation(driver, expected[1]["text"])
    assert set(spans(driver, "#translation .seg")) == {
        tuple(link["target"]) for link in expected[1]["alignment"]
    }


def test_attention_map(server: Server, driver: Any, sentence: str) -> None:
    expected = translate(server, sentence, attention=True, nbest=1)
    attention = expected["attention"]
    open_page(driver, server.url, sentence)
    wait_translation(driver, expected["text"])
    assert not driver.find_elements(By.CSS_SELECTOR, "#attention table")
    find(driver, "#attention-button").click()
    table = wait(
        driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#attention table"), "the attention map"
    )[0]
    rows = table.find_elements(By.CSS_SELECTOR, "tbody tr")
    assert len(rows) == len(attention["target"]) == len(attention["weights"])
    assert [text_of(th) for th in table.find_elements(By.CSS_SELECTOR, "thead th")][
        1:
    ] == attention["source"]
    for row, piece, weights in zip(rows, attention["target"], attention["weights"], strict=True):
        assert text_of(row.find_element(By.TAG_NAME, "th")) == piece
        cells = row.find_elements(By.TAG_NAME, "td")
        assert len(cells) == len(attention["source"])
        assert [float(c.get_attribute("data-weight")) for c in cells] == pytest.approx(weights)
    # typing on: the map is of the old text, and goes
    find(driver, "#source").send_keys(" x")
    wait(
        driver,
        lambda d: not d.find_elements(By.CSS_SELECTOR, "#attention table"),
        "a new text clears the map",
    )


def test_must_include(server: Server, engine: Engine, driver: Any, sentence: str) -> None:
    status, answer, _ = server.post("/v1/translate", body(sentence, constraints=[MUST]))
    assert engine.answered(status, answer, "lexical constraints"), answer
    open_page(driver, server.url, sentence, must=MUST)
    if engine.refusal("lexical constraints"):  # CTranslate2: the page shows its 400
        wait_error(driver, answer["error"])
        return
    expected = answer["translations"][0]["text"]
    assert MUST in expected
    wait_translation(driver, expected)


def test_avoid(server: Server, engine: Engine, driver: Any, sentence: str) -> None:
    plain = translate(server, sentence)["text"]
    word = max((w.strip(".,;:!?\"'") for w in plain.split()), key=len)
    status, answer, _ = server.post("/v1/translate", body(sentence, avoid=[word]))
    assert engine.answered(status, answer, "lexical constraints"), answer
    open_page(driver, server.url, sentence)
    wait_translation(driver, plain)
    find(driver, "#avoid").send_keys(word)
    if engine.refusal("lexical constraints"):  # CTranslate2: the page shows its 400
        wait_error(driver, answer["error"])
        return
    expected = answer["translations"][0]["text"]
    assert word not in expected
    wait_translation(driver, expected)


def test_an_error_of_the_server_is_shown(server: Server, driver: Any, sentence: str) -> None:
    too_long = "a " * 2600  # over the server's --max-chars 5000: 400 with a message, pasted at once
    status, answer, _ = server.post("/v1/translate", body(too_long.strip()))
    assert status == 400 and "5000" in answer["error"], answer
    open_page(driver, server.url, sentence)
    wait_translation(driver, translate(server, sentence)["text"])
    driver.execute_script(
        "const s = document.getElementById('source'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'));",
        too_long,
    )
    wait_error(driver, answer["error"])
    assert find(driver, "#error").get_attribute("role") == "alert"
    assert text_of(find(driver, "#translation")) == ""  # no stale translation next to the error
    # a good text again: the error goes
    driver.execute_script(
        "const s = document.getElementById('source'); s.value = arguments[0];"
        "s.dispatchEvent(new Event('input'));",
        sentence,
    )
    wait(
        driver,
        lambda d: text_of(find(d, "#error")) == "" and text_of(find(d, "#translation")),
        "the error is cleared by the next translation",
    )


def test_api_key_and_network_errors(
    engine: Engine, trained_checkpoint: Path, driver: Any, sentence: str, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("s3cret\n")
    model = f"{MODEL}={trained_checkpoint}"
    with Server(*engine.args, "--model", model, "--api-keys", str(keys)) as keyed:
        open_page(driver, keyed.url, sentence)
        assert find(driver, "#api-key").is_displayed()
        wait_error(driver, "Invalid API key")  # the 403's message
        status, answer, _ = keyed.post("/v1/translate", {**body(sentence), "api_key": "s3cret"})
        assert status == 200, answer
        find(driver, "#api-key").send_keys("s3cret")
        wait_translation(driver, answer["translations"][0]["text"])
        assert text_of(find(driver, "#error")) == ""
    # the server is gone: a network error, shown the same way
    find(driver, "#source").send_keys(" again")
    wait(
        driver,
        lambda d: text_of(find(d, "#error")).startswith("Network error"),
        "#error shows a network error",
    )


def test_screenshots(server: Server, driver: Any, sentence: str, tmp_path: Path) -> None:
    folder = Path(os.environ.get("NMT_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    expected = translate(server, sentence)
    open_page(driver, server.url, sentence)
    wait_translation(driver, expected["text"])
    save_png(driver, folder, "serve-page.png")
    find(driver, "#attention-button").click()
    wait(
        driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#attention table"), "the attention map"
    )
    driver.execute_script("document.getElementById('attention').scrollIntoView()")
    save_png(driver, folder, "serve-page-attention.png")

"""`tracefleet traces show` as a person reads it: text decoded with the trace's own tokenizer (found from the
model the capture names, no flag), trainable tokens coloured apart from context in the terminal, and the
same as an HTML page opened in a real headless browser (Debian's Chromium, installed by
hack/setup.d/60-browser.sh): the rendered DOM holds the decoded text with every sampled span marked
trainable, one marker per call, the reward; the browser's own layout and computed styles show every
trainable token on the highlight and the context in grey."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

from fixtures.browser import browser

DATA = Path(__file__).resolve().parent / "data"
# A real harness session (pi) recorded through the proxy against SmolLM2's tokenizer (data/README.md):
# two shell tool calls, then a closing sentence.
RECORDED = DATA / "recorded-pi.jsonl"
TRAINABLE_BG = "rgb(216, 245, 208)"  # .smp background (#d8f5d0) in traces/render.py's page style
CONTEXT_FG = "rgb(136, 136, 136)"  # .ctx colour (#888)


def tracefleet(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracefleet", *argv], capture_output=True, text=True, timeout=180)


class PageText(HTMLParser):
    """What the rendered page shows, by the class of the element each piece of text sits in."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.calls: list[str] = []  # marker texts, in order
        self.sampled: list[list[str]] = []  # per call: its trainable pieces
        self.context: list[str] = []
        self.cells: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        cls = dict(attrs).get("class") or tag
        self.stack.append(cls)
        if cls == "marker":
            self.sampled.append([])

    def handle_endtag(self, tag: str) -> None:
        if self.stack:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        where = self.stack[-1] if self.stack else ""
        if "stream" not in self.stack and where != "td":
            return  # the legend, the title: not the trace
        if where == "marker":
            self.calls.append(data)
        elif where == "smp":
            self.sampled[-1].append(data)
        elif where == "ctx":
            self.context.append(data)
        elif where == "td":
            self.cells.append(data)


# Appended to a copy of the page (the page itself has no script): records how the browser laid out and
# styled each piece, so the test reads what the eye gets, not just the markup.
LOOK = """<script>
const look = sel => [...document.querySelectorAll(sel)].map(e => {
  const r = e.getBoundingClientRect(), st = getComputedStyle(e);
  return {text: e.textContent, bg: st.backgroundColor, color: st.color,
          shown: r.width > 0 && r.height > 0 && st.visibility === "visible"};
});
document.body.setAttribute("data-look", JSON.stringify(
  {smp: look(".stream .smp"), ctx: look(".stream .ctx"), marker: look(".stream .marker")}));
</script>"""


def test_show_decodes_with_the_traces_own_tokenizer_and_colours_trainable_text(tmp_path: Path) -> None:
    shown = tracefleet("traces", "show", str(RECORDED), "--color", "always")
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "shown as text (smollm2 tokenizer)" in out.splitlines()[0], out.splitlines()[0]
    # the sampled answer, in green (trainable); the prompt's chat markup dim (context)
    assert "\x1b[32mAll done: note.txt has both lines.<|im_end|>\x1b[0m" in out, out[-600:]
    assert '\x1b[32m<tool_call>\n{"name": "bash", "arguments": {"command": "echo tracefleet-round-1 > note.txt"}}' in out
    assert "\x1b[2m<|im_start|>system\n" in out
    ids = tracefleet("traces", "show", str(RECORDED), "--ids", "--color", "never")
    assert ids.returncode == 0 and "shown as token ids" in ids.stdout and "<tool_call>" not in ids.stdout


def test_the_html_page_in_a_real_browser(tmp_path: Path) -> None:
    page = tmp_path / "trace.html"
    made = tracefleet("traces", "show", str(RECORDED), "--html", str(page), "--color", "never")
    assert made.returncode == 0, made.stderr
    dom = browser("--dump-dom", page.as_uri())
    assert dom.returncode == 0 and "</html>" in dom.stdout, dom.stderr[-2000:]
    seen = PageText()
    seen.feed(dom.stdout)
    # one marker per model call, each followed by that call's sampled text, marked trainable
    assert len(seen.calls) == 3 and all(c.startswith("▌call ") for c in seen.calls), seen.calls
    assert [c.rsplit("· ", 1)[1] for c in seen.calls] == ["tool_calls", "tool_calls", "stop"]
    answers = ["".join(parts) for parts in seen.sampled]
    assert answers[0].startswith('<tool_call>\n{"name": "bash", "arguments": {"command": "echo tracefleet-round-1 > note.txt"}}')
    assert "tracefleet-round-2 >> note.txt" in answers[1]
    assert answers[2] == "All done: note.txt has both lines.<|im_end|>"
    # the context reads as text too (the harness's system prompt and the tool results), not ids
    context = "".join(seen.context)
    assert context.startswith("<|im_start|>system\nYou are an expert coding assistant operating inside pi")
    assert "<tool_response>" in context
    # the header a person checks first
    assert seen.cells[seen.cells.index("reward") + 1].startswith("0.0")
    assert "1,691 (91 trainable) in 3 call(s)" in seen.cells

    # and what the eye gets: every trainable token on a green ground, context in grey, markers on screen
    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", LOOK + "</body>"))
    laid_out = browser("--dump-dom", probe.as_uri())
    assert laid_out.returncode == 0, laid_out.stderr[-2000:]
    look = json.loads(html.unescape(re.search(r'data-look="([^"]*)"', laid_out.stdout).group(1)))
    assert len(look["smp"]) == 91 and len(look["marker"]) == 3
    assert {x["bg"] for x in look["smp"]} == {TRAINABLE_BG}
    # every token with visible text is on screen (a token that is only a line break has no width)
    assert all(x["shown"] for x in look["smp"] if x["text"].strip()), [x for x in look["smp"] if not x["shown"]]
    assert {x["color"] for x in look["ctx"]} == {CONTEXT_FG} and all(x["shown"] for x in look["ctx"] + look["marker"])
    assert TRAINABLE_BG not in {x["bg"] for x in look["ctx"]}

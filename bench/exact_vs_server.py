"""Exact vs server capture mode on the CPU engine (SmolLM2, llama.cpp, 1 thread), two scenarios, one run.

    .venv/bin/python bench/exact_vs_server.py [--scenario tools|chat|both] [--turns 20] [--max-tokens N]

Each scenario starts its own `tracefleet engine`-equivalent subprocess (this file, `--serve-engine`:
the real llama backend and the real engine HTTP app, plus a counter route), then runs the same
session through the proxy app once per mode (server: the engine renders the chat template; exact:
the proxy renders + splices and sends token ids). Before each mode the engine's KV cache is cleared
(a 1-token request), so both modes start cold.

Scenarios
- `tools`: a 20-call tool-using agent session under a Qwen3-style template (`qwen3_tools.jinja`:
  tools in the system turn, hermes `<tool_call>` JSON, `<think>` reasoning that the template drops
  from turns before the last user query) on SmolLM2's tokenizer, in both the engine (server mode)
  and the proxy (exact mode). 5 tasks × (3 tool calls + 1 final answer). The bench is the harness: it
  sends the tools, answers each parsed tool call with a tool message, echoing the assistant turn
  the way real Chat-API harnesses do (arguments re-serialised compactly, `{"path":"a.py"}`; content
  `.strip()`ed; `reasoning_content` not sent back), and sends the next task's user turn after a
  final answer.
  SmolLM2-135M does NOT emit tool calls by itself (measured: greedy, with a few-shot system prompt
  or few-shot tool turns in the history, 0 of 14 prompts gave a `<tool_call>`; it writes code
  blocks or copies `<tool_response>`). So the engine subprocess applies *guided decoding* for this
  scenario, the way a vLLM structured-output / `tool_choice` grammar constrains a model: every turn
  is `<think>\\n` (forced) + one line of reasoning the model samples (greedy, at most 12 tokens; the
  grammar bars newlines, `<` and special tokens, and the line ends where the model's own choice is
  one of those), then either `\\n</think>\\n\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`
  + `<|im_end|>` (forced, encoded as one piece so its tokens are the canonical tokenization; the
  task's scripted next call, chosen from the prompt: how many `<tool_response>` turns follow the
  last real user turn) or, after the third tool result, `\\n</think>\\n\\n` + an answer the model
  samples freely except that tokens containing `<` are barred (with three of its own tool calls in
  context SmolLM2 starts emitting `<tool_call>`s unprompted, which would make the two modes' sessions
  diverge), until `<|im_end|>` / max_tokens. Forced tokens are fed
  through the model like sampled ones (they are in the KV cache; their logprobs are the model's),
  and the guide is identical in both modes, so what differs is only how each mode builds the
  next prompt. The drift server mode then meets is the template's and the harness's, not the
  guide's: reasoning dropped from earlier tasks' turns when a new user turn arrives (Qwen3
  templates rewrite history), the reasoning's own whitespace normalised on re-render
  (`reasoning.strip('\\n')`), stripped answers. Compact tool-call arguments do NOT drift here: the
  engine parses the echoed JSON and re-renders it with `tojson` (`{"path": "a.py"}`), which is the
  layout the guide samples; they drift only when a model samples another layout.
- `chat`: the original plain chat (ChatML template, no tools, no guide): 20 user questions, each
  answer echoed back `.strip()`ed.

Reported per scenario and mode: calls, wall time, prompt tokens, tokens the engine actually prefilled
(counted inside the engine process: tokens llama.cpp evaluated during prefill, after its
longest-common-prefix KV reuse, the CPU analogue of vLLM's prefix cache), the cache-hit ratio
(1 - prefilled / prompt tokens), links where the prompt extends the previous prompt + completion
exactly vs drift links, and the traces the prefix-merge builder makes (traces, drift splits);
exact mode adds the splicer's stats. Then exact/server ratios. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import uvicorn

QUESTIONS = ["Name a color.", "Name a fruit of that color.", "How does it taste?", "Where does it grow?",
             "Is it healthy?", "How do you store it?", "Name a recipe with it.", "How long does it cook?",
             "What goes well with it?", "Is it expensive?"]
SECRET = "bench-secret-0123456789"
TOOLS_TEMPLATE = "qwen3_tools.jinja"
REASONING_TOKENS = 12

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"]}}},
    {"type": "function", "function": {"name": "run", "description": "Run a shell command in the repository",
                                      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                     "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "write_file", "description": "Replace a file's content",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "content": {"type": "string"}},
                                          "required": ["path", "content"]}}},
]
SYSTEM_TOOLS = "You are a coding agent working in a small Python repository. Use the tools, then answer briefly."

# task: (user turn, [(tool name, arguments, tool result)] * 3)
TASKS: list[tuple[str, list[tuple[str, dict[str, Any], str]]]] = [
    ("Why does `python app.py` crash?", [
        ("read_file", {"path": "app.py"}, "import config\nprint(config.PORT + 1)\n"),
        ("read_file", {"path": "config.py"}, "PORT = '8080'\n"),
        ("run", {"cmd": "python app.py"}, "TypeError: can only concatenate str (not \"int\") to str\n")]),
    ("Fix it.", [
        ("write_file", {"path": "config.py", "content": "PORT = 8080\n"}, "wrote 12 bytes"),
        ("run", {"cmd": "python app.py"}, "8081\n"),
        ("run", {"cmd": "git diff --stat"}, " config.py | 2 +-\n 1 file changed, 1 insertion(+), 1 deletion(-)\n")]),
    ("Are there tests?", [
        ("run", {"cmd": "ls tests"}, "test_app.py\n"),
        ("read_file", {"path": "tests/test_app.py"}, "from config import PORT\n\ndef test_port():\n    assert PORT == 8080\n"),
        ("run", {"cmd": "python -m pytest -q"}, "1 passed in 0.01s\n")]),
    ("Add a test for the banner.", [
        ("read_file", {"path": "app.py"}, "import config\nprint(config.PORT + 1)\n"),
        ("write_file", {"path": "tests/test_banner.py",
                        "content": "import subprocess\n\ndef test_banner():\n    assert subprocess.check_output(['python', 'app.py']) == b'8081\\n'\n"},
         "wrote 98 bytes"),
        ("run", {"cmd": "python -m pytest -q"}, "2 passed in 0.03s\n")]),
    ("Summarise the changes.", [
        ("run", {"cmd": "git status --short"}, " M config.py\n?? tests/test_banner.py\n"),
        ("run", {"cmd": "git diff"}, "-PORT = '8080'\n+PORT = 8080\n"),
        ("read_file", {"path": "tests/test_banner.py"}, "import subprocess\n...\n")]),
]


# --- the engine subprocess -------------------------------------------------------------------------

def serve_engine(template: str | None, guided: bool) -> None:
    """The real llama backend + the engine's own HTTP app, counting the tokens prefill evaluates."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import numpy as np

    from tracefleet.engine.backend import SampledToken
    from tracefleet.engine.llama import logsumexp, sample
    from tracefleet.engine.server import create_app as engine_app
    from tracefleet.engine.llama import llama_backend_for
    from tracefleet.formats.models import TEMPLATES

    backend = llama_backend_for("smollm2", n_threads=1)
    if template:
        backend.chat_template = (TEMPLATES / template).read_text()
    tok = backend.tokenizer
    counters = {"prefill_calls": 0, "prompt_tokens": 0, "prefilled_tokens": 0, "guided_tool_calls": 0}
    in_prefill = threading.local()
    orig_decode, orig_prefill = backend._decode, backend._prefill

    def counting_decode(tokens: list[int], all_logits: bool) -> Iterator[Any]:
        if getattr(in_prefill, "on", False):
            counters["prefilled_tokens"] += len(tokens)
        return orig_decode(tokens, all_logits)

    def counting_prefill(prompt: list[int], want: int | None, stream: Any) -> Any:
        counters["prefill_calls"] += 1
        counters["prompt_tokens"] += len(prompt)
        in_prefill.on = True
        try:
            return orig_prefill(prompt, want, stream)
        finally:
            in_prefill.on = False

    backend._decode, backend._prefill = counting_decode, counting_prefill  # type: ignore[method-assign]
    stop_ids = backend.stop_token_ids
    im_end = tok.encode("<|im_end|>")
    assert len(im_end) == 1
    # the reasoning grammar: one line of text, no tags, no special tokens
    not_reasoning = np.array([i in stop_ids or "<" in t or "\n" in t or not t.strip()
                              for i, t in enumerate(tok.token_text(i) for i in range(backend.n_vocab))])
    tag = np.array(["<" in tok.token_text(i) and i not in stop_ids for i in range(backend.n_vocab)])

    def next_tool_call(prompt_ids: list[int]) -> tuple[str, dict[str, Any]] | None:
        """The scripted call for this point of the session, or None (answer freely)."""
        text = tok.decode(prompt_ids, skip_special_tokens=False)
        if "<tools>" not in text:
            return None
        turns = text.split("<|im_start|>user\n")
        real = [i for i, t in enumerate(turns) if i > 0 and not t.startswith("<tool_response>")]
        if not real:
            return None
        task, done = len(real) - 1, len(turns) - 1 - real[-1]
        if task >= len(TASKS) or done >= len(TASKS[task][1]):
            return None
        name, args, _ = TASKS[task][1][done]
        return name, args

    class GuidedStream:
        def __init__(self, request: Any) -> None:
            self.request = request
            self.prompt_logprobs = None

        def __iter__(self) -> Iterator[SampledToken]:
            req, p = self.request, self.request.params
            rng = np.random.default_rng(p.seed)
            call = next_tool_call(list(req.prompt_ids))
            budget = min(p.max_tokens, backend.max_model_len - len(req.prompt_ids))
            with backend.lock:
                state = {"logits": backend._prefill(list(req.prompt_ids), None, self), "pending": None, "n": 0}

                def logits() -> np.ndarray:
                    if state["pending"] is not None:
                        *_, rows = backend._decode([state["pending"]], all_logits=False)
                        state["logits"], state["pending"] = rows[-1], None
                    return state["logits"]

                def emit(tid: int) -> SampledToken:
                    lg = logits()
                    state["pending"], state["n"] = tid, state["n"] + 1
                    return SampledToken(tid, float(lg[tid]) - logsumexp(lg))

                def forced(text: str) -> Iterator[SampledToken]:
                    for tid in tok.encode(text):
                        if state["n"] >= budget:
                            return
                        yield emit(tid)

                yield from forced("<think>\n")
                for i in range(REASONING_TOKENS):  # free one-line reasoning (the first token must be text)
                    if state["n"] >= budget:
                        return
                    lg = logits()
                    tid = sample(lg, p.temperature, p.top_p, rng)
                    if not_reasoning[tid]:
                        if i > 0:
                            break  # the model ends the line (or the turn): so does the reasoning
                        tid = sample(np.where(not_reasoning, -np.inf, lg), p.temperature, p.top_p, rng)
                    yield emit(tid)
                if call is not None:
                    # one piece, so the forced tokens are the canonical tokenization of the text
                    counters["guided_tool_calls"] += 1
                    call_json = json.dumps({"name": call[0], "arguments": call[1]})
                    yield from forced(f"\n</think>\n\n<tool_call>\n{call_json}\n</tool_call>")
                    if state["n"] < budget:
                        yield emit(im_end[0])
                    return
                yield from forced("\n</think>\n\n")
                while state["n"] < budget:  # the final answer: free text without tags, until the end of turn
                    # (with three of its own tool calls in context SmolLM2 starts copying them here)
                    tid = sample(np.where(tag, -np.inf, logits()), p.temperature, p.top_p, rng)
                    yield emit(tid)
                    if tid in stop_ids:
                        return

    if guided:
        backend.generate = lambda request: GuidedStream(request)  # type: ignore[method-assign]
    app = engine_app(backend, default_max_tokens=512)

    @app.get("/bench/counters")
    async def _counters() -> dict[str, int]:
        return dict(counters)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(json.dumps({"event": "listening", "url": f"http://127.0.0.1:{sock.getsockname()[1]}"}), flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False)).run(sockets=[sock])


def start_engine(template: str | None, guided: bool) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--serve-engine"]
    if template:
        argv += ["--engine-template", template]
    if guided:
        argv.append("--guided")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("{") and '"listening"' in line:
            url = json.loads(line)["url"]
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
            for _ in range(600):
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        return proc, url
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
    proc.kill()
    raise SystemExit("engine did not start (run `bash hack/setup.d/40-engine.sh`)")


# --- the harness side --------------------------------------------------------------------------------

def serve(app: Any) -> tuple[uvicorn.Server, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, f"http://127.0.0.1:{sock.getsockname()[1]}"


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def chat_session(http: httpx.Client, turns: int, max_tokens: int) -> dict[str, int]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You answer briefly."}]
    for k in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[k % len(QUESTIONS)] + (f" ({k})" if k >= len(QUESTIONS) else "")})
        r = http.post("/v1/chat/completions", json={"model": "smollm2", "messages": messages, "temperature": 0,
                                                    "max_tokens": max_tokens})
        r.raise_for_status()
        messages.append({"role": "assistant", "content": (r.json()["choices"][0]["message"]["content"] or "").strip()})
    return {}


def tool_result(name: str, args: dict[str, Any]) -> str:
    for _, calls in TASKS:
        for n, a, result in calls:
            if n == name and a == args:
                return result
    return f"error: no such {name} {json.dumps(args)}"


def tools_session(http: httpx.Client, turns: int, max_tokens: int) -> dict[str, int]:
    """A harness loop: tools in every request, tool calls answered, compact re-serialised echo."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_TOOLS}]
    calls = tool_calls = answers = 0
    task = 0
    while calls < turns:
        messages.append({"role": "user", "content": TASKS[task % len(TASKS)][0]})
        task += 1
        while calls < turns:
            r = http.post("/v1/chat/completions", json={"model": "smollm2", "messages": messages, "tools": TOOLS,
                                                        "temperature": 0, "max_tokens": max_tokens})
            r.raise_for_status()
            calls += 1
            msg = r.json()["choices"][0]["message"]
            content = (msg.get("content") or "").strip()
            if not msg.get("tool_calls"):
                answers += 1
                messages.append({"role": "assistant", "content": content})
                break
            echoed, results = [], []
            for tc in msg["tool_calls"]:
                args = json.loads(tc["function"]["arguments"] or "{}")
                echoed.append({"id": tc["id"], "type": "function", "function": {
                    "name": tc["function"]["name"], "arguments": json.dumps(args, separators=(",", ":"))}})
                results.append({"role": "tool", "tool_call_id": tc["id"], "content": tool_result(tc["function"]["name"], args)})
                tool_calls += 1
            messages.append({"role": "assistant", "content": content or None, "tool_calls": echoed})
            messages.extend(results)
    return {"tool_calls": tool_calls, "answers": answers, "user_turns": task}


def run_mode(scenario: str, mode: str, engine_url: str, turns: int, max_tokens: int) -> dict[str, Any]:
    from tracefleet.contract.capture import read_capture_log
    from tracefleet.formats.families import load_model_format
    from tracefleet.formats.models import TEMPLATES
    from tracefleet.proxy.app import create_app
    from tracefleet.proxy.config import PresetSession, ProxyConfig
    from tracefleet.proxy.engine_client import EngineClient
    from tracefleet.proxy.exact.engine import ExactTokenEngine
    from tracefleet.proxy.token_engine import ServerTokenEngine
    from tracefleet.traces.build import build_traces

    capture = Path(tempfile.mkdtemp(prefix=f"tf-bench-{scenario}-{mode}-"))
    config = ProxyConfig(engine_url=engine_url, capture_dir=capture, admin_token="admin", mode=mode,
                         sessions=[PresetSession(session_id="b", secret=SECRET)])
    client = EngineClient(engine_url)
    fmt = load_model_format("smollm2", template_file=TEMPLATES / TOOLS_TEMPLATE if scenario == "tools" else None)
    token_engine = ExactTokenEngine(client, fmt) if mode == "exact" else ServerTokenEngine(client)
    server, url = serve(create_app(config, token_engine=token_engine))
    # cold start for each mode: replace the engine's KV cache with one unrelated token
    httpx.post(engine_url + "/v1/completions", json={"prompt": [42], "max_tokens": 1}, timeout=60).raise_for_status()
    before = httpx.get(engine_url + "/bench/counters", timeout=10).json()
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=600, headers={"authorization": f"Bearer {SECRET}"}) as http:
        extra = (tools_session if scenario == "tools" else chat_session)(http, turns, max_tokens)
    wall = time.perf_counter() - t0
    after = httpx.get(engine_url + "/bench/counters", timeout=10).json()
    server.should_exit = True
    recs = read_capture_log(capture / "b.jsonl").records
    model_prefill, exact_links, kv = 0, 0, None
    for rec in recs:  # the llama backend's rule, from the capture log (a cross-check of the engine's count)
        model_prefill += len(rec.prompt_ids) - (min(common_prefix(kv, rec.prompt_ids), len(rec.prompt_ids) - 1) if kv else 0)
        if kv is not None and rec.prompt_ids[:len(kv)] == kv:
            exact_links += 1
        kv = rec.prompt_ids + rec.completion_ids
    stats = build_traces(capture / "b.jsonl").stats
    prompt_tokens = sum(len(r.prompt_ids) for r in recs)
    prefilled = after["prefilled_tokens"] - before["prefilled_tokens"]
    out: dict[str, Any] = {
        "mode": mode, "calls": len(recs), "wall_s": round(wall, 2), "prompt_tokens": prompt_tokens,
        "prefilled_tokens": prefilled, "prefilled_tokens_from_log": model_prefill,
        "cache_hit_ratio": round(1 - prefilled / max(1, prompt_tokens), 3),
        "completion_tokens": sum(len(r.completion_ids) for r in recs),
        "exact_links": exact_links, "drift_links": len(recs) - 1 - exact_links,
        "traces": stats.traces, "drift_splits": stats.drift_splits, "merged_calls": stats.merged_calls,
        "new_roots": stats.new_roots, **extra,
    }
    if mode == "exact":
        out["splicer"] = {**token_engine.stats, "new_root_reasons": token_engine.new_root_reasons}  # type: ignore[attr-defined]
    return out


def run_scenario(scenario: str, turns: int, max_tokens: int) -> dict[str, Any]:
    proc, url = start_engine(TOOLS_TEMPLATE if scenario == "tools" else None, guided=scenario == "tools")
    try:
        server = run_mode(scenario, "server", url, turns, max_tokens)
        exact = run_mode(scenario, "exact", url, turns, max_tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {"server": server, "exact": exact,
            "prefill_ratio_exact_over_server": round(exact["prefilled_tokens"] / max(1, server["prefilled_tokens"]), 3),
            "wall_ratio_exact_over_server": round(exact["wall_s"] / max(1e-9, server["wall_s"]), 3),
            "traces_exact_vs_server": [exact["traces"], server["traces"]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", choices=["tools", "chat", "both"], default="both")
    ap.add_argument("--turns", type=int, default=20, help="model calls per session (default 20)")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="max_tokens per call (default: tools 128, since a guided tool-call turn needs up to ~90; chat 32)")
    ap.add_argument("--serve-engine", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine-template", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--guided", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve_engine:
        serve_engine(args.engine_template, args.guided)
        return 0
    scenarios = ["tools", "chat"] if args.scenario == "both" else [args.scenario]
    t0 = time.perf_counter()
    result: dict[str, Any] = {s: run_scenario(s, args.turns, args.max_tokens or (128 if s == "tools" else 32))
                               for s in scenarios}
    result["total_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

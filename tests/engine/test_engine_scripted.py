"""The scripted engine over HTTP: vLLM-shaped answers with real token ids, for harness tests."""

from __future__ import annotations

import json

import httpx
import pytest

BASH = {"type": "function", "function": {
    "name": "bash", "description": "run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
READ = {"type": "function", "function": {
    "name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                        "required": ["path"]}}}
USER = [{"role": "user", "content": "make a note"}]


def _post(engine, path: str, body: dict) -> httpx.Response:
    return httpx.post(engine.url + path, json=body, timeout=30)


def _sse(engine, path: str, body: dict) -> list[dict]:
    chunks = []
    with httpx.stream("POST", engine.url + path, json={**body, "stream": True}, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                chunks.append({"done": True})
            else:
                chunks.append(json.loads(data))
    assert chunks[-1] == {"done": True}
    return chunks[:-1]


def _history(calls: list[dict], results: int) -> list[dict]:
    msgs = list(USER)
    for i in range(results):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [calls[0]]})
        msgs.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": f"result {i}"})
    return msgs


def test_models_and_health(scripted_engine):
    assert httpx.get(scripted_engine.url + "/health").status_code == 200
    models = httpx.get(scripted_engine.url + "/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [scripted_engine.model] == ["smollm2"]


def test_tool_call_is_openai_shaped_with_token_ids(scripted_engine):
    body = {"model": "smollm2", "messages": USER, "tools": [READ, BASH], "return_token_ids": True,
            "logprobs": True, "top_logprobs": 3}
    r = _post(scripted_engine, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    choice = out["choices"][0]
    assert out["object"] == "chat.completion" and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("chatcmpl-tool-")
    assert call["function"]["name"] == "bash"  # the shell-like tool is preferred over the first one
    assert json.loads(call["function"]["arguments"]) == {"command": "echo tracefleet > note.txt"}
    assert choice["message"]["content"] is None
    # Prompt ids are the chat template rendered and tokenized: the same as /tokenize says.
    tok = _post(scripted_engine, "/tokenize", {"messages": USER, "tools": [READ, BASH]}).json()
    assert out["prompt_token_ids"] == tok["tokens"] and out["usage"]["prompt_tokens"] == tok["count"]
    # Completion ids are the raw hermes text plus the end-of-turn token, one logprob each.
    ids = choice["token_ids"]
    raw = _post(scripted_engine, "/detokenize", {"tokens": ids}).json()["prompt"]
    assert raw.startswith("<tool_call>\n{") and raw.endswith("</tool_call><|im_end|>")
    assert json.loads(raw[len("<tool_call>\n"):raw.index("\n</tool_call>")])["name"] == "bash"
    text_ids = _post(scripted_engine, "/tokenize", {"prompt": raw.removesuffix("<|im_end|>")}).json()["tokens"]
    assert ids[:-1] == text_ids
    lps = choice["logprobs"]["content"]
    assert len(lps) == len(ids) == out["usage"]["completion_tokens"]
    assert all(e["logprob"] < 0 and e["top_logprobs"][0]["logprob"] == e["logprob"] for e in lps)
    assert all(len(e["top_logprobs"]) == 3 for e in lps)


def test_script_rounds_then_final_text(scripted_engine):
    first = _post(scripted_engine, "/v1/chat/completions", {"messages": USER, "tools": [BASH]}).json()
    calls = first["choices"][0]["message"]["tool_calls"]
    second = _post(scripted_engine, "/v1/chat/completions",
                   {"messages": _history(calls, 1), "tools": [BASH]}).json()["choices"][0]
    assert json.loads(second["message"]["tool_calls"][0]["function"]["arguments"]) == {"command": "ls"}
    final = _post(scripted_engine, "/v1/chat/completions",
                  {"messages": _history(calls, 2), "tools": [BASH]}).json()["choices"][0]
    assert final["finish_reason"] == "stop" and final["message"].get("tool_calls", []) == []  # vLLM omits an empty list
    assert final["message"]["content"].startswith("Done.")
    no_tools = _post(scripted_engine, "/v1/chat/completions", {"messages": USER}).json()["choices"][0]
    assert no_tools["finish_reason"] == "stop" and "scripted engine" in no_tools["message"]["content"]


def test_routes_drive_sessions_by_a_marker_in_the_conversation(scripted_engine):
    scripted_engine.configure(routes=[{"marker": "[plan:edit]", "commands": ["sed -i s/5/1/ test_calc.py"]},
                                      {"marker": "[plan:claim]", "final_text": "Fixed it."}])

    def reply(prompt: str, results: int = 0) -> dict:
        msgs = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        for i in range(results):
            msgs += [{"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "ok"}]
        return _post(scripted_engine, "/v1/chat/completions", {"messages": msgs, "tools": [BASH]}).json()["choices"][0]

    edit = reply("fix add [plan:edit]")["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(edit) == {"command": "sed -i s/5/1/ test_calc.py"}
    assert reply("fix add [plan:edit]", 1)["message"]["content"].startswith("Done.")  # one command: one round
    claim = reply("fix add [plan:claim]")
    assert claim["finish_reason"] == "stop" and claim["message"]["content"] == "Fixed it."
    unrouted = reply("fix add")["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(unrouted) == {"command": "echo tracefleet > note.txt"}
    # a token-id prompt (exact mode) is routed by its rendered text
    raw = _post(scripted_engine, "/tokenize", {"messages": [{"role": "user", "content": "go [plan:claim]"}], "tools": [BASH],
                                               "add_generation_prompt": True}).json()["tokens"]
    done = _post(scripted_engine, "/v1/completions", {"prompt": raw, "max_tokens": 64}).json()["choices"][0]
    assert done["text"].startswith("Fixed it.")


def test_streaming_matches_non_streaming(scripted_engine):
    body = {"messages": USER, "tools": [BASH], "return_token_ids": True, "logprobs": True,
            "stream_options": {"include_usage": True}}
    whole = _post(scripted_engine, "/v1/chat/completions", body).json()
    chunks = _sse(scripted_engine, "/v1/chat/completions", body)
    token_chunks = [c for c in chunks if c["choices"] and c["choices"][0].get("token_ids")]
    assert len(token_chunks) > 5  # token by token, not one burst
    assert chunks[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    ids = [i for c in token_chunks for i in c["choices"][0]["token_ids"]]
    assert ids == whole["choices"][0]["token_ids"]
    lps = [e["logprob"] for c in token_chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert lps == [e["logprob"] for e in whole["choices"][0]["logprobs"]["content"]]
    calls = [tc for c in token_chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["index"] == 0 and calls[0]["type"] == "function"
    assert calls[0]["function"] == {**whole["choices"][0]["message"]["tool_calls"][0]["function"]}
    assert not any(c["choices"][0]["delta"].get("content") for c in token_chunks)  # the tag never leaks as text
    assert token_chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(ids)


def test_final_text_streams_in_pieces(scripted_engine):
    msgs = USER + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "note.txt"}]}] * 1
    scripted_engine.configure(tool_rounds=1, final_text="All done: note.txt exists.")
    chunks = _sse(scripted_engine, "/v1/chat/completions", {"messages": msgs, "tools": [BASH]})
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:] if c["choices"][0]["delta"].get("content")]
    assert len(texts) > 3 and "".join(texts) == "All done: note.txt exists."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_configured_steps_and_argument_templates(scripted_engine):
    scripted_engine.configure(
        tool_rounds=2,
        steps=[{"tools": ["read_file"], "arguments": {"path": "round-{round}.txt"}, "text": "Reading."}],
        argument_templates={"bash": {"command": "{command} && echo ok"}},
        commands=["pwd", "whoami"])
    first = _post(scripted_engine, "/v1/chat/completions", {"messages": USER, "tools": [BASH, READ]}).json()
    msg = first["choices"][0]["message"]
    assert msg["content"] == "Reading.\n"
    assert msg["tool_calls"][0]["function"] == {"name": "read_file", "arguments": '{"path": "round-0.txt"}'}
    second = _post(scripted_engine, "/v1/chat/completions",
                   {"messages": _history(msg["tool_calls"], 1), "tools": [BASH, READ]}).json()
    assert json.loads(second["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {
        "command": "whoami && echo ok"}


def test_token_id_prompt_answers_in_raw_hermes_format(scripted_engine):
    """Exact mode sends rendered ids to /v1/completions; the script reads tools and results back from them."""
    first = _post(scripted_engine, "/v1/chat/completions",
                  {"messages": USER, "tools": [BASH], "return_token_ids": True}).json()
    prompt_ids = _post(scripted_engine, "/tokenize", {"messages": USER, "tools": [BASH]}).json()["tokens"]
    r = _post(scripted_engine, "/v1/completions", {"model": "smollm2", "prompt": prompt_ids, "max_tokens": 200,
                                                   "return_token_ids": True, "logprobs": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["prompt_token_ids"] == prompt_ids
    assert choice["token_ids"] == first["choices"][0]["token_ids"]
    assert choice["text"].startswith("<tool_call>\n") and choice["text"].endswith("</tool_call>")
    assert json.loads(choice["text"][12:-13]) == {"name": "bash", "arguments": {"command": "echo tracefleet > note.txt"}}
    assert len(choice["logprobs"]["token_logprobs"]) == len(choice["token_ids"])
    # Two results in the rendered history: the script ends with text.
    calls = first["choices"][0]["message"]["tool_calls"]
    later = _post(scripted_engine, "/tokenize", {"messages": _history(calls, 2), "tools": [BASH]}).json()["tokens"]
    final = _post(scripted_engine, "/v1/completions", {"prompt": later, "max_tokens": 200}).json()["choices"][0]
    assert final["text"].startswith("Done.") and final["finish_reason"] == "stop"


def test_completion_stream_carries_ids_and_prompt_logprobs(scripted_engine):
    body = {"prompt": "Say hi", "max_tokens": 6, "return_token_ids": True, "logprobs": 2, "prompt_logprobs": 1}
    whole = _post(scripted_engine, "/v1/completions", body).json()["choices"][0]
    chunks = _sse(scripted_engine, "/v1/completions", body)
    assert chunks[0]["choices"][0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert chunks[0]["choices"][0]["prompt_logprobs"] == whole["prompt_logprobs"]
    assert whole["prompt_logprobs"][0] is None and len(whole["prompt_logprobs"]) == len(whole["prompt_token_ids"])
    assert [i for c in chunks for i in c["choices"][0]["token_ids"]] == whole["token_ids"]
    assert [x for c in chunks for x in c["choices"][0]["logprobs"]["token_logprobs"]] == \
        whole["logprobs"]["token_logprobs"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
    assert whole["finish_reason"] == "length" and len(whole["token_ids"]) == 6


def test_stop_strings(scripted_engine):
    body = {"messages": USER, "stop": ["scripted"], "return_token_ids": True}
    whole = _post(scripted_engine, "/v1/chat/completions", body).json()["choices"][0]
    assert whole["message"]["content"] == "Hello from the tracefleet "
    assert whole["finish_reason"] == "stop" and whole["stop_reason"] == "scripted"
    chunks = _sse(scripted_engine, "/v1/chat/completions", body)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello from the tracefleet "


@pytest.mark.parametrize("path,body,status,needle", [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 200000}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": [1] * 131073, "max_tokens": 1}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4o"}, 404, "does not exist"),
    ("/v1/completions", {"prompt": [10 ** 9]}, 400, "out of vocabulary"),
    ("/v1/completions", {"prompt": 12}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": USER, "temperature": -1}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": USER, "n": 2}, 400, "n=1"),
    ("/tokenize", {}, 400, "prompt or messages"),
])
def test_errors_have_vllm_shape(scripted_engine, path, body, status, needle):
    r = _post(scripted_engine, path, body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert needle in err["message"] and err["code"] == status
    assert err["type"] == {400: "BadRequestError", 404: "NotFoundError"}[status]


def test_malformed_json_is_400(scripted_engine):
    r = httpx.post(scripted_engine.url + "/v1/chat/completions", content=b"{not json", timeout=10,
                   headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]


def test_own_engine_can_be_killed_mid_stream(make_scripted_engine):
    engine = make_scripted_engine({"token_delay_s": 0.05, "no_tools_text": "word " * 100})
    got = 0
    with pytest.raises(httpx.HTTPError):
        with httpx.stream("POST", engine.url + "/v1/chat/completions",
                          json={"messages": USER, "stream": True}, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    got += 1
                    if got == 5:
                        engine.kill()
    assert 5 <= got < 100


async def test_concurrent_sessions_get_identical_answers(scripted_engine):
    import asyncio

    body = {"messages": USER, "tools": [BASH], "return_token_ids": True, "stream": True}

    async def one(client: httpx.AsyncClient) -> list[int]:
        ids = []
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    ids += json.loads(line[6:])["choices"][0].get("token_ids", [])
        return ids

    async with httpx.AsyncClient(base_url=scripted_engine.url, timeout=60) as client:
        results = await asyncio.gather(*(one(client) for _ in range(32)))
    assert len({tuple(r) for r in results}) == 1 and len(results[0]) > 10


def test_clamped_engine_shortens_max_tokens(make_scripted_engine):
    engine = make_scripted_engine(extra_args=["--max-model-len", "64", "--clamp-max-tokens"])
    r = _post(engine, "/v1/completions", {"prompt": "hi there", "max_tokens": 32000, "return_token_ids": True})
    assert r.status_code == 200, r.text
    strict = make_scripted_engine(extra_args=["--max-model-len", "64"])
    r = _post(strict, "/v1/completions", {"prompt": "hi there", "max_tokens": 32000})
    assert r.status_code == 400 and "maximum context length is 64 tokens" in r.json()["error"]["message"]

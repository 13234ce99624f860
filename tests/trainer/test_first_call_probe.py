"""bench/first_call.py, the probe that reads which tool a policy opens each session with from its weights: each
session's first prompt is the one the engine saw (its first row's tokens before its first call's completion), the
tools are those the prompt offers, and each tool's probability is the product over its name's tokens, computed from
a shared cache exactly as a plain forward pass over the whole sequence computes it."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tracefleet.bucket import open_bucket  # noqa: E402
from tracefleet.trainer.task_sampler import NO_KIND  # noqa: E402

from fixtures.scripts import script_module  # noqa: E402
from fixtures.sealed_jobs import synthetic_traces, write_batches  # noqa: E402
from fixtures.tiny_llama import tiny_policy  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
VOCAB = 4096  # synthetic_traces draws token ids below it


def probe() -> ModuleType:
    return script_module(REPO / "bench" / "first_call.py", "first_call")


class Answers:
    """A tokenizer stand-in for the decoded first answers (only `decode` is read): each session's first call names
    `read`; the synthetic ids are not text."""

    def decode(self, ids: list[int]) -> str:
        return '<tool_call>\n{"name": "read", "arguments": {"path": "x"}}\n</tool_call>'


def test_the_tools_are_those_the_prompt_offers_in_its_order() -> None:
    text = ('You may call functions within <tools></tools> XML tags:\n<tools>\n'
            '{"type": "function", "function": {"name": "read", "parameters": {"properties": {"name": {}}}}}\n'
            '{"type": "function", "function": {"name": "bash", "parameters": {}}}\n</tools>\nnot json\n')
    assert probe().offered_tools(text) == ["read", "bash"]
    assert probe().offered_tools("no tools here") == []


def test_each_session_gives_its_first_prompt_once(tmp_path: Path) -> None:
    traces = synthetic_traces(0, 8, job="held", samples=2, prompt=12, completion=6)
    write_batches(open_bucket(str(tmp_path / "batches")), "held", traces, 3)
    first = probe().first_prompts(tmp_path, Answers())
    assert len(first) == 8 and len({p.task_id for p in first}) == 4
    by_session = {t.meta.session_id: t for t in traces}
    assert sorted(p.prompt for p in first) == sorted(list(map(int, t.tokens[:12])) for t in by_session.values())
    assert {p.opened_with for p in first} == {"read"} and {p.kind for p in first} == {NO_KIND}
    assert probe().demonstrated(first) == {NO_KIND: "read"}


def test_tool_probabilities_from_the_shared_cache_are_those_of_a_plain_forward_pass() -> None:
    module = probe()
    model = tiny_policy(VOCAB).eval()
    system = list(range(100, 160))  # the harness's system prompt: every prompt starts with it
    prompts = [system + [7, 8, 9], system + [11], system + [12, 13, 14, 15]]
    lead, names = [20, 21, 22], {"read": [30], "bash": [31, 32], "edit": [33, 34, 35]}
    got = module.tool_probabilities(model, prompts, lead, names)
    with torch.no_grad():
        for prompt, probs in zip(prompts, got):
            for name, ids in names.items():
                whole = torch.tensor([prompt + lead + ids])
                logp = torch.log_softmax(model(input_ids=whole).logits[0].float(), -1)
                start = len(prompt) + len(lead)
                expected = float(torch.exp(sum(logp[start - 1 + i, t] for i, t in enumerate(ids))))
                assert probs[name] == pytest.approx(expected, rel=1e-4), (name, prompt[-1])
    assert set(module.per_kind([module.FirstPrompt(f"t{i}", "k", p, None) for i, p in enumerate(prompts)], got)["k"]) \
        == set(names)

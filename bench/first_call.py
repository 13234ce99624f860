"""Bench: which tool a policy opens each session with, per task kind, read off its weights in seconds.

    .venv/bin/python bench/first_call.py --prompts RUN/held-out-held-out [RUN/demos ...] --model BASE
        [--answers RUN/demos] [--weights base CKPT/policy-1 CKPT/policy-1+CKPT/policy-8 ...]  (CKPT: RUN/checkpoints)

Where the recipe's `fix` sessions fail, they fail at the first call: a policy that opens with `bash` instead of
`read` never sees the file it must edit (docs/training/real-harness.md, "What sets the first call's tool"). Scoring
a checkpoint through the harness takes 10-20 minutes; this reads the same thing from its weights: each session's
first prompt (its first sealed row's tokens before its first call's completion, as the engine saw them), followed
by the tool call's opening `<tool_call>\\n{"name": "`, and the probability the policy gives each tool the prompt
offers (the hermes `<tools>` block) as the name that comes next (its tokens; a name that begins another counts
that one's too). Printed per kind: the mean probability of each tool, and with `--answers` (the demonstrations'
folder) the tool the demonstrations of that kind open with and the policy's mean probability of it.

`--prompts`: folders of sealed batches (a `tracefleet train` run's `held-out-<tag>` or `demos`); the first
prompts of every session in them. `--weights`: `base` (the model as shipped) or checkpoint folders
(`model.safetensors` of the trained tensors, loaded over the base model as the engine's in-place reload does);
`A+B` loads B over A, as the engine holds a GRPO checkpoint (its top layers) over the warm start (`--warm-layers`
trains more of them). The prompts share the harness's system prompt: it runs once, and each prompt goes on from
a copy of its cache.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

CALL_LEAD = '<tool_call>\n{"name": "'  # the hermes template's tool call, up to the tool's name
TOOLS_BLOCK = re.compile(r"<tools>(.*?)</tools>", re.S)
NAME_IN_CALL = re.compile(r'<tool_call>\s*\{\s*"name"\s*:\s*"([^"]+)"')
BASE = "base"


@dataclass(frozen=True)
class FirstPrompt:
    """A session's first prompt and what its first answer was."""

    task_id: str
    kind: str
    prompt: list[int]  # the tokens the engine was given, before the first sampled one
    opened_with: str | None  # the tool the session's first call named (None: no call)


def first_prompts(folder: Path, tokenizer: Any) -> list[FirstPrompt]:
    """Every session's first prompt in the sealed batches under `folder` (one job's), in task order."""
    from tracefleet.trainer import demos
    from tracefleet.trainer.task_sampler import task_kind
    from tracefleet.traces import BatchReader

    found = demos.find(folder)
    reader = BatchReader(str(found.folder), found.job, consumer="first-call")
    first: dict[str, dict[str, Any]] = {}
    for manifest in reader.batches():
        for row in reader.read(manifest).table.to_pylist():
            # one row per prefix-extending run of a session's calls, in trace-id order: the first has its first call
            held = first.get(row["session_id"])
            if held is None or row["trace_id"] < held["trace_id"]:
                first[row["session_id"]] = row
    out = []
    for row in sorted(first.values(), key=lambda r: (r["task_id"], r["trace_id"])):
        if not row["spans"]:
            continue
        call = min(row["spans"], key=lambda span: span["completion_start"])
        start, end = call["completion_start"], call["completion_end"]
        called = NAME_IN_CALL.search(tokenizer.decode(row["tokens"][start:end]))
        kind = task_kind((json.loads(row["metadata_json"]).get("extra") or {}).get("task_metadata"))
        out.append(FirstPrompt(row["task_id"], kind, list(row["tokens"][:start]), called.group(1) if called else None))
    return out


def offered_tools(prompt_text: str) -> list[str]:
    """The tool names a hermes-templated prompt offers, in order (its `<tools>` block: one JSON function per line)."""
    names = []
    # every block: the template also names the tags in prose ("within <tools></tools> XML tags")
    for line in "\n".join(TOOLS_BLOCK.findall(prompt_text)).splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            spec = json.loads(line)
        except ValueError:
            continue
        name = (spec.get("function") or spec).get("name")
        if name and name not in names:
            names.append(name)
    return names


def continuations(tokenizer: Any, names: Iterable[str]) -> tuple[list[int], dict[str, list[int]]]:
    """The call's lead as tokens, and each name's tokens after it, tokenized with the lead (as the policy writes
    them; a name that does not tokenize apart from the lead is left out). The closing quote is not included: the
    tokenizer merges it with what follows (SmolLM2 writes `",` as one token after a name)."""
    lead = tokenizer.encode(CALL_LEAD, add_special_tokens=False)
    rest: dict[str, list[int]] = {}
    for name in names:
        whole = tokenizer.encode(CALL_LEAD + name, add_special_tokens=False)
        if whole[: len(lead)] == lead:
            rest[name] = whole[len(lead):]
    return lead, rest


def shared_length(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, less one: each prompt then has at least one token of its own to run."""
    if not prompts:
        return 0
    n = 0
    while all(len(p) > n + 1 for p in prompts) and all(p[n] == prompts[0][n] for p in prompts):
        n += 1
    return n


def tool_probabilities(model: Any, prompts: list[list[int]], lead: list[int],
                       names: dict[str, list[int]]) -> list[dict[str, float]]:
    """For each prompt: each tool's probability as the name after `prompt + lead` (the product over its tokens)."""
    import torch

    from tracefleet.trainer.grpo import cache_argument

    shared = shared_length(prompts)
    name_of = cache_argument(model)
    out: list[dict[str, float]] = []
    with torch.no_grad():
        head = None
        if shared:
            head = getattr(model(input_ids=torch.tensor([prompts[0][:shared]]), use_cache=True), name_of)
        for prompt in prompts:
            ran = model(input_ids=torch.tensor([prompt[shared:] + lead]), use_cache=True,
                        **{name_of: copy.deepcopy(head)})
            first = torch.log_softmax(ran.logits[0, -1].float(), -1)
            probs: dict[str, float] = {}
            for name, ids in names.items():
                logp = float(first[ids[0]])
                if len(ids) > 1:
                    more = model(input_ids=torch.tensor([ids[:-1]]), use_cache=True,
                                 **{name_of: copy.deepcopy(getattr(ran, name_of))}).logits[0].float()
                    logp += float(torch.log_softmax(more, -1).gather(-1, torch.tensor(ids[1:])[:, None]).sum())
                probs[name] = math.exp(logp)
            out.append(probs)
    return out


def load(model_dir: Path, weights: str) -> Any:
    from safetensors.torch import load_file

    from tracefleet.trainer.grpo import load_policy

    model = load_policy(model_dir)  # as the trainer holds it: float32, what the engine runs on CPU
    for checkpoint in weights.split("+"):
        if checkpoint != BASE:
            model.load_state_dict(load_file(str(Path(checkpoint) / "model.safetensors")), strict=False)
    return model.eval()


def demonstrated(answers: list[FirstPrompt]) -> dict[str, str]:
    """Per kind, the tool its demonstrations open with most often."""
    per: dict[str, Counter[str]] = defaultdict(Counter)
    for a in answers:
        if a.opened_with:
            per[a.kind][a.opened_with] += 1
    return {kind: c.most_common(1)[0][0] for kind, c in per.items()}


def per_kind(prompts: list[FirstPrompt], probs: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """The mean probability of each tool over each kind's prompts."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for p, pr in zip(prompts, probs):
        rows[p.kind].append(pr)
    return {kind: {name: sum(r[name] for r in rs) / len(rs) for name in rs[0]} for kind, rs in sorted(rows.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=Path, nargs="+", required=True)
    ap.add_argument("--model", type=Path, required=True, help="the base model's folder (the one the engine serves)")
    ap.add_argument("--weights", nargs="+", default=[BASE])
    ap.add_argument("--answers", type=Path, help="the demonstrations' folder: which tool each kind should open with")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(a.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(a.model))
    prompts = [p for folder in a.prompts for p in first_prompts(folder, tokenizer)]
    if not prompts:
        print(f"no sealed sessions under {', '.join(map(str, a.prompts))}", file=sys.stderr)
        return 2
    names = offered_tools(tokenizer.decode(prompts[0].prompt))
    lead, rest = continuations(tokenizer, names)
    right = demonstrated(first_prompts(a.answers, tokenizer)) if a.answers else {}
    counts = Counter(p.kind for p in prompts)
    print(f"{len(prompts)} first prompts ({', '.join(f'{k} {n}' for k, n in sorted(counts.items()))}); "
          f"tools offered: {', '.join(rest)}" + (f"; demonstrated: {json.dumps(right)}" if right else ""))
    for weights in a.weights:
        means = per_kind(prompts, tool_probabilities(load(a.model, weights), [p.prompt for p in prompts], lead, rest))
        print(weights)
        for kind, mean in means.items():
            tools = "  ".join(f"{name} {v:.2f}" for name, v in mean.items())
            fit = f"  | P({right[kind]}) {mean.get(right[kind], 0.0):.2f}" if kind in right else ""
            print(f"  {kind:<10} n={counts[kind]:<3} {tools}{fit}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

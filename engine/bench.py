"""Decode speed of the CPU engine's backends: `python -m tracefleet.engine.bench [--model M] [--tokens N]`.

Reports load time, time to first token and decode tok/s both per wall second and per CPU second of
this process (the latter is what a quiet machine would show when other work shares the cores).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import time


def measure(model: str, tokens: int, threads: int) -> dict[str, float | str | int]:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from tracefleet.engine.backend import GenerationRequest, SamplingParams
    from tracefleet.formats.chat_template import render_chat
    from tracefleet.engine.llama import llama_backend_for

    t0 = time.perf_counter()
    backend = llama_backend_for(model, n_threads=threads)
    load_s = time.perf_counter() - t0
    prompt = render_chat(backend.chat_template, [{"role": "user", "content": "Tell me a long story about a lighthouse."}],
                         **backend.template_vars)
    ids = backend.tokenizer.encode(prompt, add_special_tokens=False)
    best: dict[str, float] = {}
    for _ in range(2):
        backend.llm.n_tokens = 0  # no prefix reuse between repetitions
        params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
        w0 = time.perf_counter()
        first_w = first_c = None
        n = 0
        for _tok in backend.generate(GenerationRequest(ids, params)):
            n += 1
            if first_w is None:
                first_w, first_c = time.perf_counter(), time.process_time()
        w1, c1 = time.perf_counter(), time.process_time()
        run = {"ttft_s": first_w - w0, "decode_tok_s_wall": (n - 1) / (w1 - first_w),
               "decode_tok_s_cpu": (n - 1) / max(c1 - first_c, 1e-9), "tokens": n}
        if not best or run["decode_tok_s_wall"] > best["decode_tok_s_wall"]:
            best = run
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"model": model, "threads": threads, "load_s": round(load_s, 2), "prompt_tokens": len(ids),
            **{k: round(v, 3) if isinstance(v, float) else v for k, v in best.items()}, "max_rss_mb": round(rss_mb)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", action="append", help="smollm2, gemma3-270m or a .gguf path (repeatable)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    for model in args.model or ["smollm2", "gemma3-270m"]:
        print(json.dumps({**measure(model, args.tokens, args.threads), "loadavg_1m": float(load)}), flush=True)


if __name__ == "__main__":
    main()

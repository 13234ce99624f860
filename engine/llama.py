"""The llama.cpp backend: a real GGUF model on CPU, with per-token logprobs at full speed.

llama-cpp-python's high-level `create_completion(logprobs=...)` sorts the whole vocabulary in Python
for every token (~2 tok/s), and its server neither takes token-id prompts nor returns token ids. So
this backend drives the context directly: it decodes batches itself, reads the logits of the last
position, takes log-softmax with numpy, and samples there (greedy = argmax; no repeat penalty, as
vLLM). The logprobs it reports are those of the distribution it sampled from, after temperature and top-p
(vLLM's `--logprobs-mode processed_logprobs`, as tracefleet runs vLLM; /v1/models says so): the behaviour
policy's, which a trainer takes as `old_logprobs`. A prompt_logprobs re-score gives the model's own (T=1). The KV cache keeps the longest common prefix with the previous request, so an agent's
growing conversation only evaluates its new tokens.

Token fidelity: a token's logprob must not depend on how the engine happened to batch the sequence
(sampling evaluates one token at a time after a batched prefill; a re-score with `prompt_logprobs`
evaluates the whole sequence in batches), otherwise the logprobs recorded for training disagree with
a re-score of the same tokens. Three llama.cpp settings break that, and `LlamaBackend` pins all three:
flash attention (off: batched and single-token attention round differently), weight repacking
(`use_extra_bufts`: Q4_K tensors are repacked for 8x8 kernels whose batched gemm and single-row gemv
accumulate in different orders) and the full-size sliding-window cache (`swa_full`: with the small
SWA cache, rewinding to an older prefix silently attends over a window that was already evicted).
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import threading
from pathlib import Path
from typing import Iterator

import numpy as np

from tracefleet.contract.engine_limits import PROCESSED_LOGPROBS
from tracefleet.engine.backend import GenerationRequest, PromptLogprob, SampledToken
from tracefleet.formats.tokenizer import HFTokenizer, Tokenizer


def logsumexp(logits: np.ndarray) -> float:
    # float32 exp with a float64 sum: ~1 ms over Gemma's 262k vocabulary (a float64 log-softmax of the
    # whole row costs ~12 ms per token, more than the model step itself).
    m = float(logits.max())
    return m + math.log(float(np.exp(logits - m).sum(dtype=np.float64)))


def top_k(logits: np.ndarray, lse: float, k: int) -> list[tuple[int, float]]:
    if k <= 0:
        return []
    idx = np.argpartition(-logits, k - 1)[:k]
    idx = idx[np.argsort(-logits[idx], kind="stable")]
    return [(int(i), logprob(logits, int(i), lse)) for i in idx]


# vLLM clamps a logprob of -inf (a token the sampler masked out) to this in its JSON answers.
MASKED_LOGPROB = -9999.0


def processed(logits: np.ndarray, temperature: float, top_p: float) -> np.ndarray:
    """The logits the engine samples from, as vLLM's sampler makes them for `--logprobs-mode processed_logprobs`:
    divided by the temperature (greedy: unscaled, as vLLM leaves a greedy row), every token outside the top-p
    nucleus at -inf. Their log-softmax is the behaviour policy's logprob of each token."""
    if temperature <= 1e-5:
        return logits
    scaled = logits / np.float32(temperature)
    if top_p < 1.0:
        lse = logsumexp(scaled)
        order = np.argsort(-scaled, kind="stable")
        cum = np.cumsum(np.exp(scaled[order].astype(np.float64) - lse))
        # the smallest set of most likely tokens whose probabilities reach top_p (at least one)
        scaled = np.full_like(scaled, -np.inf)
        keep = order[: int(np.searchsorted(cum, top_p)) + 1]
        scaled[keep] = logits[keep] / np.float32(temperature)
    return scaled


def sample(logits: np.ndarray, temperature: float, top_p: float, rng: np.random.Generator) -> int:
    """A token sampled from raw logits with the request's temperature and top-p."""
    return draw(processed(logits, temperature, top_p), temperature, rng)


def draw(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """A token from processed logits (`processed`): argmax when greedy."""
    if temperature <= 1e-5:
        return int(np.argmax(logits))
    probs = np.exp(logits.astype(np.float64) - logits.max())
    return int(rng.choice(len(probs), p=probs / probs.sum()))


def logprob(logits: np.ndarray, token: int, lse: float) -> float:
    value = float(logits[token]) - lse
    return value if math.isfinite(value) else MASKED_LOGPROB


_MODEL_PARAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def without_weight_repacking() -> Iterator[None]:
    """Models loaded inside keep their weights in the GGUF layout (`use_extra_bufts = false`, llama.cpp's
    `--no-repack`). llama-cpp-python's `Llama()` has no argument for it, so the model-params default it
    starts from is swapped for the duration of the load.

    Why: repacked Q4_K weights (Gemma 3's q4_k_m) run a 4-row gemm for batches and a gemv for single
    tokens, which sum in different orders; measured on Gemma 3 270M, sampled logprobs then differ from a
    re-score of the same sequence by up to 0.69 nats (exactly 0 without repacking), at no measurable
    cost on this model (1 thread, CPU time: decode 27.1 vs 27.3 tok/s, prefill 159-171 vs 163-164 tok/s)."""
    import llama_cpp.llama_cpp as capi

    with _MODEL_PARAMS_LOCK:
        default = capi.llama_model_default_params

        def no_repack():  # type: ignore[no-untyped-def]
            params = default()
            params.use_extra_bufts = False
            return params

        capi.llama_model_default_params = no_repack
        try:
            yield
        finally:
            capi.llama_model_default_params = default


class LlamaStream:
    def __init__(self, backend: "LlamaBackend", request: GenerationRequest) -> None:
        self.backend = backend
        self.request = request
        self.prompt_logprobs: list[PromptLogprob | None] | None = None

    def __iter__(self) -> Iterator[SampledToken]:
        b = self.backend
        with b.lock:
            yield from b._generate(self.request, self)


class LlamaBackend:
    # what a sampled token's logprob is (vLLM's --logprobs-mode; /v1/models says it): the behaviour policy's, after
    # temperature and top-p, as tracefleet runs vLLM (tracefleet.contract.engine_limits.LOGPROBS_MODE)
    logprobs_mode = PROCESSED_LOGPROBS

    def __init__(self, gguf_path: Path, tokenizer: Tokenizer, chat_template: str, *, model_name: str,
                 max_model_len: int = 4096, n_threads: int = 1, n_batch: int = 256,
                 template_vars: dict | None = None, stop_token_ids: frozenset[int] | None = None) -> None:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        from llama_cpp import Llama

        with without_weight_repacking():
            self.llm = Llama(model_path=str(gguf_path), n_ctx=max_model_len, n_batch=n_batch, n_ubatch=n_batch,
                             n_threads=n_threads, n_threads_batch=n_threads, logits_all=False, verbose=False,
                             # Flash attention makes a position's logits independent of how the tokens were
                             # batched (measured: without it a 13-token batch and 13 single steps disagree
                             # by ~0.1 nats), so re-scoring a sequence reproduces its sampling logprobs.
                             flash_attn=True,
                             # Gemma 3's sliding-window layers: keep every position so the prefix cache
                             # can rewind anywhere (measured: with the small SWA cache, a rewind to 600 of
                             # 1014 tokens gives logprobs off by 0.11 nats, silently).
                             swa_full=True)
        assert self.llm.model_params.use_extra_bufts is False
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.n_batch = n_batch
        self.n_vocab = self.llm.n_vocab()
        self.template_vars = dict(template_vars or {})
        self.stop_token_ids = stop_token_ids or tokenizer.eos_token_ids
        self.lock = threading.Lock()
        # Teacher forcing for tests and benches (`PUT /forced/replies`): each of the next generations emits
        # one of these texts token by token instead of sampling, and reports the model's own logprobs for
        # those tokens (as vLLM does under structured outputs with a single `choice`). A 135M model will not
        # call tools on cue; this scripts what it says while keeping every logprob real.
        self.forced_replies: collections.deque[str] = collections.deque()

    def generate(self, request: GenerationRequest) -> LlamaStream:
        return LlamaStream(self, request)

    # -- internals (hold self.lock) -------------------------------------------------------------
    def _decode(self, tokens: list[int], all_logits: bool) -> Iterator[np.ndarray]:
        """Evaluate tokens after the cached prefix; yield the logits rows llama.cpp returns per batch
        (every position when all_logits, else only the last position of the last batch)."""
        llm = self.llm
        for start in range(0, len(tokens), self.n_batch):
            batch = tokens[start:start + self.n_batch]
            n_past = llm.n_tokens
            last = start + self.n_batch >= len(tokens)
            llm._batch.set_batch(batch=batch, n_past=n_past, logits_all=all_logits)
            try:
                llm._ctx.decode(llm._batch)
            except Exception:
                llm.n_tokens = 0  # the cache state is unknown now: start over next time
                raise
            llm.input_ids[n_past:n_past + len(batch)] = batch
            llm.n_tokens += len(batch)
            rows = len(batch) if all_logits else 1
            if all_logits or last:
                yield np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(rows, self.n_vocab)).copy()

    def _rewind(self, n_keep: int) -> None:
        """Keep the first n_keep cached positions (none if the cache cannot drop just its tail)."""
        from llama_cpp import llama_cpp as capi

        memory = self.llm._ctx.memory
        if not capi.llama_memory_seq_rm(memory, -1, n_keep, -1):
            capi.llama_memory_clear(memory, True)
            n_keep = 0
        self.llm.n_tokens = n_keep

    def _prefill(self, prompt: list[int], want_prompt_logprobs: int | None, stream: LlamaStream) -> np.ndarray:
        llm = self.llm
        if want_prompt_logprobs is None:
            cached = llm.input_ids[:llm.n_tokens].tolist()
            common = 0
            for a, b in zip(cached, prompt):
                if a != b:
                    break
                common += 1
            self._rewind(min(common, len(prompt) - 1))  # the last prompt token is always re-evaluated
            *_, last = self._decode(prompt[llm.n_tokens:], all_logits=False)
            return last[-1]
        self._rewind(0)
        out: list[PromptLogprob | None] = [None]
        k = want_prompt_logprobs
        pos = 0
        rows = None
        for rows in self._decode(prompt, all_logits=True):
            for r in range(rows.shape[0]):
                nxt = pos + 1
                if nxt < len(prompt):
                    row = rows[r]
                    tid = prompt[nxt]
                    lse = logsumexp(row)
                    rank = int((row > row[tid]).sum()) + 1
                    out.append(PromptLogprob(tid, float(row[tid]) - lse, rank, top_k(row, lse, k)))
                pos += 1
        stream.prompt_logprobs = out
        assert rows is not None
        return rows[-1]

    def _generate(self, request: GenerationRequest, stream: LlamaStream) -> Iterator[SampledToken]:
        p = request.params
        rng = np.random.default_rng(p.seed)
        logits = self._prefill(list(request.prompt_ids), p.prompt_logprobs, stream)
        room = self.max_model_len - len(request.prompt_ids)
        forced = self._next_forced() if p.max_tokens > 0 else []
        for i in range(min(p.max_tokens, room)):
            # a forced token was not sampled: it keeps the model's own logprob (teacher forcing, tests and benches)
            dist = logits if i < len(forced) else processed(logits, p.temperature, p.top_p)
            lse = logsumexp(dist)
            tid = forced[i] if i < len(forced) else draw(dist, p.temperature, rng)
            yield SampledToken(tid, logprob(dist, tid, lse), top_k(dist, lse, p.top_logprobs))
            if (tid in self.stop_token_ids and not p.ignore_eos) or i + 1 >= min(p.max_tokens, room):
                return
            if request.cancelled is not None and request.cancelled.is_set():
                return
            *_, rows = self._decode([tid], all_logits=False)
            logits = rows[-1]


    def _next_forced(self) -> list[int]:
        try:
            return self.tokenizer.encode(self.forced_replies.popleft())  # special-token text -> its id
        except IndexError:
            return []


def llama_backend_for(model: str = "smollm2", *, n_threads: int = 1, max_model_len: int = 4096,
                      served_name: str | None = None) -> LlamaBackend:
    from tracefleet.formats.models import ensure_tokenizer_json, resolve_model, template_source

    spec = resolve_model(model, served_name)
    tok = HFTokenizer(ensure_tokenizer_json(spec.gguf_path), add_bos=spec.add_bos)
    stop = frozenset(tok.eos_token_ids | {i for t in spec.end_of_turn_tokens for i in tok.encode(t)})
    return LlamaBackend(spec.gguf_path, tok, template_source(spec, tok.chat_template), model_name=spec.name,
                        max_model_len=max_model_len, n_threads=n_threads, template_vars=spec.template_vars(tok),
                        stop_token_ids=stop)

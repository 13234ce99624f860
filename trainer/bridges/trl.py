"""Hugging Face TRL: `GRPOTrainer(rollout_func=TrlRollouts(reader), callbacks=[PolicySync(...)])` trains on a
RolloutJob's sealed batches instead of generating.

TRL's contract (trl 1.16.0, trl/trainer/grpo_trainer.py, `_generate`): the trainer hands `rollout_func` the
generation batch's prompts, each repeated `num_generations` times in a row (its RepeatSampler), and wants one
completion per prompt back: `prompt_ids`, `completion_ids`, `logprobs` (the sampling policy's, per completion
token), optionally `env_mask` (1 on the tokens the model generated, 0 on the ones an environment added); every
other key reaches the reward functions as a keyword argument. It computes advantages over consecutive blocks of
`num_generations`. So each block here is one GRPO group of the job:

- a trace's prompt is its first call's prompt; its completion is every token after it, `env_mask` 0 on the tool
  results and harness text between the calls, `logprobs` the engine's on the sampled tokens (0.0 elsewhere)
- a completion that ended on a stop string or a tool call, not on EOS, gets the pad id after it (`env_mask` 0), so
  TRL counts only calls cut at their length limit as truncated (`completions/clipped_ratio`,
  `mask_truncated_completions`)
- the dataset's prompts are placeholders (`placeholder_dataset`): what a group was asked is in its tokens
- `tracefleet_advantage` (the reader's group advantage), `tracefleet_reward` (the session's reward) and
  `tracefleet_session` (its id) are passed to the reward functions: `session_advantage` with
  `GRPOConfig(scale_rewards="none")` makes TRL's advantages tracefleet's, `session_reward` lets TRL normalise
- TRL subtracts each block's mean from what the reward functions return, and tracefleet's advantages have mean 0 over
  a group's sessions, not over its traces: a session whose calls did not chain sealed two traces, each with the
  session's advantage. So a block whose advantages do not sum to 0 gets one balancing row (advantage minus their
  sum, reward None, `env_mask` all 0: in the block's mean, never in the loss), and a group with more traces than
  fit (more than `num_generations`, or exactly that many and unbalanced) is handed out over several blocks of
  `num_generations - 1` traces, each balanced
- tokens an older policy sampled than the one trained are masked out unless TRL weighs them (`stale_tokens`); under
  several accelerate processes each rank takes its share of each step's whole groups, and only the main rank syncs
  the engines and moves the cursor
- a block with fewer traces than `num_generations` (an infrastructure failure left out by the reader) is filled
  with unscorable rows: every reward None (TRL leaves them out of the block's statistics and gives them advantage
  0) and `env_mask` all 0 (no token of theirs is in the loss); a group with fewer than two sessions is skipped

`PolicySync` saves the trained tensors after each optimizer step, calls `update_policy` on the job's engines (the
engines' version label becomes the step's) and commits the batches whose groups were all trained on. Given a
`logger` (tracefleet.dashboard.trackers.StepLogger), it logs each update's sync and paused seconds at TRL's step
under the dashboard's names (`loop/sync_s`, `loop/paused_s`); TRL logs its own figures to its `report_to`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from tracefleet.trainer.bridges.rows import Rollout, groups

if TYPE_CHECKING:
    from tracefleet.dashboard.trackers import StepLogger

ADVANTAGE_KEY = "tracefleet_advantage"
REWARD_KEY = "tracefleet_reward"
GROUP_KEY = "tracefleet_group"
SESSION_KEY = "tracefleet_session"  # the row's identity, None on filler rows
PLACEHOLDER_PROMPT = "tracefleet"
BALANCED = 1e-5  # advantages are float32 in a batch: a block summing to less than this is balanced


class TrlRollouts:
    """`rollout_func` for `trl.GRPOTrainer`: whole groups from `reader.follow()` (a BatchReader with a consumer),
    `follow_options` passed to it (poll_s, timeout_s, idle_exit), `row_options` to rows.rollouts (max_lag...).

    `stale_tokens`: what to do with tokens an older policy sampled than the one being trained (`policy_version`,
    which PolicySync keeps: the engines' version when training began, then each update's). TRL takes the
    engine's logprobs into its loss only with its vLLM importance-sampling correction or `off_policy_mask_threshold`;
    without either it trains every token as if the current weights had sampled it. So by default (`"auto"`) they
    are masked out (env_mask 0) unless the trainer applies one of those; `"mask"` always, `"keep"` never."""

    def __init__(self, reader: Any, *, follow_options: dict[str, Any] | None = None, stale_tokens: str = "auto",
                 **row_options: Any) -> None:
        if stale_tokens not in ("auto", "mask", "keep"):
            raise ValueError(f"stale_tokens={stale_tokens!r}: auto, mask or keep")
        self.reader = reader
        self.row_options = row_options
        self.stale_tokens = stale_tokens
        self.policy_version: int | None = None  # the trained weights' version (PolicySync sets it)
        self._batches: Iterator[Any] = reader.follow(**(follow_options or {}))
        self._groups: deque[tuple[int, list[Rollout]]] = deque()
        self._cut: deque[list[Rollout]] = deque()  # the blocks of the group being handed out not yet given
        self._cut_seq = -1  # that group's batch
        self._left: dict[int, int] = {}  # seq -> groups of that batch not yet handed out whole
        self._read: list[Any] = []  # batches read, in seq order, not committed
        self.blocks_given = 0

    def _next_block(self, size: int) -> list[Rollout]:
        if not self._cut:
            while not self._groups:
                try:
                    batch = next(self._batches)
                except StopIteration:
                    raise RuntimeError(f"job {self.reader.job}: no more sealed batches to train on") from None
                found = groups(batch, **self.row_options)
                self._read.append(batch)
                self._left[batch.seq] = len(found)
                self._groups.extend((batch.seq, g) for g in found)
            self._cut_seq, group = self._groups.popleft()
            self._cut.extend(blocks(group, size))
        block = self._cut.popleft()
        if not self._cut:
            self._left[self._cut_seq] -= 1
        self.blocks_given += 1
        return block

    def masks_stale(self, trainer: Any) -> bool:
        if self.stale_tokens != "auto":
            return self.stale_tokens == "mask"
        corrected = getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False)
        return not corrected and getattr(trainer, "off_policy_mask_threshold", None) is None

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        size = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
        if len(prompts) % size:
            raise ValueError(f"{len(prompts)} prompts are not whole groups of num_generations={size}: make "
                             "per_device_train_batch_size a multiple of num_generations")
        # Under accelerate every rank reads the same batches in the same order and takes its own share of the step's
        # groups (rank r the r-th run of them), so each group is trained once, whole, by one rank.
        accelerator = getattr(trainer, "accelerator", None)
        ranks, rank = (accelerator.num_processes, accelerator.process_index) if accelerator is not None else (1, 0)
        mine = len(prompts) // size
        rows: list[tuple[Rollout, bool]] = []
        advantages: list[float | None] = []
        for i in range(mine * ranks):
            block = self._next_block(size)
            if i // mine == rank:
                rows += [(r, True) for r in block] + [(block[0], False)] * (size - len(block))
                advantages += block_advantages(block, size)
        end = ended_marker(trainer)
        since = self.policy_version if self.masks_stale(trainer) else None
        completions = [ended(r, end, since) for r, _ in rows]
        return {
            "prompt_ids": [r.prompt_ids for r, _ in rows],
            "completion_ids": [ids for ids, _, _ in completions],
            "logprobs": [logprobs for _, logprobs, _ in completions],
            "env_mask": [mask if real else [0] * len(mask) for (_, _, mask), (_, real) in zip(completions, rows)],
            ADVANTAGE_KEY: advantages,
            REWARD_KEY: [r.reward if real else None for r, real in rows],
            GROUP_KEY: [r.group_id for r, _ in rows],
            SESSION_KEY: [r.session_id if real else None for r, real in rows],
        }

    def commit(self, *, write: bool = True) -> list[int]:
        """Commit every batch read whose groups were all handed out (in seq order); their seqs. `write` False: only
        forget them (a rank other than the main one: the cursor is written once)."""
        done = []
        while self._read and self._left[self._read[0].seq] == 0:
            batch = self._read.pop(0)
            if write and self.reader.consumer is not None:
                self.reader.commit(batch)
            done.append(batch.seq)
        return done


def blocks(group: list[Rollout], size: int) -> list[list[Rollout]]:
    """A group's traces cut into TRL blocks of `size` rows: whole when they fit and either leave a row for the
    balancing one or sum to 0; else `size - 1` traces per block, each block then balanced by its own last row."""
    if len(group) < size or (len(group) == size and abs(sum(r.advantage for r in group)) < BALANCED):
        return [group]
    room = size - 1
    return [group[i : i + room] for i in range(0, len(group), room)]


def block_advantages(block: list[Rollout], size: int) -> list[float | None]:
    """The advantage column of a block padded to `size` rows: the traces' own, then one balancing row (minus their
    sum, so TRL's block mean is 0 and its advantages are the traces' own) where they do not sum to 0, then None."""
    own = [r.advantage for r in block]
    total = sum(own)
    fill: list[float | None] = [None] * (size - len(block))
    if fill and abs(total) >= BALANCED:
        fill[0] = -total
    return [*own, *fill]


def ended_marker(trainer: Any) -> tuple[set[int | None], int | None]:
    """(the ids TRL reads as a completion's end: its EOS ids and the pad id, the id to mark one with)."""
    tokenizer = getattr(trainer, "_tokenizer", None) or trainer.processing_class
    pad = tokenizer.pad_token_id
    ends = {*trainer.eos_token_ids, pad}
    return ends, pad if pad is not None else next(iter(trainer.eos_token_ids), None)


def ended(r: Rollout, end: tuple[set[int | None], int | None],
          since: int | None = None) -> tuple[list[int], list[float], list[int]]:
    """A trace's completion ids, logprobs and env_mask for TRL, which counts a completion that does not end on EOS or
    pad as truncated (and drops it with mask_truncated_completions): one that ended on a stop string (the engine
    leaves the string out) or a tool call gets the pad id after it, env_mask 0 (never trained), so only a call cut
    at its length limit reads as truncated. `since`: tokens sampled by an older version are masked (env_mask 0)."""
    ids, logprobs, mask = r.response_ids, r.response_logprobs, r.response_mask_from(since)
    ends, marker = end
    if r.finish_reason != "length" and ids and ids[-1] not in ends and marker is not None:
        return [*ids, marker], [*logprobs, 0.0], [*mask, 0]
    return ids, logprobs, mask


def session_advantage(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Reward function: the reader's group advantage of each completion's session (None on filler rows)."""
    return list(kwargs[ADVANTAGE_KEY])


def session_reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
    """Reward function: each completion's session reward (None on filler rows), for TRL to normalise."""
    return list(kwargs[REWARD_KEY])


def placeholder_dataset(groups_per_step: int, steps: int) -> Any:
    """A dataset of one placeholder prompt per group to train on (the sampler repeats it num_generations times)."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [PLACEHOLDER_PROMPT] * (groups_per_step * steps)})


class PolicySync(TrainerCallback):
    """After each optimizer step: the trained tensors saved under `out/policy-<version>` (tracefleet.trainer.grpo
    save_weights), `update_policy(engines, ...)` with version = start_version + the trainer's global step, and
    `rollouts.commit()`. `start_version` None: the engines' own when training begins (control.engine_version), so
    a trainer started against an engine at version N labels its first update N + 1. `reports`: each update's
    PolicyUpdateReport."""

    def __init__(self, engines: list[str], out: str | Path, rollouts: TrlRollouts | None = None, *,
                 start_version: int | None = None, logger: StepLogger | None = None, **update_options: Any) -> None:
        self.engines = engines
        self.logger = logger
        self.out = Path(out)
        self.rollouts = rollouts
        self.start_version = start_version
        self.update_options = update_options
        self.reports: list[Any] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from tracefleet.trainer.control import engine_version

        if self.start_version is None:
            self.start_version = engine_version(self.engines, api_key=self.update_options.get("api_key"))
        if self.rollouts is not None:
            self.rollouts.policy_version = self.start_version

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        from tracefleet.trainer.control import update_policy
        from tracefleet.trainer.grpo import save_weights

        version = (self.start_version or 0) + state.global_step
        main = state.is_world_process_zero  # under accelerate: one save and one sync per step, by the main rank
        if main:
            path = save_weights(model, self.out / f"policy-{version}")
            self.reports.append(update_policy(self.engines, path, version, **self.update_options))
            if self.logger is not None:  # at TRL's own step, beside the figures TRL logs to its report_to trackers
                self.logger.log({"step": state.global_step, **self.reports[-1].loop_figures()})
        if self.rollouts is not None:
            self.rollouts.policy_version = version
            self.rollouts.commit(write=main)

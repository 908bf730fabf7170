"""One ExGRPO train step, in the order of the paper's algorithm box (docs/algorithm.md §2-5):

  select replay questions and their trajectory -> draw fresh questions -> generate rollouts ->
  score -> delayed-start switch -> build the mixed batch -> advantages -> pi_old -> loss and optimizer
  step(s) -> update the buffer (with the trainer's pre-update log-probs) -> sync the rollout
  engine -> retire -> log.

With `replay.ratio=0` every replay stage is skipped and the step is exactly on-policy Dr.GRPO.
All randomness of a step derives from (trainer.seed, step), so a resumed run repeats it exactly.
The run's state (model, optimizer, sampler, buffer, switch, counters) lives in `RunState`. Data
parallelism stays inside the stages: each maps its work over the ranks through the one
`DataParallel` object (parallel/sharding.py), so the step itself reads as one process's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from exgrpo_cli.algo.aggregation import Aggregation
from exgrpo_cli.algo.losses import LossForStep
from exgrpo_cli.config.schema import ExgrpoConfig
from exgrpo_cli.data.sampler import FreshDraw
from exgrpo_cli.data.templates import Template
from exgrpo_cli.data.types import Question
from exgrpo_cli.metrics.memory import PhaseMemory
from exgrpo_cli.parallel.sharding import DataParallel
from exgrpo_cli.policy.forward import token_budget
from exgrpo_cli.policy.scoring import score_candidates
from exgrpo_cli.replay.bucketing import Bounds
from exgrpo_cli.replay.methods import Replayed, ReplayMethod
from exgrpo_cli.replay.mixing import Group, MixedBatch, Response, build_mixed_batch, update_order
from exgrpo_cli.reward.stage import Reward
from exgrpo_cli.rollout.base import RolloutEngine, SamplingSpec, decode_response
from exgrpo_cli.step.divergence import check_synced_weights, engine_check
from exgrpo_cli.step.metrics import Timers, accuracy_by_origin, loss_metrics, rollout_metrics
from exgrpo_cli.step.offpolicy import MismatchWatch, correction_of, offpolicy_metrics
from exgrpo_cli.step.replay import choose_replay, guidance_response, replayed_ages
from exgrpo_cli.step.reward import grade_step
from exgrpo_cli.step.state import RunState, step_rng
from exgrpo_cli.step.update import UpdatePlan, UpdateResult, pi_old_logprobs, policy_update


@dataclass(frozen=True)
class Choices:
    """The variants the config names, looked up once when the trainer is built."""

    loss: LossForStep
    aggregation: Aggregation
    method: ReplayMethod  # what replays and how (`replay.method`, replay/methods.py)
    draw: FreshDraw  # how the step's fresh questions come from the sampler (`data.draw`)


@dataclass
class Trainer:
    cfg: ExgrpoConfig
    state: RunState
    tokenizer: Any  # an HF tokenizer
    template: Template
    engine: RolloutEngine
    scorer: Reward  # the reward stage (reward/stage.py)
    choices: Choices
    # data parallel (parallel/sharding.py): every rank draws the same questions and holds the same
    # buffer; the stages below map their work over the ranks (each generates, grades and trains
    # on its share of the groups, every rank gets every share's rollouts and rewards), and
    # `check_ranks_agree` verifies the shared state every step
    parallel: DataParallel = field(default_factory=DataParallel)
    questions: dict[str, Question] = field(init=False)  # uid -> question, for replay prompts
    _prompt_cache: dict[str, list[int]] = field(default_factory=dict)
    watch: MismatchWatch = field(init=False)  # the warning band below rollout.max_logprob_diff

    def __post_init__(self) -> None:
        self.questions = {q.uid: q for q in self.state.sampler.questions}
        r = self.cfg.rollout
        self.watch = MismatchWatch(r.warn_logprob_diff, r.logprob_diff_trend_window, r.top_p)

    @property
    def replay_enabled(self) -> bool:
        return self.cfg.replay.ratio > 0

    def prompt_ids(self, q: Question) -> list[int]:
        ids = self._prompt_cache.get(q.uid)
        if ids is None:
            ids = self._prompt_cache[q.uid] = self.template.prompt_ids(q, self.tokenizer)
        return ids

    # ------------------------------------------------------------------ the step
    def train_step(self, step: int) -> dict[str, float]:
        cfg, st, t = self.cfg, self.state, Timers()
        mem = PhaseMemory(self.device)
        t_step = time.perf_counter()
        mixed = self.replay_enabled and st.switch.active
        method = self.choices.method
        replayed: list[Replayed] = []
        selected_score = float("nan")
        with t("select"), mem("select"):
            if mixed:
                method.expire(st.buffer, step)  # before selection, so no replayed row is older
                replayed, selected_score = self.select_replay(step, t)
        retired = st.buffer.retired if self.replay_enabled else ()
        per_step = cfg.algo.questions_per_step
        readmitted = self.take_readmitted(per_step - len(replayed))  # replay.readmit_into=batch
        slots = per_step - len(replayed) - len(readmitted)
        fresh = readmitted + self.choices.draw(st.sampler, slots, per_step, retired)
        # solutions from elsewhere (LUFFY's, from the data) guide from step 1: no delayed start
        guided = [method.guidance(q) if self.replay_enabled else () for q in fresh]
        with t("rollout"), mem("rollout"):
            groups = self.rollout(fresh, replayed, step, guided)
        with t("reward"):
            reward_metrics = self.score(groups)
        if self.replay_enabled:
            st.switch.update(step, reward_metrics["reward/accuracy"])
        mine = self.training_share(groups, step)
        batch = build_mixed_batch([groups[i] for i in mine], step_groups=mine)
        advantages = method.advantages(batch, cfg.algo.scale_by_std)
        with t("update"), mem("update"):
            plan = self.update_plan(step)  # one plan for the pi_old pass and the update
            old = self.pi_old(batch, plan)
            result = self.update(batch, advantages, plan, old)
        if self.replay_enabled:
            with t("buffer"):
                self.observe(groups, step, self.trainer_logprobs(groups, batch, result))
        with t("sync"), mem("sync"):
            self.sync(step)
        if self.replay_enabled:
            with t("buffer"):
                method.end_step(st.buffer, step, groups)
                self.maybe_readmit(step)
        st.step = step
        st.count_updates(result.applied)
        self.check_ranks_agree(step)
        metrics = {
            **reward_metrics,
            **rollout_metrics(groups, batch),
            **self.update_metrics(result),
            **t,
            **mem,
            # the questions the method chose: replayed from the buffer, or guided by a data solution
            **self.state_metrics(len(replayed) + sum(map(bool, guided)), selected_score),
            **offpolicy_metrics(
                result.offpolicy, result.correction, self.parallel, cfg, replayed_ages(replayed, step)
            ),
        }
        metrics |= self.watch.observe(step, metrics["rollout/logprob_diff_mean"])
        if cfg.replay.readmit_into == "batch":
            metrics["replay/readmitted_trained"] = float(len(readmitted))  # this step
            metrics["replay/readmit_queue"] = float(len(st.readmit_queue))  # still waiting
        # the whole step's wall time (batch building and metrics included), not the stages' sum
        metrics["timing/step"] = time.perf_counter() - t_step
        return metrics

    def state_metrics(self, replayed: int, selected_score: float) -> dict[str, float]:
        """The run state after the step: the buffer's figures (with replay on), the pass over the
        question pool, and this step's replay (`replayed` questions, their trajectories' mean
        `selected_score`)."""
        st = self.state
        metrics = st.buffer.metrics() if self.replay_enabled else {}
        metrics["data/epoch"] = float(st.sampler.epoch + 1)  # the pass over the pool, from 1
        metrics["data/epoch_questions"] = float(st.sampler.epoch_questions)  # less retired at its start
        metrics["replay/active"] = float(st.switch.active and self.replay_enabled)
        metrics["replay/replayed_questions"] = float(replayed)
        # the chosen trajectories' mean score: their mean token entropy under the entropy rules,
        # but their mean NLL under replay.trajectory_selection=lowest_nll (the name predates that
        # rule and is kept for the logs' continuity); NaN for rules without a score
        metrics["replay/selected_entropy_mean"] = selected_score
        return metrics

    @property
    def device(self) -> torch.device:
        """The run's compute device. Not the parameters' device: under FSDP2's CPU offload
        (trainer.offload=all) they live in host memory while the model computes on the GPU."""
        return self.parallel.device

    @property
    def token_budget(self) -> int:
        return token_budget(self.cfg.algo.micro_batch_tokens, self.device)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def update_plan(self, step: int | None = None) -> UpdatePlan:
        """The step's update settings. With `step`, the engine check of `rollout.max_logprob_diff`
        runs before the first optimizer step (may stop the run, naming the step)."""
        a, p, r = self.cfg.algo, self.cfg.replay, self.cfg.rollout
        started = self.replay_enabled and self.state.switch.active
        check = None if step is None else engine_check(r.max_logprob_diff, step, self.parallel, r.top_p)
        return UpdatePlan(
            loss=self.choices.method.loss(self.choices.loss(self.cfg, started), started),
            aggregation=self.choices.aggregation,
            entropy_coef=a.entropy_coef,
            importance_correction=self.choices.method.importance_correction(p.importance_correction),
            max_response_tokens=self.cfg.model.max_response_tokens,
            updates=a.updates_per_step,
            micro_batch_tokens=self.token_budget,
            grad_clip=a.grad_clip,
            skip_grad_norm_above=a.skip_grad_norm_above,
            temperature=r.temperature,
            before_first_step=check,
            rollout_correction=correction_of(self.cfg),
            replay_beta=p.beta if p.shaping else None,
        )

    # ------------------------------------------------------------------ stages
    def select_replay(self, step: int, timers: Timers | None = None) -> tuple[list[Replayed], float]:
        """docs/algorithm.md §3, through the method's hooks (step/replay.py): the replayed questions
        with their stored responses and fresh counts; also the chosen responses' mean score (mean
        token entropy, or mean NLL for lowest_nll; NaN for rules without a score). `timers` gets
        the candidates' scoring forward as `select_scoring` (part of `select`)."""
        timers = timers if timers is not None else Timers()
        p, st, method = self.cfg.replay, self.state, self.choices.method

        def score(owners: list[str], responses: list[list[int]]) -> list[float]:
            assert method.score is not None
            with timers("select_scoring"):
                return score_candidates(
                    st.model,
                    [self.prompt_ids(self.questions[u]) for u in owners],
                    responses,
                    kind=method.score,
                    temperature=self.cfg.rollout.temperature,
                    pad_id=self.pad_id,
                    token_budget=self.token_budget,
                    max_rows=p.entropy_batch_size,
                    parallel=self.parallel,
                )

        rng = step_rng(self.cfg.trainer.seed, step, 2)
        return choose_replay(method, st.buffer, self.questions, self.cfg.rollout.n, rng, step, score)

    def rollout(
        self,
        fresh: list[Question],
        replayed: list[Replayed],
        step: int,
        guided: list[tuple[str, ...]] | None = None,
    ) -> list[Group]:
        """K fresh responses per fresh question, less one per solution its method `guided` it with
        (then the solutions); per replayed question the fresh ones its method asks for, then its
        stored ones (docs/algorithm.md §4)."""
        K = self.cfg.rollout.n
        guided = guided if guided is not None else [() for _ in fresh]
        questions = fresh + [r.question for r in replayed]
        counts = [K - len(g) for g in guided] + [r.fresh for r in replayed]
        prompts = [self.prompt_ids(q) for q in questions]
        seed = int(step_rng(self.cfg.trainer.seed, step, 1).integers(2**62))
        ro = self.cfg.rollout
        # each rank samples its own stream: `seed` on rank 0 (and alone)
        spec = SamplingSpec(
            ro.temperature, ro.top_p, self.cfg.model.max_response_tokens, self.parallel.seed(seed)
        )
        # every rank scores and stores every group: buffers stay identical across ranks
        responses = self.parallel.map(
            lambda share: self.generate_share(share, spec), list(zip(prompts, counts))
        )
        groups = [
            Group(q, p, list(rs), from_buffer=i >= len(fresh))
            for i, (q, p, rs) in enumerate(zip(questions, prompts, responses))
        ]
        for g, texts in zip(groups, guided):
            g.responses.extend(
                guidance_response(self.tokenizer, text, self.cfg.model.max_response_tokens) for text in texts
            )
        for g, chosen in zip(groups[len(fresh) :], replayed):
            g.responses.extend(
                Response(
                    ids=exp.response_ids.tolist(),
                    behavior_logp=exp.behavior_logp.tolist(),
                    replayed=True,
                    age=step - exp.step,
                )
                for exp in chosen.experiences
            )
        return groups

    def generate_share(self, share: list[tuple[list[int], int]], spec: SamplingSpec) -> list[list[Response]]:
        """One rank's rollouts: `share`'s (prompt ids, responses wanted) in one batched call of the
        engine; each prompt's responses, in the engine's order."""
        outs = self.engine.generate([p for p, _ in share], [k for _, k in share], spec)
        # vLLM with rollout.sleep_mode on CUDA frees its weights and KV cache for the update (the
        # sync after it wakes the weights, the next generation the cache); other engines: no-op
        self.engine.release()
        samples: list[list[Response]] = [[] for _ in share]
        for o in outs:
            samples[o.prompt_index].append(Response(o.response_ids, o.logprobs, finished=o.finished))
        return samples

    def score(self, groups: list[Group]) -> dict[str, float]:
        """Rewards for every response, the replayed ones included (docs/algorithm.md §4): each
        rank grades its share of the groups, every rank gets them all (step/reward.py)."""
        decode = lambda ids: decode_response(self.tokenizer, ids)  # noqa: E731
        # accuracy apart for questions drawn fresh and replayed ones: reward/accuracy pools both
        return grade_step(self.scorer, self.parallel, groups, decode) | accuracy_by_origin(groups)

    def training_share(self, groups: list[Group], step: int) -> list[int]:
        """The groups this rank trains on, in the order of the step's mini-batches (group-relative
        advantages: a slice by group is exact; FSDP averages the ranks' gradients)."""
        rng = step_rng(self.cfg.trainer.seed, step, 4)
        return update_order(self.parallel.mine(len(groups)), self.cfg.algo.updates_per_step, rng)

    def pi_old(self, batch: MixedBatch, plan: UpdatePlan) -> dict[int, list[float]]:
        """docs/algorithm.md §4: pi_old's log-probs of the rows the later mini-batches train on
        (the first mini-batch's come with its own forward), before any optimizer step."""
        st = self.state
        return pi_old_logprobs(st.model, batch, plan, self.pad_id, self.parallel)

    def update(
        self, batch: MixedBatch, advantages: torch.Tensor, plan: UpdatePlan, old: dict[int, list[float]]
    ) -> UpdateResult:
        """docs/algorithm.md §4: the policy-gradient step(s) on this rank's batch, under the step's
        `plan` (its engine check may stop the run before the first optimizer step)."""
        st = self.state
        return policy_update(st.model, st.optimizer, batch, advantages, plan, self.pad_id, self.parallel, old)

    def update_metrics(self, result: UpdateResult) -> dict[str, float]:
        """The update's `loss/` and `optim/` metrics, run-wide (step/metrics.py)."""
        return loss_metrics(result, float(self.state.optimizer.param_groups[0]["lr"]), self.parallel)

    def sync(self, step: int) -> None:
        """The new weights into the rollout engine, and a check that they arrived (may stop the run)."""
        self.engine.sync_weights(self.state.model)
        if self.cfg.rollout.max_logprob_diff is not None:
            check_synced_weights(self.engine, self.state.model, step=step, parallel=self.parallel)

    def bounds(self) -> Bounds | None:
        """The success counts whose groups the buffer collects (lbound, rbound) this step; None
        before the delayed start (docs/algorithm.md §2)."""
        if not self.state.switch.active:
            return None
        return self.cfg.replay.experience_bounds(self.cfg.rollout.n)

    def trainer_logprobs(
        self, groups: list[Group], batch: MixedBatch, result: UpdateResult
    ) -> dict[tuple[int, int], np.ndarray]:
        """(group, response) -> the trainer's pre-update log-probs of the responses the buffer
        stores this step, from every rank (each computed them for the rows of its own `batch`): all
        ranks store the same. Empty, and nothing exchanged, when none is stored or the
        buffer stores the engine's log-probs (every rank decides alike)."""
        if not self.cfg.replay.store_trainer_logprobs:
            return {}
        method = self.choices.method
        wanted = set(method.enters(method.observed(groups), self.bounds()))
        if not wanted:
            return {}
        local = {
            key: np.asarray(result.trainer_logp[row], dtype=np.float32)
            for row, key in enumerate(batch.row_keys)
            if key in wanted
        }
        return self.parallel.merge(local).items

    def observe(
        self, groups: list[Group], step: int, trainer_logp: dict[tuple[int, int], np.ndarray]
    ) -> None:
        """docs/algorithm.md §2: retire K/K questions, bucket and store the rest (after the delayed start,
        when lbound < k <= rbound). The stored log-probs are the trainer's (`trainer_logp`), or the
        rollout engine's with `replay.store_trainer_logprobs=false`."""
        logprobs = trainer_logp if self.cfg.replay.store_trainer_logprobs else None
        method = self.choices.method
        seen = method.observed(groups)  # a view keeps the groups' order and the fresh rows' places
        rows = method.enters(seen, self.bounds())
        buffer = self.state.buffer
        buffer.observe_groups(
            seen, step, self.bounds(), logprobs, rows, method.keeps_prompts, method.stores_any
        )
        method.recorded(buffer, seen, rows)

    def check_ranks_agree(self, step: int) -> None:
        """Every rank holds the same buffer, switch and sampler position (parallel/sharding.py
        `check_agree`); a no-op on one rank."""
        self.parallel.check_agree(self.state.digest, step)

    def maybe_readmit(self, step: int) -> None:
        """docs/algorithm.md §2: every `replay.readmit_every` steps a share of the retired questions
        leaves the retired set (back into fresh sampling from the next epoch); with
        `replay.readmit_into=batch` they are also queued for the next steps' batches."""
        p = self.cfg.replay
        if p.readmit_every and p.readmit_retired_fraction > 0 and step % p.readmit_every == 0:
            back = self.state.buffer.readmit(
                p.readmit_retired_fraction, step_rng(self.cfg.trainer.seed, step, 3)
            )
            if p.readmit_into == "batch":  # the questions still waiting stay in fresh sampling only
                self.state.readmit_queue = list(back)

    def take_readmitted(self, slots: int) -> list[Question]:
        """The queued re-admitted questions this step trains: the first `slots` of the queue, at most
        `replay.readmit_batch_share` of the step's questions (the rest wait for the next steps, until
        the next re-admission replaces the queue). They take the first fresh slots; the sampler fills the
        others (under data.draw=batch it still draws the step's full batch, and the rows the
        re-admitted questions displace are dropped, as those replay displaces). Being out of the
        retired set, a queued question can also come up in sampling once a new epoch starts, so a
        step may rarely hold it twice (two groups, each counted as the other fresh groups)."""
        cap = math.floor(self.cfg.replay.readmit_batch_share * self.cfg.algo.questions_per_step + 1e-9)
        n, queue = max(min(slots, cap), 0), self.state.readmit_queue
        taken, self.state.readmit_queue = queue[:n], queue[n:]
        return [self.questions[u] for u in taken]

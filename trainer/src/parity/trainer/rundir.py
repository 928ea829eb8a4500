"""A run directory and what the trainer writes into it (docs/training.md §3).

    config.toml      the resolved config
    metrics.jsonl    one record per step (metric names: docs/training.md §3)
    spans.jsonl      raw time spans of every actor (what `parity profile` reads)
    trace.json       Chrome/Perfetto timeline, one track per actor
    samples.jsonl    a few whole episodes per step: text, reward and its parts, tool calls
    summary.json     totals and final values
    segments.json    wall time of each process that worked on the run (resumes, restarts),
                     split into start-up, training steps and held-out evaluation
    heldout_before.json  the starting model's held-out success (measured once per run)
    error.log        the full traceback of a run that stopped on an error
    plots/*.png      reward, KL/D3, stacked timing per step
    tb/              TensorBoard event files
    checkpoints/     see checkpoint.py
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from parity.core.config import dump_toml
from parity.core.timing import Span, read_spans, write_spans
from parity.core.trace import chrome_trace
from parity.core.types import Trajectory
from parity.trainer.config import TrainConfig

# Everything a run writes into its directory: what `--force` deletes.
RUN_ENTRIES = ("config.toml", "metrics.jsonl", "spans.jsonl", "samples.jsonl", "trace.json",
               "summary.json", "segments.json", "heldout_before.json", "error.log", "plots",
               "tb", "checkpoints")
# The parts of a run's wall time (segments.json, summary.json): start-up (checks, Ray, the
# actors loading their models), the training steps, and held-out evaluation before and after.
WALL_PARTS = ("startup_s", "steps_s", "heldout_s")

TIMING_KEYS = ("timing/gen_s", "timing/env_s", "timing/learner_s", "timing/sync_s",
               "timing/learner_wait_s")


class RunDir:
    """Paths inside one run directory, and the appending writers."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "checkpoints").mkdir(exist_ok=True)
        self._tb: Any = None

    def open_tensorboard(self, resume_step: int | None, enabled: bool = True) -> None:
        """Log to TensorBoard (tb/) from now on. `resume_step`: the run continues from that
        step, so TensorBoard drops what an abandoned attempt logged from there on."""
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.root / "tb"), purge_step=resume_step)

    metrics_path = property(lambda self: self.root / "metrics.jsonl")
    spans_path = property(lambda self: self.root / "spans.jsonl")
    config_path = property(lambda self: self.root / "config.toml")
    checkpoints = property(lambda self: self.root / "checkpoints")

    def save_config(self, cfg: TrainConfig) -> None:
        _atomic_write(self.config_path, dump_toml(cfg.model_dump(mode="json")))

    def log(self, record: dict[str, Any]) -> None:
        """Append one step's metrics (durably: a SIGKILL loses at most this line)."""
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, int | float):
                    self._tb.add_scalar(k, v, record["step"])
            self._tb.flush()

    def log_spans(self, spans: list[Span]) -> None:
        write_spans(spans, self.spans_path)

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        """Append a step's sample episodes (`sample_episode`) to samples.jsonl and, as one
        markdown text, to TensorBoard's text tab."""
        with open(self.root / "samples.jsonl", "a") as f:
            f.write("".join(json.dumps({"step": step, **s}) + "\n" for s in samples))
        if self._tb is not None and samples:
            self._tb.add_text("samples", "\n\n---\n\n".join(map(sample_markdown, samples)),
                              step)

    segments_path = property(lambda self: self.root / "segments.json")

    def begin_segment(self) -> int:
        """A new process works on the run from now: its index in segments.json."""
        segs = self.segments()
        segs.append({"started": time.time(), "wall_s": 0.0, "train_wall_s": 0.0,
                     **dict.fromkeys(WALL_PARTS, 0.0)})
        _atomic_write(self.segments_path, json.dumps(segs, indent=1))
        return len(segs) - 1

    def time_segment(self, index: int, **seconds: float) -> None:
        """Record how long segment `index` has run so far, in all (`wall_s`), in the training
        loop (`train_wall_s`) and by part (WALL_PARTS; start-up is what the others leave of
        the wall). Called every step: a killed process loses at most one step's time."""
        segs = self.segments()
        seg = segs[index] | seconds
        seg["startup_s"] = max(0.0, seg["wall_s"] - seg["steps_s"] - seg["heldout_s"])
        segs[index] = seg
        _atomic_write(self.segments_path, json.dumps(segs, indent=1))

    def segments(self) -> list[dict[str, float]]:
        try:
            return json.loads(self.segments_path.read_text())
        except (OSError, ValueError):
            return []

    def truncate_from(self, step: int) -> None:
        """On resume at `step`: forget metrics, samples and spans of steps ≥ step (they are
        redone)."""
        for path in (self.metrics_path, self.root / "samples.jsonl"):
            kept = [r for r in _read_jsonl(path) if r["step"] < step]
            _atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept))
        spans = [s for s in read_spans(self.spans_path) if s.step < step]
        self.spans_path.unlink(missing_ok=True)
        write_spans(spans, self.spans_path)

    def finish(self, extra: dict[str, Any], plots: bool = True) -> dict[str, Any]:
        """Write summary.json, trace.json and (if `plots`) plots/; returns the summary.
        `extra`'s held-out successes before and after training are drawn at steps 0 and
        the last update's."""
        if self._tb is not None:
            self._tb.close()
        recs = read_metrics(self.root)
        spans = read_spans(self.spans_path)
        _atomic_write(self.root / "trace.json", json.dumps(chrome_trace(spans)))
        summary = summarize(recs) | extra
        _atomic_write(self.root / "summary.json", json.dumps(summary, indent=2))
        if plots and recs:
            from parity.trainer.plots import write_plots

            heldout = {0: extra.get("heldout_success_before"),
                       len(recs): extra.get("heldout_success_after")}
            write_plots(recs, spans, self.root / "plots",
                        heldout={k: v for k, v in heldout.items() if v is not None})
        return summary


def holds_run(root: Path) -> bool:
    """Whether `root` holds a run that trained: logged steps, checkpoints or a summary
    (a start that failed before its first step leaves nothing worth keeping)."""
    ckpts = root / "checkpoints"
    return bool(read_metrics(root) or (root / "summary.json").exists()
                or (ckpts.is_dir() and any(ckpts.iterdir())))


def describe_run(root: Path) -> str:
    """'6 steps logged, checkpoints step_000004, step_000006' for messages about a run."""
    steps = len(read_metrics(root))
    ckpts = sorted(p.name for p in (root / "checkpoints").glob("step_*") if p.is_dir())
    return (f"{steps} step{'s' * (steps != 1)} logged, "
            f"{'checkpoints ' + ', '.join(ckpts) if ckpts else 'no checkpoint'}")


def clear_run(root: Path) -> list[str]:
    """Delete what a run wrote in `root` (RUN_ENTRIES; other files stay); returns the names."""
    gone = [name for name in RUN_ENTRIES if (root / name).exists()]
    for name in gone:
        p = root / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return gone


def sample_episode(traj: Trajectory) -> dict[str, Any]:
    """What a person needs to see of one episode: the chat as text, its length in tokens,
    the reward and its parts (weight-0 criteria included), how it ended, the tool calls and
    parse errors, and the task's expected answer."""
    return {
        "group": traj.group_id,
        "reward": traj.reward,
        "reward_components": traj.reward_components,
        "finish_reason": traj.finish_reason,
        "turns": traj.num_turns,
        "tokens": len(traj.tokens),
        "generated_tokens": traj.num_generated,
        "tool_calls": int(traj.metrics.get("tool_calls", 0)),
        "parse_errors": int(traj.metrics.get("parse_errors", 0)),
        "expected": traj.task.get("answer"),
        "messages": traj.messages,
    }


def sample_markdown(sample: dict[str, Any]) -> str:
    """One sample episode as markdown (TensorBoard's text tab, `parity eval --show`)."""
    parts = ", ".join(f"{k} {v:g}" for k, v in sample["reward_components"].items())
    head = (f"**reward {sample['reward']:g}** ({parts or 'no components'}) · "
            f"{sample['finish_reason'] or 'unfinished'} · {sample['turns']} turns · "
            f"{sample['tokens']} tokens ({sample['generated_tokens']} generated) · "
            f"tool calls {sample['tool_calls']} · parse errors {sample['parse_errors']} · "
            f"expected {sample['expected']!r}")
    turns = [f"`{m['role']}`\n\n    " + str(m["content"]).replace("\n", "\n    ")
             for m in sample["messages"]]
    return "\n\n".join([head, *turns])


def read_metrics(root: str | Path) -> list[dict[str, Any]]:
    """The step records of a run (a torn last line from a crash is skipped)."""
    return _read_jsonl(Path(root) / "metrics.jsonl")


def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    out = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the run and the last values of the headline metrics. Episodes that
    failed outside the agent are summed by kind under their metrics' names
    (`env/failures/total`, `env/failures/<kind>`)."""
    if not recs:
        return {"steps": 0}
    wall = sum(r.get("timing/step_s", 0.0) for r in recs)
    last = recs[-1]
    out: dict[str, Any] = {
        "steps": len(recs),
        "updates": len(recs),
        "last_step": last["step"],
        "steps_s": wall,
        "updates_per_hour": 3600.0 * len(recs) / wall if wall > 0 else 0.0,
        "reward/first": recs[0].get("reward/mean"),
        "reward/last": last.get("reward/mean"),
        "reward/best": max(r.get("reward/mean", float("-inf")) for r in recs),
    }
    for k in ("is/d3", "is/d3_mismatch", "is/d3_lag", "kl/rollout_learner", "lag/mean",
              "lag/max", "gate/rejected_frac", "is/ess_frac", "kl/update", "kl/update_sampled",
              "kl/update_bounded", "trust/scale"):
        vals = [r[k] for r in recs if k in r]
        if vals:
            out[f"{k}/mean"] = sum(vals) / len(vals)
            out[f"{k}/max"] = max(vals)
    out["is/d3_mismatch_max"] = out.get("is/d3_mismatch/max", 0.0)
    if "trust/scale/mean" in out:  # optim.max_update_kl: how many updates it shrank
        out["trust/shrunk"] = sum(r.get("trust/scale", 1.0) < 1.0 for r in recs)
    for k in TIMING_KEYS:
        out[f"{k}/total"] = sum(r.get(k, 0.0) for r in recs)
    for k in ("dropped", "skipped_nonfinite", "worker_restarts", "learner_restarts"):
        out[k] = last.get(f"count/{k}", 0)
    failures = sorted({k for r in recs for k in r if k.startswith("env/failures/")})
    for k in failures:
        out[k] = sum(r.get(k, 0) for r in recs)
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

"""A run directory and what the trainer writes into it (design.md §4).

    config.toml      the resolved config
    metrics.jsonl    one record per step (metric names of design.md §4)
    spans.jsonl      raw time spans of every actor (what `parity profile` reads)
    trace.json       Chrome/Perfetto timeline, one track per actor
    summary.json     totals and final values
    segments.json    wall time of each process that worked on the run (resumes, restarts)
    error.log        the full traceback of a run that stopped on an error
    plots/*.png      reward, KL/D3, stacked timing per step
    tb/              TensorBoard event files
    checkpoints/     see checkpoint.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from parity.core.config import dump_toml
from parity.core.timing import Span, chrome_trace, read_spans, write_spans
from parity.trainer.config import TrainConfig

TIMING_KEYS = ("timing/gen_s", "timing/env_s", "timing/learner_s", "timing/sync_s",
               "timing/learner_wait_s")


class RunDir:
    """Paths inside one run directory, and the appending writers."""

    def __init__(self, root: str | Path, tensorboard: bool = False) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "checkpoints").mkdir(exist_ok=True)
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.root / "tb"))

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

    segments_path = property(lambda self: self.root / "segments.json")

    def begin_segment(self) -> int:
        """A new process works on the run from now: its index in segments.json."""
        segs = self.segments()
        segs.append({"started": time.time(), "wall_s": 0.0, "train_wall_s": 0.0})
        _atomic_write(self.segments_path, json.dumps(segs, indent=1))
        return len(segs) - 1

    def time_segment(self, index: int, wall_s: float, train_wall_s: float) -> None:
        """Record how long segment `index` has run so far (called every step: a killed
        process loses at most one step's time)."""
        segs = self.segments()
        segs[index].update(wall_s=wall_s, train_wall_s=train_wall_s)
        _atomic_write(self.segments_path, json.dumps(segs, indent=1))

    def segments(self) -> list[dict[str, float]]:
        try:
            return json.loads(self.segments_path.read_text())
        except (OSError, ValueError):
            return []

    def truncate_from(self, step: int) -> None:
        """On resume at `step`: forget metrics and spans of steps ≥ step (they are redone)."""
        recs = [r for r in read_metrics(self.root) if r["step"] < step]
        _atomic_write(self.metrics_path, "".join(json.dumps(r) + "\n" for r in recs))
        spans = [s for s in read_spans(self.spans_path) if s.step < step]
        self.spans_path.unlink(missing_ok=True)
        write_spans(spans, self.spans_path)

    def finish(self, extra: dict[str, Any], plots: bool = True) -> dict[str, Any]:
        """Write summary.json, trace.json and (if `plots`) plots/; returns the summary."""
        if self._tb is not None:
            self._tb.close()
        recs = read_metrics(self.root)
        spans = read_spans(self.spans_path)
        _atomic_write(self.root / "trace.json", json.dumps(chrome_trace(spans)))
        summary = summarize(recs) | extra
        _atomic_write(self.root / "summary.json", json.dumps(summary, indent=2))
        if plots and recs:
            from parity.trainer.plots import write_plots

            write_plots(recs, spans, self.root / "plots")
        return summary


def read_metrics(root: str | Path) -> list[dict[str, Any]]:
    """The step records of a run (a torn last line from a crash is skipped)."""
    p = Path(root) / "metrics.jsonl"
    out = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def summarize(recs: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals over the run and the last values of the headline metrics."""
    if not recs:
        return {"steps": 0}
    wall = sum(r.get("timing/step_s", 0.0) for r in recs)
    last = recs[-1]
    out: dict[str, Any] = {
        "steps": len(recs),
        "updates": len(recs),
        "last_step": last["step"],
        "wall_s": wall,
        "updates_per_hour": 3600.0 * len(recs) / wall if wall > 0 else 0.0,
        "reward/first": recs[0].get("reward/mean"),
        "reward/last": last.get("reward/mean"),
        "reward/best": max(r.get("reward/mean", float("-inf")) for r in recs),
    }
    for k in ("is/d3", "is/d3_mismatch", "is/d3_lag", "kl/rollout_learner", "lag/mean",
              "lag/max", "gate/rejected_frac", "is/ess_frac", "kl/update", "kl/update_sampled",
              "trust/scale"):
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
    return out


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)

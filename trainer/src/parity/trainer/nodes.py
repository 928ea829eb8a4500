"""One job, one arithmetic: a fixed probe on every node that hosts the learner or a rollout
worker, compared across nodes.

Each process proves its own aligned kernels row-invariant (`parity.model.selfcheck`). Two
machines can each pass and still round differently — another CPU generation, BLAS branch or
torch dispatch level — and then the engine's logprobs differ from the learner's although
both sides are "aligned". `local_probe` computes the kernels' fingerprint for a model's
shapes where it runs; `disagreement` turns a set of probes into the error `parity train`
refuses to start with (or, with `train.node_mismatch = "warn"`, the warning it prints),
and `probe_cluster` runs the probe on every alive node of a cluster for `parity audit`.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from parity.core.memory import keep_freed_memory

if TYPE_CHECKING:
    from parity.model import ModelConfig


class NodeMismatchError(RuntimeError):
    """Nodes of one job compute different bits with aligned kernels; the run does not start."""


def local_probe(cfg: ModelConfig) -> dict[str, Any]:
    """This process's fingerprint of aligned kernels at `cfg`'s shapes, its proof and machine
    (`parity.model.selfcheck.probe`), and where it runs."""
    from parity.model.selfcheck import probe

    node = ""
    try:
        import ray

        if ray.is_initialized():
            node = ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return {"host": socket.gethostname(), "node_id": node, "pid": os.getpid(), **probe(cfg)}


def _where(p: dict[str, Any]) -> str:
    return (f"{p['role']} on {p['host']} ({p['cpu']}, torch {p['torch_capability']}, "
            f"BLAS {p['blas']}, GEMMs by {p.get('onednn', 'torch mkldnn')})")


def disagreement(probes: list[dict[str, Any]]) -> str | None:
    """None if every probe shows one fingerprint; else what differs, where, and the fix.
    Each probe carries a `role` ("learner", "rollout worker 1", "node 3", ...)."""
    prints = {p["fingerprint"] for p in probes}
    if len(prints) <= 1:
        return None
    groups = [" and ".join(_where(p) for p in probes if p["fingerprint"] == f) for f in sorted(prints)]
    return ("aligned kernels give different bits on different nodes of this job: "
            + "; versus ".join(groups)
            + ". Each node is row-invariant, but they round differently, so the engine's "
              "logprobs would not match the learner's. Run the learner and the rollout workers "
              "on one CPU type and software stack (same torch build, ATEN_CPU_CAPABILITY and "
              "MKL_CBWR), or set train.node_mismatch = \"warn\" to train anyway with "
              "is/d3_mismatch measuring the difference.")


def probe_cluster(address: str, configs: dict[str, ModelConfig]) -> dict[str, Any]:
    """`local_probe` of each config on every alive node of the Ray cluster at `address`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    task = ray.remote(num_cpus=0)(lambda cfgs: {k: local_probe(c) for k, c in cfgs.items()})
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                         ).remote(configs) for n in nodes]
    per_node = ray.get(refs, timeout=600)
    models = {}
    for name in configs:
        probes = [{**r[name], "role": f"node {i}"} for i, r in enumerate(per_node)]
        models[name] = {"probes": probes, "disagreement": disagreement(probes),
                        "proofs_ok": all(p["proof_ok"] for p in probes)}
    return {"address": address, "nodes": len(nodes), "models": models,
            "agree": all(m["disagreement"] is None and m["proofs_ok"] for m in models.values())}


class PlacementError(RuntimeError):
    """The cluster cannot hold the job's actors where its config places them."""


def demand(num_cpus: float, num_gpus: float, resources: dict[str, float]) -> dict[str, float]:
    """The Ray resources one actor asks for."""
    return {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {}), **resources}


def _offer(resources: dict[str, float]) -> str:
    # Ray's bookkeeping resources (memory, node:<ip>, ...) say nothing a user sets
    shown = {k: v for k, v in sorted(resources.items()) if not k.startswith("node:")
             and k not in ("memory", "object_store_memory") and "accelerator_type" not in k}
    return ", ".join(f"{k} {v:g}" for k, v in shown.items()) or "nothing"


def unplaceable(role: str, keys: str, need: dict[str, float], nodes: list[dict[str, Any]]
                ) -> str | None:
    """None if an alive node of `nodes` (ray.nodes()) offers `need` in total; else the error
    text: the actor, the config keys that place it, what each node offers, the fix."""
    alive = [n for n in nodes if n.get("Alive")]
    if any(all(n["Resources"].get(k, 0.0) >= v for k, v in need.items() if v > 0) for n in alive):
        return None
    offers = "; ".join(f"{n['NodeManagerAddress']} offers {_offer(n['Resources'])}" for n in alive)
    return (f"placement: no alive node of the Ray cluster can hold the {role}, which needs "
            f"{_offer(need)} ({keys}); {offers or 'no node is alive'}. Start a node with those "
            f"resources (`ray start --num-cpus N --resources '{{\"name\": 1}}'`) or change {keys}.")


def place_process(num_threads: int, cores: list[int], cpus: float) -> int:
    """In an actor's process: pin it to `cores` (any core if empty) and give torch
    `num_threads` threads; 0: its Ray CPUs `cpus`, rounded (at least 1). Actors with a
    thread per core each would contend for the cores (torch's threads spin while they wait
    for each other), in sync mode too: the sandboxes run beside the engine. Returns the
    thread count."""
    import torch

    if cores:
        have = sorted(os.sched_getaffinity(0) | set(range(os.cpu_count() or 1)))
        if not set(cores) <= set(have):
            raise PlacementError(f"cpu_affinity {cores}: this node ({socket.gethostname()}) "
                                 f"has cores {have[0]}-{have[-1]}")
        os.sched_setaffinity(0, cores)
    if num_threads == 0:
        num_threads = max(1, round(cpus))
    torch.set_num_threads(num_threads)
    keep_freed_memory()
    return num_threads


def here() -> dict[str, Any]:
    """Where this process runs: its Ray node id, host, torch threads and CPU cores."""
    import ray
    import torch

    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))}

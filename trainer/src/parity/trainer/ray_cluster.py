"""Ray for a training run: a local instance sized to hold its actors, or a cluster joined
within `train.start_timeout_s`."""

from __future__ import annotations

import os
import socket
import threading
import time

from parity.trainer.config import TrainConfig


def start_ray(address: str, cfg: TrainConfig) -> None:
    """Join the cluster at `address` (ClusterUnreachable within `train.start_timeout_s` if
    it does not answer), or start a local Ray sized to hold the actors even on a 2-core
    laptop (logical CPUs: the learner's plus the workers'), offering every custom resource
    the config places them with (`learner.resources`, `rollout.resources`)."""
    if not address:
        # Under `uv run`, Ray would rebuild the workspace into a fresh environment for its
        # workers; local workers share this interpreter's instead. And a local instance
        # listens on loopback only (Ray's "no cluster" mode). Both read at `import ray`.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        # token authentication, as Ray's default for a new local cluster, chosen explicitly
        # (Ray warns on every run while the mode is left unset)
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    if ray.is_initialized():
        return
    if address:
        _join(address, cfg.train.start_timeout_s)
        return
    r = cfg.rollout
    lc = cfg.learner
    need = lc.ranks * lc.num_cpus + r.workers * r.num_cpus_per_worker
    custom = {k: lc.ranks * v + r.workers * r.resources.get(k, 0.0)
              for k, v in lc.resources.items()}
    custom |= {k: r.workers * v for k, v in r.resources.items() if k not in custom}
    # address="local": a Ray of its own, even when another job's Ray runs on this machine
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, int(need + 0.999)),
             resources=custom or None, include_dashboard=False, log_to_driver=True)


class ClusterUnreachable(ConnectionError):
    """`--ray-address` names a cluster that did not answer within train.start_timeout_s."""


def _join(address: str, timeout: float) -> None:
    """ray.init(address) within `timeout` seconds. Ray itself retries an unreachable head
    for minutes, so its port is tried first (nothing listening ends here, quietly), then
    ray.init runs in a thread that is abandoned, with the process, when it overruns."""
    import ray

    deadline = time.monotonic() + timeout
    unreachable = (f"the Ray cluster at --ray-address {address} did not answer within "
                   f"train.start_timeout_s = {timeout:g} s")
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if host and port.isdigit():
        while True:
            try:
                socket.create_connection((host, int(port)),
                                         timeout=max(0.1, min(5.0, deadline - time.monotonic()))
                                         ).close()
                break
            except OSError as e:
                if time.monotonic() + 1.0 >= deadline:
                    raise ClusterUnreachable(f"{unreachable} ({host}:{port}: {e})") from e
                time.sleep(1.0)
    failure: list[BaseException] = []

    def connect() -> None:
        try:
            ray.init(address=address, log_to_driver=True)
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)

    thread = threading.Thread(target=connect, name="ray-init", daemon=True)
    thread.start()
    thread.join(max(0.0, deadline - time.monotonic()))
    if thread.is_alive():
        raise ClusterUnreachable(f"{unreachable} (its port answers, Ray does not)")
    if failure:
        raise ClusterUnreachable(f"cannot join the Ray cluster at --ray-address {address}: "
                                 f"{type(failure[0]).__name__}: {failure[0]}") from failure[0]

"""Which Ray cluster a job runs on: a new local one, one joined by address, or the caller's connection.

- ``address=None``, not connected: a NEW local cluster (``ray.init(address="local")``, never a cluster
  some other process started on this machine), ``num_cpus = n_workers * cpus_per_worker`` (every core
  when ``n_workers`` is None), no dashboard; shut down when the job ends.
- ``address="host:port"`` (or ``"auto"``): join that cluster; at the end only this driver disconnects,
  the cluster keeps running. A cluster with token authentication (Ray's default for ``ray start``
  since 2.5x) needs ``RAY_AUTH_MODE=token`` and its token (``~/.ray/auth_token`` or ``RAY_AUTH_TOKEN``)
  in the driver's environment: Ray never enables it for an explicit address.
- a job that raises: the locals of its failed frames are cleared before the connection closes (Ray
  handles freed after ``ray.shutdown()`` can crash the process), so a post-mortem debugger sees no
  locals in the backend's frames.
- already connected (``ray.init`` called by the caller): used as is and left connected; an ``address``
  naming another cluster is refused (one driver holds one connection).
"""

import contextlib
import os
import traceback
from typing import Iterator, Optional

from .job import SCALE_EXTRA


def import_ray():
    """``ray``, or an ImportError saying what to install."""
    try:
        import ray
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] == "ray":
            raise ImportError(f"the Ray backend needs ray: {SCALE_EXTRA}") from error
        raise
    return ray


def check_address(address) -> None:
    if address is not None and (not isinstance(address, str) or not address.strip()):
        raise ValueError(f"address must be a Ray cluster address 'host:port' (or 'auto'), got {address!r}")


@contextlib.contextmanager
def ray_cluster(address: Optional[str], *, num_cpus: Optional[int] = None) -> Iterator[str]:
    """Connect as the module docstring says; yields how (``"started"``, ``"joined"`` or ``"existing"``)."""
    check_address(address)
    ray = import_ray()
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if address not in (None, "auto") and address != current:
            raise ValueError(f"this process is already connected to the Ray cluster at {current}; it cannot "
                             f"also join address={address!r} (call ray.shutdown() first, or pass address=None)")
        yield "existing"
        return
    if address is None:
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False)
        how = "started"
    else:
        try:
            ray.init(address=address)
        except (ConnectionError, RuntimeError) as error:
            raise ConnectionError(
                f"could not join the Ray cluster at {address!r}: {error}. Is it running (`ray status`)? A "
                "cluster with token authentication needs RAY_AUTH_MODE=token and its token (~/.ray/auth_token "
                "or RAY_AUTH_TOKEN) in this process's environment") from error
        how = "joined"
    try:
        yield how
    except BaseException as error:
        # The failed frames' locals (actor handles, object refs) would outlive the connection, and Ray
        # crashes when such a handle is freed after ray.shutdown(): drop them first (their code and line
        # numbers stay in the traceback).
        traceback.clear_frames(error.__traceback__)
        raise
    finally:
        ray.shutdown()  # stops the cluster only when we started it; after joining, only disconnects

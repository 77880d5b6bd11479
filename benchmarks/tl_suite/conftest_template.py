"""Root conftest the runner puts above a copy of TransformerLens's tests folder (not a test module).

It makes ``import transformer_lens`` resolve to glassbox.tl before any test module is imported,
leaves out the files scope.py excludes, skips the out-of-scope tests with their reason (prefixed
"OUT OF SCOPE"), and fails a test that runs longer than GLASSBOX_TL_SUITE_TIMEOUT seconds.
"""

import json
import os
import signal
from pathlib import Path

import pytest

import glassbox.tl

glassbox.tl.as_transformer_lens()


def _offline_hf_retry_shim():
    """TransformerLens 3.9's tests/conftest.py wraps transformers' from_pretrained with its CI's
    retry-on-HTTP-429 (``utilities.hf_utils.enable_hf_retry``) in a session fixture. The run is offline
    (HF_HUB_OFFLINE=1): there is no request to retry, so the runner gives that one name as a no-op.
    glassbox.tl itself has no such function."""
    import sys
    import types

    import glassbox.tl.utils as utils

    shim = types.ModuleType("transformer_lens.utilities.hf_utils", "runner's offline stand-in (see conftest)")
    shim.__dict__.update({k: v for k, v in vars(utils).items() if not k.startswith("__")})
    shim.enable_hf_retry = lambda: None
    sys.modules["transformer_lens.utilities.hf_utils"] = shim


_offline_hf_retry_shim()

_SCOPE = json.loads((Path(__file__).parent / "scope.json").read_text())
collect_ignore = [entry["path"] for entry in _SCOPE if "::" not in entry["path"]]
_TIMEOUT = int(os.environ.get("GLASSBOX_TL_SUITE_TIMEOUT", "300"))


def _reason(nodeid: str):
    for entry in _SCOPE:
        path = entry["path"]
        if "::" in path and (nodeid == path or nodeid.startswith(path + "[") or nodeid.startswith(path + "::")):
            return entry["why"]
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        why = _reason(item.nodeid)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason="OUT OF SCOPE: " + why))


_PROGRESS = os.environ.get("GLASSBOX_TL_SUITE_PROGRESS")


def pytest_runtest_logreport(report):
    """Each test's outcome as it finishes (a run stopped early still says what it ran)."""
    if not _PROGRESS or (report.when != "call" and report.outcome == "passed"):
        return
    message = ""
    if report.outcome == "failed":
        message = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message
                      or report.longreprtext).strip().splitlines()[:1]
        message = message[0][:300] if message else ""
    elif report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        message = str(report.longrepr[2])[:300]
    outcome = report.outcome if report.when == "call" or report.outcome != "failed" else "error"
    with open(_PROGRESS, "a") as log:
        log.write(f"{report.nodeid}\t{report.when}\t{outcome}\t{report.duration:.2f}\t"
                  f"{message.replace(chr(9), ' ').replace(chr(10), ' ')}\n")


def pytest_collectreport(report):
    if _PROGRESS and report.failed and report.nodeid.endswith(".py"):
        lines = [line[1:].strip() for line in report.longreprtext.splitlines() if line.startswith("E ")]
        message = (lines[-1] if lines else report.longreprtext.strip()[:300])[:300]
        with open(_PROGRESS, "a") as log:
            log.write(f"{report.nodeid}::\tcollect\terror\t0\t{message.replace(chr(9), ' ')}\n")


class TestTimeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    def expire(signum, frame):
        raise TestTimeout(f"ran past {_TIMEOUT} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(_TIMEOUT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)

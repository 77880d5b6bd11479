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


def _real_transformer_lens_modules() -> list:
    """Modules in sys.modules loaded from the real TransformerLens installed in this Python, if any.

    The suite must test glassbox.tl: a test that imported the real package would test TransformerLens
    itself (and mix its objects with glassbox's), so the runner fails loudly when that happens."""
    import importlib.machinery
    import sys

    spec = importlib.machinery.PathFinder.find_spec("transformer_lens")  # looks on sys.path, imports nothing
    roots = [os.path.realpath(p) for p in (spec.submodule_search_locations or [])] if spec else []
    found = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if where and any(os.path.realpath(where).startswith(root + os.sep) for root in roots):
            found.append(f"{name} ({where})")
    if sys.modules.get("transformer_lens") is not glassbox.tl:
        found.append(f"transformer_lens is {sys.modules.get('transformer_lens')!r}, not glassbox.tl")
    return found


def _fail_if_real_transformer_lens(when: str):
    found = _real_transformer_lens_modules()
    if found:
        if os.environ.get("GLASSBOX_TL_SUITE_PROGRESS"):  # the runner refuses to summarise such a run
            Path(os.environ["GLASSBOX_TL_SUITE_PROGRESS"]).with_name("REAL_TRANSFORMER_LENS_IMPORTED").write_text(
                "\n".join(found) + "\n")
        pytest.exit(f"the real TransformerLens was imported ({when}): {'; '.join(found[:5])}; this run "
                    "would not test glassbox.tl", returncode=3)


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

_BRIDGE = "TransformerBridge (TransformerLens's bridge API) is out of glassbox.tl's scope"
# transformer_lens_config: TransformerLensConfig, "configuration class for TransformerLens bridge components"
_BRIDGE_MODULES = ("transformer_lens.model_bridge", "transformer_lens.config.transformer_bridge_config",
                   "transformer_lens.config.transformer_lens_config")


def _bridge_out_of_scope(what: str):
    pytest.skip(f"OUT OF SCOPE: {_BRIDGE} (the test uses {what})", allow_module_level=True)


class _OutOfScopeType(type):
    """A stand-in class of the bridge API: subclassing it works (test files define bridge mocks at import
    time); constructing it or reading a class attribute skips the test as out of scope."""

    def __call__(cls, *args, **kwargs):
        _bridge_out_of_scope(cls.__qualname__)

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _bridge_out_of_scope(f"{cls.__qualname__}.{name}")


def _bridge_stand_in():
    """TransformerLens 3.9's test files mix HookedTransformer tests with TransformerBridge ones and import
    ``transformer_lens.model_bridge`` at the top, so without it the HookedTransformer tests could not run.
    The runner gives ``model_bridge`` (every submodule) and ``TransformerBridgeConfig`` as stand-ins
    whose every name is an _OutOfScopeType: a test that touches the bridge is skipped "OUT OF SCOPE" and
    counted so; the rest of its file runs on glassbox.tl. glassbox.tl itself has no bridge."""
    import importlib.abc
    import importlib.util
    import sys
    import types

    class BridgeModule(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            stand_in = _OutOfScopeType(name, (), {"__module__": self.__name__})
            setattr(self, name, stand_in)
            return stand_in

    class BridgeFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if any(name == p or name.startswith(p + ".") for p in _BRIDGE_MODULES):
                return importlib.util.spec_from_loader(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return BridgeModule(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    sys.meta_path.insert(0, BridgeFinder())
    config = sys.modules["transformer_lens.config"]
    config.TransformerBridgeConfig = _OutOfScopeType("TransformerBridgeConfig", (), {"__module__": config.__name__})


_bridge_stand_in()

_SCOPE = json.loads((Path(__file__).parent / "scope.json").read_text())
collect_ignore = [entry["path"] for entry in _SCOPE if "::" not in entry["path"]]
_TIMEOUT = int(os.environ.get("GLASSBOX_TL_SUITE_TIMEOUT", "300"))


def _reason(nodeid: str):
    for entry in _SCOPE:
        path = entry["path"]
        if "::" in path and (nodeid == path or nodeid.startswith(path + "[") or nodeid.startswith(path + "::")):
            return entry["why"]
    return None


def pytest_collection_finish(session):
    _fail_if_real_transformer_lens("while collecting the tests")


def pytest_sessionfinish(session, exitstatus):
    _fail_if_real_transformer_lens("while running the tests")


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
        message = str(report.longrepr[2]).removeprefix("Skipped: ")[:300]
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

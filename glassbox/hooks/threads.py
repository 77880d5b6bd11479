"""One model's hook state is used by one thread at a time; concurrent use is detected and refused.

Hooks, ``hook.ctx`` (``"step"`` during generation) and the hooks a ``with model.hooks(...)`` block
attaches are attributes of the model, not of the calling thread: thread B's forward would run thread
A's hooks, and two generations would interleave their steps. So while hooks added by ``hooks()``,
``run_with_hooks`` or ``generate`` are attached, the thread that attached them owns the model, and
a forward, ``add_hook``, ``reset_hooks`` or another ``hooks()`` from any other thread raises
``RuntimeError``; attaching hooks while another thread is inside a forward raises too. Plain forwards
with no such hooks may still run on several threads at once (they share no mutable state).

The cost is one check per forward (no lock on the hot path); claiming takes a lock, once per
``hooks()`` block. A deep copy or an unpickled model gets a fresh, unowned guard, so
``copy.deepcopy(model)`` gives each thread its own model.

Not covered: hooks added with ``model.add_hook`` outside any block (permanent ones included, or
kept by ``reset_hooks_end=False``) belong to the model, and every thread's forward runs them (adding
or removing them is refused while another thread holds the model); ``HookPoint.add_hook`` called on
a point directly bypasses the model and its guard.
"""

import threading
from contextlib import contextmanager
from typing import Iterator, Optional

ADVICE = ("hooks and hook.ctx are state on the model, shared by every thread: give each thread its "
          "own model (copy.deepcopy(model)), or serialise the calls (one threading.Lock around each use)")


def _thread_name(ident: int) -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    return f"thread {names.get(ident, '?')!r} (id {ident})"


class HookStateGuard:
    """Which thread owns a model's hook state (and for what), and which threads are inside a forward."""

    def __init__(self):
        self.owner: Optional[int] = None
        self.what = ""
        self.depth = 0
        self.running: dict = {}  # thread ident -> forwards it is inside (nested calls count)
        self.lock = threading.Lock()

    def __reduce__(self):
        # Copies and unpickled models start unowned, with nothing running.
        return (HookStateGuard, ())

    def _refuse_if_held(self, action: str, me: int, owner: Optional[int]) -> None:
        if owner is not None and owner != me:
            raise RuntimeError(f"{action} on {_thread_name(me)}, but this model's hooks are held by "
                               f"{_thread_name(owner)} (inside {self.what}); {ADVICE}")

    def _refuse_if_busy(self, action: str, me: int) -> None:
        busy = [t for t in list(self.running) if t != me]
        if busy:
            raise RuntimeError(f"{action} on {_thread_name(me)} while {_thread_name(busy[0])} is inside "
                               f"a forward of this model; {ADVICE}")

    def _refuse(self, action: str, me: int) -> None:
        self._refuse_if_held(action, me, self.owner)
        self._refuse_if_busy(action, me)

    @contextmanager
    def claim(self, what: str) -> Iterator[None]:
        """Own the hook state for the body: other threads' forwards and hook changes raise."""
        me = threading.get_ident()
        with self.lock:
            if self.owner != me:
                self._refuse(what, me)
                # Set the owner before looking for running forwards; a forward registers itself
                # before reading the owner, so of two racing threads at least one sees the other.
                self.owner, self.what = me, what
                try:
                    self._refuse_if_busy(what, me)
                except RuntimeError:
                    self.owner, self.what = None, ""
                    raise
            self.depth += 1
        try:
            yield
        finally:
            with self.lock:
                self.depth -= 1
                if self.depth == 0:
                    self.owner, self.what = None, ""

    def check_change(self, action: str) -> None:
        """Refuse a change of hooks from a thread that does not own them, or during another's forward."""
        self._refuse(action, threading.get_ident())

    def enter_forward(self) -> int:
        me = threading.get_ident()
        running = self.running
        running[me] = running.get(me, 0) + 1
        try:
            self._refuse_if_held("forward", me, self.owner)  # the owner read once, after registering
        except RuntimeError:
            self.exit_forward(me)
            raise
        return me

    def exit_forward(self, me: int) -> None:
        left = self.running[me] - 1
        if left:
            self.running[me] = left
        else:
            del self.running[me]

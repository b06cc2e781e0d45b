"""no_init(): modules built inside skip their random initialization (convert() overwrites every parameter with
the original module's values right away; GPT-2 large spent 16 of its 30 s of conversion drawing numbers it then
threw away, and wrote every tile twice)."""
import contextlib
import threading

_state = threading.local()


def skipping():
    return getattr(_state, "skip", False)


@contextlib.contextmanager
def no_init():
    old = skipping()
    _state.skip = True
    try:
        yield
    finally:
        _state.skip = old

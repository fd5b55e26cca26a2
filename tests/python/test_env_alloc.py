"""devtensor.env_alloc: the scoped choice of allocator for kernel libraries built on
devtensor's Rust API (examples/axpy_ext/tests shows the allocations themselves)."""

import threading

import numpy as np
import pytest
import torch

import devtensor


def test_scopes_nest_and_restore():
    assert devtensor.current_env_alloc() is None
    with devtensor.env_alloc(torch) as fw:
        assert fw is torch.Tensor
        assert devtensor.current_env_alloc() is torch.Tensor
        with devtensor.env_alloc(None):
            assert devtensor.current_env_alloc() is None
        with devtensor.env_alloc(devtensor.zeros(1)):  # an instance names its type
            assert devtensor.current_env_alloc() is devtensor.Tensor
        assert devtensor.current_env_alloc() is torch.Tensor
    assert devtensor.current_env_alloc() is None


def test_scopes_exited_out_of_order_leave_the_innermost_open_one_selected():
    # An ExitStack unwound out of order (or manual __enter__/__exit__): each exit
    # keeps the selection the innermost scope still open made, and after the
    # last exit the selection from before the first is back.
    a, b, c = devtensor.env_alloc(torch), devtensor.env_alloc(None), devtensor.env_alloc(devtensor.Tensor)
    for order in ([a, b, c], [b, a, c], [c, a, b], [a, c, b]):
        a.__enter__(), b.__enter__(), c.__enter__()
        open_ = [a, b, c]
        for s in order:
            s.__exit__(None, None, None)
            open_.remove(s)
            want = open_[-1].framework if open_ else None
            assert devtensor.current_env_alloc() is want, (order, s)


def test_entering_a_scope_costs_the_same_at_any_depth():
    # Each entry links to the one around it instead of copying every open
    # entry (which made 16,000 nested scopes take seconds): the entries from
    # before a scope are still the very same object inside it.
    var = devtensor._devtensor._env_alloc_scopes
    depth = 5_000
    scopes = [devtensor.env_alloc(torch if i % 2 else None) for i in range(depth)]
    outer = None
    for s in scopes:
        s.__enter__()
        entry = var.get()
        assert entry[0] is s and entry[2] is outer
        outer = entry
    assert devtensor.current_env_alloc() is torch.Tensor
    # The innermost exits first, then the scope in the middle, out of order.
    scopes.pop().__exit__(None, None, None)
    assert devtensor.current_env_alloc() is None
    middle = scopes.pop(depth // 2)
    middle.__exit__(None, None, None)
    assert devtensor.current_env_alloc() is None
    for i, s in enumerate(reversed(scopes)):
        s.__exit__(None, None, None)
        if i + 1 < len(scopes):
            assert devtensor.current_env_alloc() is scopes[-2 - i].framework, i
    assert devtensor.current_env_alloc() is None
    assert var.get() is None


def test_an_exit_in_a_copied_context_leaves_the_original_as_it_was():
    # Copied contexts share the entries: an out-of-order exit in one remakes
    # its own chain and must not change the other's.
    import contextvars

    var = devtensor._devtensor._env_alloc_scopes
    a, b, c = devtensor.env_alloc(torch), devtensor.env_alloc(None), devtensor.env_alloc(devtensor.Tensor)
    for s in (a, b, c):
        s.__enter__()
    before = var.get()

    def exit_b():
        b.__exit__(None, None, None)
        assert var.get()[0] is c and var.get()[2][0] is a
        assert devtensor.current_env_alloc() is devtensor.Tensor

    contextvars.copy_context().run(exit_b)
    assert var.get() is before and before[2][0] is b, "the original chain is untouched"
    for s in (c, b, a):
        s.__exit__(None, None, None)
    assert devtensor.current_env_alloc() is None and var.get() is None


def test_restored_when_the_body_raises():
    with pytest.raises(KeyError), devtensor.env_alloc(torch.Tensor):
        raise KeyError("x")
    assert devtensor.current_env_alloc() is None


def test_one_object_reentered():
    scope = devtensor.env_alloc(torch)
    assert scope.framework is torch.Tensor and "torch" in repr(scope)
    with scope, scope:
        assert devtensor.current_env_alloc() is torch.Tensor
    assert devtensor.current_env_alloc() is None


def test_other_threads_are_not_affected():
    seen = []
    with devtensor.env_alloc(torch):
        t = threading.Thread(target=lambda: seen.append(devtensor.current_env_alloc()))
        t.start()
        t.join()
    assert seen == [None]


SHARED = devtensor.env_alloc(torch)


def test_one_object_entered_by_threads_at_once():
    # A module-level scope used by two threads whose blocks overlap, in the
    # order that broke it: A enters, B enters, A exits, B exits. Each exit must
    # undo its own thread's selection (A's exit raised "created in a different
    # Context", and both threads kept torch's allocator).
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen, errors = {}, []

    def body(name, entered, wait_before_exit, done):
        try:
            with SHARED:
                entered.set()
                assert wait_before_exit.wait(10)
                inner = devtensor.current_env_alloc()
            seen[name] = (inner, devtensor.current_env_alloc())
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            done.set()

    a = threading.Thread(target=body, args=("a", a_in, b_in, a_out))
    b = threading.Thread(target=body, args=("b", b_in, a_out, threading.Event()))
    a.start()
    assert a_in.wait(10)
    b.start()
    a.join()
    b.join()
    assert errors == []
    assert seen == {"a": (torch.Tensor, None), "b": (torch.Tensor, None)}


def test_one_object_entered_by_async_tasks_at_once():
    import asyncio

    async def task(delay_in, delay_inside):
        await asyncio.sleep(delay_in)
        with SHARED:
            await asyncio.sleep(delay_inside)
            inner = devtensor.current_env_alloc()
        return inner, devtensor.current_env_alloc()

    async def main():
        # a enters, b enters, a exits, b exits: b's token is the later one.
        return await asyncio.gather(task(0, 0.05), task(0.01, 0.1))

    assert asyncio.run(main()) == [(torch.Tensor, None), (torch.Tensor, None)]
    assert devtensor.current_env_alloc() is None


@pytest.mark.parametrize("bad", [np, np.ndarray, np.ones(2), 3, "torch"])
def test_frameworks_without_an_exchange_api_are_refused(bad):
    with pytest.raises(TypeError, match="exchange API"):
        devtensor.env_alloc(bad)

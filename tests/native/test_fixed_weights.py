"""fixed_weights: a check runs once per scope (one generate call), every time outside one."""

from medusa.native import fixed_weights


def test_a_check_runs_once_per_scope_per_owner_and_every_call_outside():
    calls = []
    a, b = object(), object()

    def check(owner):
        calls.append(owner)
        return len(calls)

    assert fixed_weights.checked("x", a, lambda: check(a)) == 1
    assert fixed_weights.checked("x", a, lambda: check(a)) == 2  # no scope: checked each time
    with fixed_weights.during():
        assert fixed_weights.checked("x", a, lambda: check(a)) == 3
        assert fixed_weights.checked("x", a, lambda: check(a)) == 3
        assert fixed_weights.checked("y", a, lambda: check(a)) == 4  # another kind of check
        assert fixed_weights.checked("x", b, lambda: check(b)) == 5
        with fixed_weights.during():  # nested: the outer scope's answers
            assert fixed_weights.checked("x", a, lambda: check(a)) == 3
        assert fixed_weights.checked("x", b, lambda: check(b)) == 5
    with fixed_weights.during():  # a new scope checks again
        assert fixed_weights.checked("x", a, lambda: check(a)) == 6
    assert len(calls) == 6


def test_a_scope_ends_on_an_error_too():
    try:
        with fixed_weights.during():
            fixed_weights.checked("x", 1, lambda: "inside")
            raise KeyError("boom")
    except KeyError:
        pass
    assert fixed_weights.checked("x", 1, lambda: "outside") == "outside"

"""Tests for lm_eval_ponder.scoring.grading: extraction, equivalence, time limits and voting.

Many cases pair a right answer with a near miss ("72" vs "720", (1,2) vs (2,1)), so that a grader
that is too lenient fails as surely as one that is too strict.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from lm_eval_ponder.scoring import grading
from lm_eval_ponder.scoring.grading import (
    canonical_answer,
    extract_boxed,
    extract_choice,
    extract_numeric,
    grade,
    majority_vote,
    math_equal,
    numeric_equal,
)

# Pathological: sympy would try to evaluate a power tower with ~10^10^10 digits.
TOWER = r"10^{10^{10^{10}}}"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
        ("Total is 5.\n#### 1,234\n", "1234"),
        ("The answer is 18.", "18"),
        ("So the answer is $1,000.50 in total", "1000.5"),
        ("Answer: -3.5 degrees", "-3.5"),
        ("The answer is 5. Check: 2 + 3 = 5, and 10 more.", "5"),  # phrase beats last number
        ("It costs €3 per kilo", "3"),
        ("The discount is 30%", "30"),
        ("The rope is 12 cm long", "12"),
        (r"The total is \$5.", "5"),
        (r"so it is $\boxed{\frac{3}{4}}$", "0.75"),
        (r"\boxed{3/4}", "0.75"),
        (r"\boxed{5\%}", "5"),
        (r"draft \boxed{10}, final \boxed{12}", "12"),
        ("First 10, then 20, finally 30 apples.", "30"),
        ("5-3=2", "2"),
        ("x = -7", "-7"),
        ("72.00", "72"),
        ("She has 1,2345 marbles", "2345"),  # not a thousands separator
        ("no digits here", None),
        ("", None),
        ("9" * 5000, None),  # absurdly long: rejected rather than parsed
    ],
)
def test_extract_numeric(text, expected):
    assert extract_numeric(text) == expected


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("72", "72.0", True),
        ("72", "72.00", True),
        ("72", "720", False),
        ("-5", "5", False),
        ("1000000", "1000001", False),  # integers compare exactly, not within rel_tol
        ("0.33333333", "0.333333333", True),
        ("1/2", "0.5", True),
        (None, "72", False),
        ("72", None, False),
        ("abc", "1", False),
    ],
)
def test_numeric_equal(pred, gold, expected):
    assert numeric_equal(pred, gold) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so $\boxed{\frac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{\sqrt{\frac{a}{b}}}", r"\sqrt{\frac{a}{b}}"),
        (r"\boxed{1} then \boxed{2}", "2"),
        (r"\fbox{7}", "7"),
        (r"the answer is $\boxed 5$", "5"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),
        (r"\boxed{12", None),  # truncated generation
        (r"\boxed{}", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


MATH_CASES = [
    (r"\frac12", "0.5", True),
    (r"\frac{1}{2}", r"\frac{1}{3}", False),
    (r"\dfrac{3}{4}", r"\tfrac34", True),
    (r"-\frac{1}{2}", "-0.5", True),
    (r"\sqrt{2}/2", r"\frac{\sqrt2}{2}", True),
    (r"2\pi", r"\pi \cdot 2", True),
    (r"\pi r^2", r"r^2\pi", True),
    (r"(-\infty, 3]", r"\left(-\infty,3\right]", True),
    (r"(-\infty,3)", r"(-\infty,3]", False),
    ("(1,2)", r"\left( 1, 2 \right)", True),
    ("(1,2)", "(2,1)", False),
    ("2, 1", "1,2", True),  # a set of solutions: order does not matter
    (r"\{1,2\}", "1, 2", True),
    ("x = 5", "5", True),
    ("5", "x=5", True),
    ("x=1", "y=1", False),
    ("C", r"\text{(C)}", True),
    ("(C)", "C", True),
    ("B", "(C)", False),
    (r"10,\!080", "10080", True),
    ("72", "720", False),
    ("72.00", "72", True),
    (r"30^\circ", "30", True),
    (r"30^{\circ}", "30", True),
    (r"50\%", "50", True),
    (r"\$4.50", "4.5", True),
    (r"5\text{ cm}", "5", True),
    (r"\text{Monday}", "Monday", True),
    ("Monday", "Tuesday", False),
    ("3x+2", "2+3x", True),
    ("0.333333", r"\frac13", True),
    ("0.3", r"\frac13", False),
    (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", True),
    (r"\begin{pmatrix}1\\2\end{pmatrix}", r"\begin{pmatrix} 2 \\ 1 \end{pmatrix}", False),
    (None, "1", False),
    ("", "1", False),
    ("}}}{{{", "1", False),
]


@pytest.mark.parametrize(("pred", "gold", "expected"), MATH_CASES)
def test_math_equal(pred, gold, expected):
    assert math_equal(pred, gold) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is (B)", "B"),
        ("The answer is B", "B"),
        ("Answer: B", "B"),
        ("**Answer:** (C)", "C"),
        ("(B)", "B"),
        ("d", "D"),
        (r"Therefore $\boxed{B}$.", "B"),
        (r"\boxed{\text{(D)}}", "D"),
        ("Hmm, I would pick B)", "B"),
        ("After checking each one, the correct option is D.", "D"),
        ("C is the correct answer.", "C"),
        ("The answer is A. Wait, that is wrong: the answer is C.", "C"),
        ("(A) 1 (B) 2 (C) 3 (D) 4. The answer is (B), since 1+1=2.", "B"),
        ("A train leaves the station at 5 pm. B arrives later.", None),
        ("The answer is a bit unclear.", None),
        ("", None),
    ],
)
def test_extract_choice(text, expected):
    assert extract_choice(text) == expected


@pytest.mark.parametrize(
    ("kind", "response", "gold", "expected"),
    [
        ("numeric", "3 apples and 4 pears make 7 fruits.", "#### 7", (True, "7")),
        ("numeric", "The answer is 720.", "72", (False, "720")),
        ("numeric", "The answer is $1,234.", "She paid\n#### 1234", (True, "1234")),
        ("math", r"So the answer is $\boxed{\dfrac{1}{2}}$.", r"\frac12", (True, r"\dfrac{1}{2}")),
        (
            "math", r"The final answer is $\frac{1}{3}$. I hope it is correct.", "0.5",
            (False, r"\frac{1}{3}"),
        ),
        ("math", r"\boxed{(2,1)}", r"Hence \boxed{(1,2)}", (False, "(2,1)")),
        ("choice", "The answer is (C)", "(C)", (True, "C")),
        ("choice", "The answer is B", "(C)", (False, "B")),
        ("choice", "I am not sure.", "A", (False, None)),
    ],
)
def test_grade(kind, response, gold, expected):
    assert grade(kind, response, gold) == expected


@pytest.mark.parametrize("kind", ["numeric", "math", "choice"])
@pytest.mark.parametrize(
    "garbage",
    ["", "   ", None, r"\boxed{", "#### ", "$$$$", "\x00\x01", r"\boxed{" + "9" * 3000 + "}",
     "The answer is" + " " * 5000 + "x"],  # long runs once made regexes backtrack for minutes
)
def test_garbage_is_wrong_and_never_raises(kind, garbage):
    correct, _ = grade(kind, garbage, "1")
    assert correct is False
    canonical_answer(kind, garbage)  # must not raise either


def test_unknown_kind_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown grading kind 'boolean'"):
        grade("boolean", "yes", "yes")
    with pytest.raises(ValueError, match="numeric, math, choice"):
        majority_vote("code", ["x"])


@pytest.mark.parametrize(
    ("kind", "responses", "expected"),
    [
        ("numeric", ["The answer is 72.", "#### 72.0", "answer: 70", "70", "72.00"], "72"),
        ("numeric", ["5", "6", "6", "5"], "5"),  # tie: first seen wins
        ("numeric", ["no idea", "none", "5"], "5"),  # None answers do not vote
        ("numeric", ["no idea", "none"], None),
        ("math", [r"\boxed{1}", r"\boxed{\frac12}", r"\boxed{0.5}", r"\boxed{\tfrac12}"], "0.5"),
        ("math", [r"\boxed{x = 3}", r"\boxed{3}", r"\boxed{4}"], "3"),
        ("choice", ["Answer: C", "The answer is (B)", "\\boxed{B}", "C"], "C"),  # tie: C first
        ("choice", ["The answer is (B)", "Answer: C", "\\boxed{B}", "C"], "B"),
        ("choice", [], None),
    ],
)
def test_majority_vote(kind, responses, expected):
    assert majority_vote(kind, responses) == expected


def test_canonical_answer_groups_equivalent_forms():
    assert canonical_answer("numeric", "$1,000") == canonical_answer("numeric", "1000.0") == "1000"
    third = canonical_answer("math", r"\boxed{\frac13}")
    assert third == canonical_answer("math", r"\boxed{\dfrac{1}{3}}")
    assert third != canonical_answer("math", r"\boxed{\frac12}")
    assert canonical_answer("choice", "**Answer:** (C)") == "C"


def test_pathological_answer_times_out_on_main_thread():
    assert math_equal(r"\sqrt{8}", r"2\sqrt{2}")  # warm math-verify: its import is not limited
    outer_fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: outer_fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, 30.0)  # a caller's own timer must survive the call
    try:
        start = time.monotonic()
        assert math_equal(TOWER, "5", timeout=1.0) is False
        elapsed = time.monotonic() - start
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        handler = signal.getsignal(signal.SIGALRM)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        restored = signal.signal(signal.SIGALRM, previous)
    assert elapsed < 2.0, f"time limit not enforced: {elapsed:.1f}s"
    assert 25.0 < remaining <= 30.0 and handler is restored and not outer_fired


def test_alarm_survives_code_that_swallows_it():
    def swallow_once_then_spin() -> bool:
        try:
            time.sleep(5)
        except BaseException:  # noqa: BLE001 - what careless library code does
            pass
        while True:
            time.sleep(0.01)

    start = time.monotonic()
    assert grading._run_with_alarm(swallow_once_then_spin, (), 0.3) is False
    assert time.monotonic() - start < 1.5


def test_time_limit_off_the_main_thread():
    results: dict[str, object] = {}

    def worker() -> None:
        results["equal"] = math_equal(r"\frac{\sqrt{3}}{3}", r"\frac{1}{\sqrt{3}}")  # starts helper
        results["unequal"] = math_equal(r"\sqrt{3}", r"\sqrt{5}")
        start = time.monotonic()
        results["tower"] = math_equal(r"9^{9^{9^{9}}}", "7", timeout=1.0)
        results["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert results["equal"] is True and results["unequal"] is False  # real answers, not just False
    assert results["tower"] is False
    assert results["elapsed"] < 3.0, f"time limit not enforced: {results['elapsed']:.1f}s"

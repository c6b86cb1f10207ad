"""The templates of the ``pyfuncs`` family: one Python function each, with parameters.

A template turns a parameter point (integers only; string constants are
looked up in tables by index, so that every point orders and prints plainly)
into a function's description, a reference body, a plausible wrong body (an
off-by-one, a flipped comparison, a forgotten case: what a small model writes
when it almost has it, and the bug a ``fix`` task shows) and the inputs it is
called on. Expected outputs are never written here: :mod:`polar.tasks.pyfuncs.family`
computes them by running the reference body.

Which points are held out is part of each template (:class:`HeldOut`): a
threshold on one parameter, or the whole template.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

Params = Mapping[str, int]
Args = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class HeldOut:
    """Which parameter points of a template are held out of training.

    With ``key``: the points whose ``key`` parameter is at least ``start``
    (a range of that parameter never trained on); without: every point (a
    template never trained on).
    """

    key: str | None = None
    start: int = 0

    def holds(self, params: Params) -> bool:
        return self.key is None or params[self.key] >= self.start


HELD_OUT_TEMPLATE = HeldOut()


@dataclass(frozen=True, slots=True)
class Template:
    name: str
    """Part of every task id: ``pyfuncs/<name>/...``."""
    args: str
    """The function's parameter list, as written in its ``def``."""
    names: tuple[str, ...]
    """Function names a task picks from (seeded): following the name asked for
    is part of the skill."""
    describe: Callable[[Params], str]
    """What the function does, a clause starting with a verb ("returns ...")."""
    body: Callable[[Params], str]
    """The reference body (unindented statements)."""
    wrong: Callable[[Params], str]
    """A plausible wrong body: it must fail at least one of the task's inputs."""
    inputs: Callable[[Random, Params], Sequence[Args]]
    """Candidate argument tuples (edge cases first); duplicates are dropped."""
    grid: tuple[Params, ...]
    heldout: HeldOut
    fixable: bool = False
    """Also a ``fix`` task per point: the wrong body is in ``solution.py`` and shown."""


def grid(**ranges: Sequence[int]) -> tuple[Params, ...]:
    """Every combination of the given parameter values, in order."""
    keys = list(ranges)
    return tuple(
        dict(zip(keys, values, strict=True)) for values in itertools.product(*ranges.values())
    )


# ---------------------------------------------------------------- inputs


def ints(rng: Random, lo: int = -40, hi: int = 40, edges: Sequence[int] = (0, 1, -1)) -> list[Args]:
    drawn = rng.sample(range(lo, hi + 1), min(14, hi + 1 - lo))
    return [(value,) for value in (*edges, *drawn)]


def int_lists(rng: Random, lo: int = -9, hi: int = 20, edges: Sequence[Any] = ()) -> list[Args]:
    random_lists = [[rng.randint(lo, hi) for _ in range(rng.randint(1, 8))] for _ in range(14)]
    return [(list(xs),) for xs in ([], *edges, *random_lists)]


WORDS = (
    "apple", "Banana", "cherry pie", "Hello World", "a", "xyz", "Mississippi", "level",
    "data science", "Queue", "OpenAI", "moon light", "I am here", "Polar bear", "rhythm",
    "EXAMPLE TEXT", "tea time", "ab cd ef", "Zebra crossing", "Python code",
)  # fmt: skip


def texts(rng: Random, edges: Sequence[str] = ("",)) -> list[Args]:
    letters = string.ascii_lowercase + "    "
    made_up = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 12))) for _ in range(4)]
    picked = rng.sample(WORDS, 10)
    return [(text,) for text in (*edges, *picked, *made_up)]


# ---------------------------------------------------------------- tables

WRAPPERS = (
    ("<", ">"), ("[", "]"), ("(", ")"), ("{", "}"), ("<<", ">>"),
    ("[[", "]]"), ("/*", "*/"), ("<!--", "-->"), ("#", ";"), ("(", "]"),
)  # fmt: skip
SEPARATORS = (", ", "-", " ", "|", "+", "/")
LETTERS = "aeinorstlm"
MARKS = ("*", "_", "#", "?", "-", ".", "!", "0")
OPERATIONS = (("+", "with {k} added to each item"), ("*", "with each item multiplied by {k}"),
              ("-", "with {k} subtracted from each item"))  # fmt: skip
RUNNING = (("sum", "total"), ("max", "largest item"), ("min", "smallest item"))
SUFFIXES = ("!", "ing", " world", "?", ".txt", "_1", "s", "-end")


# ---------------------------------------------------------------- templates


def _letter_texts(rng: Random, params: Params) -> list[Args]:
    letter = LETTERS[params["c"]]
    pool = letter + letter.upper() + "xyz bq"
    mixed = ["".join(rng.choice(pool) for _ in range(rng.randint(2, 10))) for _ in range(8)]
    return [("",), (letter.upper() * 2,), *texts(rng, edges=()), *((text,) for text in mixed)]


def _numbered_texts(rng: Random, params: Params) -> list[Args]:
    return [("",), *texts(rng, edges=("ab",)), (string.ascii_lowercase[: params["n"] + 2],)]


def _sentences(rng: Random, params: Params) -> list[Args]:
    words = ["a", "an", "the", "tree", "house", "river", "mountains", "elephant", "sky", "in"]
    words += ["a" * params["k"], "b" * (params["k"] + 1)]
    made = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(12)]
    return [("",), *((text,) for text in made)]


TEMPLATES: tuple[Template, ...] = (
    Template(
        name="add",
        args="x",
        names=("add", "increase", "plus", "bump"),
        describe=lambda p: f"returns x plus {p['k']}",
        body=lambda p: f"return x + {p['k']}",
        wrong=lambda p: f"return x + {p['k'] - 1}",
        inputs=lambda rng, p: ints(rng),
        grid=grid(k=range(1, 21)),
        heldout=HeldOut("k", 16),
    ),
    Template(
        name="greater-than",
        args="x",
        names=("greater_than", "is_big", "above_limit", "exceeds"),
        describe=lambda p: f"returns True if x is greater than {p['k']}, else False",
        body=lambda p: f"return x > {p['k']}",
        wrong=lambda p: f"return x >= {p['k']}",
        inputs=lambda rng, p: ints(rng, lo=-5, hi=20, edges=(p["k"], p["k"] + 1)),
        grid=grid(k=range(10)),
        heldout=HeldOut("k", 8),
        fixable=True,
    ),
    Template(
        name="add-suffix",
        args="s",
        names=("add_suffix", "append", "extend_text", "finish"),
        describe=lambda p: f"returns s followed by {SUFFIXES[p['w']]!r}",
        body=lambda p: f"return s + {SUFFIXES[p['w']]!r}",
        wrong=lambda p: f"return {SUFFIXES[p['w']]!r} + s",
        inputs=lambda rng, p: texts(rng),
        grid=grid(w=range(len(SUFFIXES))),
        heldout=HeldOut("w", 6),
    ),
    Template(
        name="first-items",
        args="xs",
        names=("first_items", "head", "take", "leading"),
        describe=lambda p: (
            f"returns a list of the first {p['k']} items of xs (all of them if xs is shorter)"
        ),
        body=lambda p: f"return xs[:{p['k']}]",
        wrong=lambda p: f"return xs[:{p['k'] - 1}]",
        inputs=lambda rng, p: int_lists(rng, edges=(list(range(p["k"] + 2)),)),
        grid=grid(k=range(1, 9)),
        heldout=HeldOut("k", 7),
        fixable=True,
    ),
    Template(
        name="max-plus",
        args="xs",
        names=("max_plus", "top_bonus", "best_plus"),
        describe=lambda p: f"returns the largest item of xs plus {p['k']} (xs is never empty)",
        body=lambda p: f"return max(xs) + {p['k']}",
        wrong=lambda p: f"return xs[-1] + {p['k']}",
        inputs=lambda rng, p: [args for args in int_lists(rng, edges=([5, 1],)) if args[0]],
        grid=grid(k=range(1, 11)),
        heldout=HeldOut("k", 8),
    ),
    Template(
        name="affine",
        args="x",
        names=("scale_and_shift", "affine", "next_value", "apply_rule", "transform"),
        describe=lambda p: f"returns x multiplied by {p['a']}, plus {p['b']}",
        body=lambda p: f"return {p['a']} * x + {p['b']}",
        wrong=lambda p: f"return {p['a']} * (x + {p['b']})",
        inputs=lambda rng, p: ints(rng),
        grid=grid(a=range(2, 10), b=(1, 4, 7)),
        heldout=HeldOut("a", 7),
    ),
    Template(
        name="clamp",
        args="x",
        names=("clamp", "clip", "limit", "bound", "keep_in_range"),
        describe=lambda p: (
            f"returns x limited to the range {p['lo']} to {p['lo'] + p['w']}: "
            f"{p['lo']} if x is smaller, {p['lo'] + p['w']} if x is larger, else x"
        ),
        body=lambda p: f"return max({p['lo']}, min({p['lo'] + p['w']}, x))",
        wrong=lambda p: f"return max({p['lo']}, x)",
        inputs=lambda rng, p: ints(rng, edges=(p["lo"], p["lo"] + p["w"], p["lo"] + p["w"] + 5)),
        grid=grid(lo=(-10, -5, 0, 5, 10, 15), w=(5, 10)),
        heldout=HeldOut("lo", 10),
        fixable=True,
    ),
    Template(
        name="round-down",
        args="x",
        names=("round_down", "floor_to_multiple", "snap_down", "lower_multiple"),
        describe=lambda p: f"returns the largest multiple of {p['k']} that is not greater than x",
        body=lambda p: f"return x - x % {p['k']}",
        wrong=lambda p: f"return int(x / {p['k']}) * {p['k']}",
        inputs=lambda rng, p: ints(rng, edges=(0, p["k"], -1, -p["k"] - 1)),
        grid=grid(k=range(2, 13)),
        heldout=HeldOut("k", 9),
        fixable=True,
    ),
    Template(
        name="divisible-either",
        args="x",
        names=("is_special", "divisible_either", "check_number", "is_lucky"),
        describe=lambda p: (
            f"returns True if x is divisible by {p['a']} or by {p['b']} (or both), else False"
        ),
        body=lambda p: f"return x % {p['a']} == 0 or x % {p['b']} == 0",
        wrong=lambda p: f"return x % {p['a']} == 0 and x % {p['b']} == 0",
        inputs=lambda rng, p: ints(rng, lo=1, hi=90, edges=(p["a"], p["b"], p["a"] * p["b"], 1)),
        grid=grid(a=(2, 3, 4), b=range(5, 10)),
        heldout=HeldOut("b", 8),
        fixable=True,
    ),
    Template(
        name="sum-powers",
        args="n",
        names=("sum_powers", "power_sum", "series_total"),
        describe=lambda p: f"returns 1**{p['p']} + 2**{p['p']} + ... + n**{p['p']} (0 when n is 0)",
        body=lambda p: f"return sum(i ** {p['p']} for i in range(1, n + 1))",
        wrong=lambda p: f"return sum(i ** {p['p']} for i in range(n))",
        inputs=lambda rng, p: ints(rng, lo=2, hi=15, edges=(0, 1)),
        grid=grid(p=range(1, 5)),
        heldout=HeldOut("p", 4),
    ),
    Template(
        name="wrap",
        args="s",
        names=("wrap", "surround", "enclose", "decorate"),
        describe=lambda p: (
            f"returns s with {WRAPPERS[p['w']][0]!r} added before it "
            f"and {WRAPPERS[p['w']][1]!r} after it"
        ),
        body=lambda p: f"return {WRAPPERS[p['w']][0]!r} + s + {WRAPPERS[p['w']][1]!r}",
        wrong=lambda p: f"return {WRAPPERS[p['w']][1]!r} + s + {WRAPPERS[p['w']][0]!r}",
        inputs=lambda rng, p: texts(rng),
        grid=grid(w=range(len(WRAPPERS))),
        heldout=HeldOut("w", 7),
    ),
    Template(
        name="repeat-join",
        args="s",
        names=("repeat", "echo", "repeat_text", "copies"),
        describe=lambda p: (
            f"returns {p['k']} copies of s joined with {SEPARATORS[p['sep']]!r} between them"
        ),
        body=lambda p: f"return {SEPARATORS[p['sep']]!r}.join([s] * {p['k']})",
        wrong=lambda p: f"return (s + {SEPARATORS[p['sep']]!r}) * {p['k']}",
        inputs=lambda rng, p: texts(rng),
        grid=grid(k=range(2, 6), sep=range(len(SEPARATORS))),
        heldout=HeldOut("k", 5),
    ),
    Template(
        name="count-letter",
        args="s",
        names=("count_letter", "letter_count", "how_many", "tally"),
        describe=lambda p: (
            f"returns how many times the letter {LETTERS[p['c']]!r} appears in s, "
            "counting lowercase and uppercase"
        ),
        body=lambda p: f"return s.lower().count({LETTERS[p['c']]!r})",
        wrong=lambda p: f"return s.count({LETTERS[p['c']]!r})",
        inputs=_letter_texts,
        grid=grid(c=range(len(LETTERS))),
        heldout=HeldOut("c", 7),
        fixable=True,
    ),
    Template(
        name="mask-vowels",
        args="s",
        names=("mask_vowels", "hide_vowels", "censor", "replace_vowels"),
        describe=lambda p: (
            f"returns s with every vowel (a, e, i, o, u, lowercase or uppercase) "
            f"replaced by {MARKS[p['m']]!r}"
        ),
        body=lambda p: f'return "".join({MARKS[p["m"]]!r} if c in "aeiouAEIOU" else c for c in s)',
        wrong=lambda p: f'return "".join({MARKS[p["m"]]!r} if c in "aeiou" else c for c in s)',
        inputs=lambda rng, p: texts(rng, edges=("", "AEIOU")),
        grid=grid(m=range(len(MARKS))),
        heldout=HeldOut("m", 6),
    ),
    Template(
        name="every-kth",
        args="s",
        names=("every_kth", "sample_chars", "skip_chars", "stride"),
        describe=lambda p: (
            f"returns every {p['k']}th character of s, starting with the first one "
            f"(the characters at positions 0, {p['k']}, {2 * p['k']}, ...)"
        ),
        body=lambda p: f"return s[::{p['k']}]",
        wrong=lambda p: f"return s[{p['k']}::{p['k']}]",
        inputs=lambda rng, p: texts(rng, edges=("", "abcdefghijklmnop")),
        grid=grid(k=range(2, 8)),
        heldout=HeldOut("k", 6),
        fixable=True,
    ),
    Template(
        name="truncate",
        args="s",
        names=("truncate", "shorten", "abbreviate", "cut"),
        describe=lambda p: (
            f"returns s unchanged if it has at most {p['n']} characters, "
            f'else its first {p["n"]} characters followed by "..."'
        ),
        body=lambda p: f'if len(s) <= {p["n"]}:\n    return s\nreturn s[:{p["n"]}] + "..."',
        wrong=lambda p: f'return s[:{p["n"]}] + "..."',
        inputs=_numbered_texts,
        grid=grid(n=range(3, 11)),
        heldout=HeldOut("n", 9),
        fixable=True,
    ),
    Template(
        name="keep-greater",
        args="xs",
        names=("keep_greater", "above", "filter_big", "select_large"),
        describe=lambda p: (
            f"returns a list of the items of xs that are greater than {p['k']}, in their order"
        ),
        body=lambda p: f"return [x for x in xs if x > {p['k']}]",
        wrong=lambda p: f"return [x for x in xs if x >= {p['k']}]",
        inputs=lambda rng, p: int_lists(rng, edges=([p["k"]], [p["k"], p["k"] + 1])),
        grid=grid(k=range(12)),
        heldout=HeldOut("k", 9),
        fixable=True,
    ),
    Template(
        name="map-items",
        args="xs",
        names=("update_all", "map_items", "adjust", "each"),
        describe=lambda p: (
            f"returns a new list of the items of xs {OPERATIONS[p['op']][1].format(k=p['k'])}"
        ),
        body=lambda p: f"return [x {OPERATIONS[p['op']][0]} {p['k']} for x in xs]",
        wrong=lambda p: f"return [x {OPERATIONS[p['op']][0]} {p['k']} for x in xs[:-1]]",
        inputs=lambda rng, p: int_lists(rng),
        grid=grid(op=range(len(OPERATIONS)), k=range(2, 8)),
        heldout=HeldOut("k", 6),
    ),
    Template(
        name="sum-multiples",
        args="xs",
        names=("sum_multiples", "total_divisible", "add_matching"),
        describe=lambda p: f"returns the sum of the items of xs that are divisible by {p['k']}",
        body=lambda p: f"return sum(x for x in xs if x % {p['k']} == 0)",
        wrong=lambda p: f"return len([x for x in xs if x % {p['k']} == 0])",
        inputs=lambda rng, p: int_lists(rng, edges=([p["k"], 2 * p["k"]],)),
        grid=grid(k=range(2, 10)),
        heldout=HeldOut("k", 8),
        fixable=True,
    ),
    Template(
        name="chunk",
        args="xs",
        names=("chunk", "batches", "split_into_groups", "groups_of"),
        describe=lambda p: (
            f"splits xs into consecutive lists of {p['k']} items (the last one may be shorter) "
            "and returns the list of them"
        ),
        body=lambda p: f"return [xs[i:i + {p['k']}] for i in range(0, len(xs), {p['k']})]",
        wrong=lambda p: (
            f"return [xs[i:i + {p['k']}] for i in range(0, len(xs) - {p['k']} + 1, {p['k']})]"
        ),
        inputs=lambda rng, p: int_lists(rng, edges=(list(range(p["k"] + 1)),)),
        grid=grid(k=range(2, 7)),
        heldout=HeldOut("k", 5),
        fixable=True,
    ),
    Template(
        name="rotate-left",
        args="xs",
        names=("rotate_left", "rotate", "shift_items", "cycle"),
        describe=lambda p: (
            f"returns xs rotated left by {p['k']} places (the first items move to the end; "
            f"rotate by {p['k']} modulo the length, and an empty list stays empty)"
        ),
        body=lambda p: f"if not xs:\n    return []\nk = {p['k']} % len(xs)\nreturn xs[k:] + xs[:k]",
        wrong=lambda p: f"return xs[{p['k']}:] + xs[:{p['k']}]",
        inputs=lambda rng, p: int_lists(rng, edges=([1, 2], [4, 5, 6], list(range(p["k"] + 3)))),
        grid=grid(k=range(3, 9)),
        heldout=HeldOut("k", 7),
        fixable=True,
    ),
    Template(
        name="top-sum",
        args="xs",
        names=("top_sum", "sum_largest", "best_total"),
        describe=lambda p: (
            f"returns the sum of the {p['k']} largest items of xs (of all items if xs has "
            f"fewer than {p['k']})"
        ),
        body=lambda p: f"return sum(sorted(xs)[-{p['k']}:])",
        wrong=lambda p: f"return sum(sorted(xs)[:{p['k']}])",
        inputs=lambda rng, p: int_lists(rng, edges=(list(range(p["k"] + 3)),)),
        grid=grid(k=range(1, 7)),
        heldout=HeldOut("k", 5),
        fixable=True,
    ),
    # Templates never trained on.
    Template(
        name="count-greater",
        args="xs",
        names=("count_greater", "how_many_above", "count_big"),
        describe=lambda p: f"returns how many items of xs are greater than {p['k']}",
        body=lambda p: f"return len([x for x in xs if x > {p['k']}])",
        wrong=lambda p: f"return len([x for x in xs if x >= {p['k']}])",
        inputs=lambda rng, p: int_lists(rng, edges=([p["k"]], [p["k"], p["k"] + 1])),
        grid=grid(k=range(6)),
        heldout=HELD_OUT_TEMPLATE,
    ),
    Template(
        name="running",
        args="xs",
        names=("running", "prefix_values", "so_far"),
        describe=lambda p: (
            f"returns a list whose item i is the {RUNNING[p['op']][1]} of xs[0] to xs[i] "
            "(the empty list for an empty xs)"
        ),
        body=lambda p: (
            f"out = []\nfor i in range(len(xs)):\n    out.append({RUNNING[p['op']][0]}(xs[:i + 1]))"
            "\nreturn out"
        ),
        wrong=lambda p: (
            f"return [{RUNNING[p['op']][0]}(xs[:i]) for i in range(1, len(xs))] if xs else []"
        ),
        inputs=lambda rng, p: int_lists(rng, edges=([3],)),
        grid=grid(op=range(len(RUNNING))),
        heldout=HELD_OUT_TEMPLATE,
    ),
    Template(
        name="count-long-words",
        args="s",
        names=("count_long_words", "long_words", "big_word_count"),
        describe=lambda p: (
            f"returns how many words of s (separated by spaces) have more than {p['k']} letters"
        ),
        body=lambda p: f"return len([w for w in s.split() if len(w) > {p['k']}])",
        wrong=lambda p: f"return len([w for w in s.split() if len(w) >= {p['k']}])",
        inputs=_sentences,
        grid=grid(k=range(2, 8)),
        heldout=HELD_OUT_TEMPLATE,
    ),
    Template(
        name="shift-letters",
        args="s",
        names=("shift_letters", "caesar", "encode"),
        describe=lambda p: (
            f"returns s with each lowercase letter moved {p['k']} places forward in the alphabet, "
            "wrapping around from z to a; other characters stay as they are"
        ),
        body=lambda p: (
            'return "".join(\n'
            f"    chr((ord(c) - 97 + {p['k']}) % 26 + 97) if 'a' <= c <= 'z' else c for c in s\n"
            ")"
        ),
        wrong=lambda p: f'return "".join(chr(ord(c) + {p["k"]}) if c.isalpha() else c for c in s)',
        inputs=lambda rng, p: texts(rng, edges=("", "xyz", "Hi there!")),
        grid=grid(k=range(1, 6)),
        heldout=HELD_OUT_TEMPLATE,
    ),
)
"""Every template, train-side ones first."""

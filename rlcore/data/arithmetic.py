"""``rlcore data arithmetic``: a synthetic, offline arithmetic task in verl's schema, seeded and sized.

Difficulty is set by the number of operands, their range and the operators; a small model learns the
default (two single-digit numbers added) within minutes. Rows carry data_source "rlcore/arithmetic",
whose reward pays the right final number wherever it stands (see ``rlcore.rewards.arithmetic``);
``--unformatted-score`` is stored in each row's extra_info and sets what a right answer without the
``#### n`` form earns.
"""

from __future__ import annotations

import argparse
import os
import random
from pathlib import Path

import attrs

from rlcore.cli import Command
from rlcore.data.files import write_train_and_test
from rlcore.errors import RlcoreError
from rlcore.rewards.arithmetic import DATA_SOURCE, DEFAULT_UNFORMATTED_SCORE

OPERATORS = "+-*"
# Short answers keep generation cheap on a CPU; `--instruction` gives GSM8K's step-by-step one instead.
INSTRUCTION = 'Give only the final answer after "####".'


@attrs.frozen
class ArithmeticTask:
    """How problems are drawn."""

    num_operands: int = 2
    min_operand: int = 0
    max_operand: int = 9
    operators: str = "+"
    instruction: str = INSTRUCTION
    unformatted_score: float = DEFAULT_UNFORMATTED_SCORE

    def check(self) -> None:
        if self.num_operands < 2:
            raise RlcoreError(f"--num-operands must be at least 2, got {self.num_operands}")
        if self.min_operand > self.max_operand:
            raise RlcoreError(f"--min-operand {self.min_operand} is above --max-operand {self.max_operand}")
        unknown = sorted(set(self.operators) - set(OPERATORS))
        if not self.operators or unknown:
            raise RlcoreError(f"--operators takes characters from {OPERATORS!r}, got {self.operators!r}")
        if not 0.0 <= self.unformatted_score <= 1.0:
            raise RlcoreError(f"--unformatted-score must be within [0, 1], got {self.unformatted_score}")


def evaluate(operands: list[int], operators: list[str]) -> int:
    """The value with the usual precedence: products first, then sums and differences left to right."""
    terms, signs = [operands[0]], []
    for operator, operand in zip(operators, operands[1:]):
        if operator == "*":
            terms[-1] *= operand
        else:
            terms.append(operand)
            signs.append(operator)
    value = terms[0]
    for sign, term in zip(signs, terms[1:]):
        value = value + term if sign == "+" else value - term
    return value


def problem(rng: random.Random, task: ArithmeticTask) -> tuple[str, int]:
    """(expression, value), e.g. ("3 + 4", 7); negative operands are shown in parentheses."""
    operands = [rng.randint(task.min_operand, task.max_operand) for _ in range(task.num_operands)]
    operators = [rng.choice(task.operators) for _ in range(task.num_operands - 1)]
    shown = [f"({n})" if n < 0 else str(n) for n in operands]
    expression = shown[0] + "".join(f" {op} {n}" for op, n in zip(operators, shown[1:]))
    return expression, evaluate(operands, operators)


def generate(task: ArithmeticTask, split: str, size: int, seed: int) -> list[dict]:
    """``size`` verl-schema rows; the same (task, split, size, seed) always gives the same rows."""
    task.check()
    rng = random.Random(f"rlcore-arithmetic-{seed}-{split}")  # each split its own stream
    rows = []
    for index in range(size):
        expression, value = problem(rng, task)
        question = f"What is {expression}?"
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{question} {task.instruction}".strip()}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(value)},
            "extra_info": {"split": split, "index": index, "answer": f"{expression} = {value}\n#### {value}",
                           "question": question, "unformatted_score": float(task.unformatted_score)},
        })
    return rows


def write(local_save_dir: str | os.PathLike, task: ArithmeticTask, train_size: int, test_size: int,
          seed: int) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet``; returns the paths by split."""
    return write_train_and_test(local_save_dir, lambda split, size: generate(task, split, size, seed), train_size,
                                test_size)


def _configure(parser: argparse.ArgumentParser) -> None:
    default = ArithmeticTask()
    parser.add_argument("--local-save-dir", "--local_save_dir", default="~/data/arithmetic", metavar="DIR",
                        help="folder to write train.parquet and test.parquet into (default: ~/data/arithmetic)")
    parser.add_argument("--train-size", type=int, metavar="N", default=1000, help="training problems (default: 1000)")
    parser.add_argument("--test-size", type=int, metavar="N", default=100, help="test problems (default: 100)")
    parser.add_argument("--seed", type=int, metavar="N", default=0, help="random seed (default: 0)")
    parser.add_argument("--num-operands", type=int, metavar="N", default=default.num_operands,
                        help=f"numbers per problem (default: {default.num_operands})")
    parser.add_argument("--min-operand", type=int, metavar="N", default=default.min_operand,
                        help=f"smallest number (default: {default.min_operand})")
    parser.add_argument("--max-operand", type=int, metavar="N", default=default.max_operand,
                        help=f"largest number (default: {default.max_operand})")
    parser.add_argument("--operators", default=default.operators,
                        help=f"operators to draw from, any of {OPERATORS!r} (default: {default.operators!r})")
    parser.add_argument("--instruction", default=default.instruction,
                        help=f"text appended to each question (default: {INSTRUCTION!r})")
    parser.add_argument("--unformatted-score", type=float, metavar="X", default=default.unformatted_score,
                        help="score of a right final number without '#### n' "
                             f"(right with it: 1.0; default: {default.unformatted_score})")


def _run(args: argparse.Namespace) -> int:
    task = ArithmeticTask(num_operands=args.num_operands, min_operand=args.min_operand,
                          max_operand=args.max_operand, operators=args.operators,
                          instruction=args.instruction, unformatted_score=args.unformatted_score)
    sizes = {"train": args.train_size, "test": args.test_size}
    for split, path in write(args.local_save_dir, task, args.train_size, args.test_size, args.seed).items():
        print(f"wrote {sizes[split]} {split} rows to {path}")
    return 0


COMMAND = Command(help="a synthetic arithmetic task (rlcore/arithmetic), offline, seeded, sized",
                  configure=_configure, run=_run)

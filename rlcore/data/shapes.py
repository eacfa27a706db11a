"""``rlcore data shapes``: a synthetic vision task in verl's multimodal schema, drawn with Pillow, seeded.

Each image shows a few filled circles, squares and triangles in distinct cells of a grid on a white
canvas (so shapes never touch), and the question asks for a count ("How many triangles are in the
image?", "How many shapes ...?") or for the most numerous kind (drawn only when one kind leads).
Answers are checked by rule under data_source "rlcore/shapes" (``rlcore.rewards.shapes``); each row's
prompt holds one ``<image>`` and its ``images`` column the PNG. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import os
import random
from collections import Counter
from pathlib import Path

import attrs

from rlcore.cli import Command
from rlcore.data.files import write_train_and_test
from rlcore.data.images import PLACEHOLDER, encode_png, image_column_type, pillow
from rlcore.errors import RlcoreError
from rlcore.rewards.shapes import DATA_SOURCE, DEFAULT_UNFORMATTED_SCORE, SHAPES

INSTRUCTION = "Put the final answer in \\boxed{}."
QUESTIONS = ("count", "count_all", "most")
COLOURS = {"red": (220, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 220), "orange": (240, 150, 30),
           "purple": (140, 60, 180)}
GRID = 3  # cells per side: at most GRID * GRID shapes


@attrs.frozen
class ShapesTask:
    """How images and questions are drawn."""

    image_size: int = 224
    min_shapes: int = 1
    max_shapes: int = 6
    questions: tuple[str, ...] = QUESTIONS
    instruction: str = INSTRUCTION
    unformatted_score: float = DEFAULT_UNFORMATTED_SCORE

    def check(self) -> None:
        if not 1 <= self.min_shapes <= self.max_shapes <= GRID * GRID:
            raise RlcoreError(f"--min-shapes and --max-shapes must satisfy 1 <= min <= max <= {GRID * GRID}, got "
                              f"{self.min_shapes} and {self.max_shapes}")
        if self.image_size < 8 * GRID:
            raise RlcoreError(f"--image-size must be at least {8 * GRID} pixels, got {self.image_size}")
        unknown = [q for q in self.questions if q not in QUESTIONS]
        if not self.questions or unknown:
            raise RlcoreError(f"--questions takes some of {', '.join(QUESTIONS)}, got {', '.join(self.questions)}")
        if not 0.0 <= self.unformatted_score <= 1.0:
            raise RlcoreError(f"--unformatted-score must be within [0, 1], got {self.unformatted_score}")


def draw(rng: random.Random, task: ShapesTask):
    """(image, shapes): a PIL image and its shapes as (kind, colour) pairs."""
    pillow()  # says how to install it when it is missing
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (task.image_size, task.image_size), "white")
    pen = ImageDraw.Draw(image)
    cell = task.image_size // GRID
    shapes = []
    for place in rng.sample(range(GRID * GRID), rng.randint(task.min_shapes, task.max_shapes)):
        kind, colour = rng.choice(SHAPES), rng.choice(sorted(COLOURS))
        size = rng.randint(cell // 2, cell - 4)  # inside its cell with a margin: shapes never touch
        left = (place % GRID) * cell + rng.randint(2, cell - size - 2)
        top = (place // GRID) * cell + rng.randint(2, cell - size - 2)
        box = (left, top, left + size - 1, top + size - 1)
        if kind == "circle":
            pen.ellipse(box, fill=COLOURS[colour])
        elif kind == "square":
            pen.rectangle(box, fill=COLOURS[colour])
        else:
            pen.polygon([(left + size // 2, top), (left, top + size - 1), (left + size - 1, top + size - 1)],
                        fill=COLOURS[colour])
        shapes.append((kind, colour))
    return image, shapes


def question(rng: random.Random, task: ShapesTask, shapes: list[tuple[str, str]]) -> tuple[str, str, str]:
    """(kind of question, question, answer) about ``shapes``."""
    counts = Counter(kind for kind, _ in shapes)
    leaders = [kind for kind in SHAPES if counts[kind] == max(counts.values())]
    kinds = [q for q in task.questions if q != "most" or len(leaders) == 1]
    asked = rng.choice(kinds or ["count_all"])
    if asked == "most":
        return asked, "Which kind of shape appears most often in the image: circle, square or triangle?", leaders[0]
    if asked == "count_all":
        return asked, "How many shapes are in the image?", str(len(shapes))
    kind = rng.choice(SHAPES)
    return asked, f"How many {kind}s are in the image?", str(counts[kind])


def generate(task: ShapesTask, split: str, size: int, seed: int) -> list[dict]:
    """``size`` rows in verl's multimodal schema; the same (task, split, size, seed) gives the same rows."""
    task.check()
    rng = random.Random(f"rlcore-shapes-{seed}-{split}")  # each split its own stream
    rows = []
    for index in range(size):
        image, shapes = draw(rng, task)
        asked, text, answer = question(rng, task, shapes)
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{PLACEHOLDER}{text} {task.instruction}".strip()}],
            "images": [encode_png(image)],
            "ability": "visual_reasoning",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "question": text, "answer": answer, "kind": asked,
                           "shapes": [f"{colour} {kind}" for kind, colour in shapes],
                           "unformatted_score": float(task.unformatted_score)},
        })
    return rows


def write(local_save_dir: str | os.PathLike, task: ShapesTask, train_size: int, test_size: int,
          seed: int) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet``; returns the paths by split."""
    return write_train_and_test(local_save_dir, lambda split, size: generate(task, split, size, seed), train_size,
                                test_size, {"images": image_column_type()})


def _configure(parser: argparse.ArgumentParser) -> None:
    default = ShapesTask()
    parser.add_argument("--local-save-dir", "--local_save_dir", default="~/data/shapes", metavar="DIR",
                        help="folder to write train.parquet and test.parquet into (default: ~/data/shapes)")
    parser.add_argument("--train-size", type=int, metavar="N", default=1000, help="training rows (default: 1000)")
    parser.add_argument("--test-size", type=int, metavar="N", default=100, help="test rows (default: 100)")
    parser.add_argument("--seed", type=int, metavar="N", default=0, help="random seed (default: 0)")
    parser.add_argument("--image-size", type=int, metavar="PX", default=default.image_size,
                        help=f"width and height of each image in pixels (default: {default.image_size})")
    parser.add_argument("--min-shapes", type=int, metavar="N", default=default.min_shapes,
                        help=f"fewest shapes in an image (default: {default.min_shapes})")
    parser.add_argument("--max-shapes", type=int, metavar="N", default=default.max_shapes,
                        help=f"most shapes in an image, at most {GRID * GRID} (default: {default.max_shapes})")
    parser.add_argument("--questions", default=",".join(default.questions),
                        help=f"kinds of question to draw from, comma-separated (default: {','.join(QUESTIONS)})")
    parser.add_argument("--instruction", default=default.instruction,
                        help=f"text appended to each question (default: {INSTRUCTION!r})")
    parser.add_argument("--unformatted-score", type=float, metavar="X", default=default.unformatted_score,
                        help="score of a right answer outside \\boxed{} (right and boxed: 1.0; default: "
                             f"{default.unformatted_score})")


def _run(args: argparse.Namespace) -> int:
    task = ShapesTask(image_size=args.image_size, min_shapes=args.min_shapes, max_shapes=args.max_shapes,
                      questions=tuple(q.strip() for q in args.questions.split(",") if q.strip()),
                      instruction=args.instruction, unformatted_score=args.unformatted_score)
    sizes = {"train": args.train_size, "test": args.test_size}
    for split, path in write(args.local_save_dir, task, args.train_size, args.test_size, args.seed).items():
        print(f"wrote {sizes[split]} {split} rows to {path}")
    return 0


COMMAND = Command(help="a synthetic vision task (rlcore/shapes): count shapes drawn with Pillow, offline, seeded",
                  configure=_configure, run=_run)

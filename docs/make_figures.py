"""Makes the pictures of docs/observability.md from a real run of examples/digits.py.

    tmux new-session -d -s et -x 120 -y 24 "python examples/digits.py --tensorboard \\
        --storage-path /tmp/figs --name digits; sleep 60"
    # while it runs: tmux capture-pane -p -t et > /tmp/live.txt
    python docs/make_figures.py /tmp/live.txt /tmp/figs/digits

writes docs/live_view.png (the terminal as captured) and docs/tensorboard_curve.png
(the accuracy and loss scalars read back with TensorBoard's own EventAccumulator).
"""

from __future__ import annotations

import os
import sys

from PIL import Image, ImageDraw, ImageFont
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
HERE = os.path.dirname(os.path.abspath(__file__))


def terminal_png(text_path: str, out: str) -> None:
    lines = [line.rstrip() for line in open(text_path).read().splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    font = ImageFont.truetype(FONT, 14)
    width = max(len(line) for line in lines) * 9 + 20
    image = Image.new("RGB", (width, len(lines) * 18 + 20), (30, 30, 30))
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        color = (120, 200, 255) if line.startswith("[elastic-train]") else (220, 220, 220)
        draw.text((10, 10 + i * 18), line, font=font, fill=color)
    image.save(out)


def curve_png(run_dir: str, out: str) -> None:
    events = EventAccumulator(os.path.join(run_dir, "tensorboard"))
    events.Reload()
    font = ImageFont.truetype(FONT, 14)
    image = Image.new("RGB", (720, 360), "white")
    draw = ImageDraw.Draw(image)
    left, top, right, bottom = 60, 40, 700, 320
    draw.rectangle((left, top, right, bottom), outline="black")
    for tag, color in (("accuracy", (30, 120, 220)), ("loss", (220, 80, 40))):
        scalars = events.Scalars(tag)
        steps = [s.step for s in scalars]
        values = [s.value for s in scalars]
        high = max(values + [1.0])
        points = [(left + (right - left) * (x - steps[0]) / max(1, steps[-1] - steps[0]),
                   bottom - (bottom - top) * v / high) for x, v in zip(steps, values, strict=True)]
        draw.line(points, fill=color, width=3)
        draw.text((points[-1][0] - 90, points[-1][1] - 20), f"{tag} {values[-1]:.3f}",
                  font=font, fill=color)
    draw.text((left, 10), "digits example: TensorBoard scalars by training_iteration",
              font=font, fill="black")
    draw.text((left, bottom + 10), f"iteration 1 .. {steps[-1]}", font=font, fill="black")
    image.save(out)


if __name__ == "__main__":
    terminal_png(sys.argv[1], os.path.join(HERE, "live_view.png"))
    curve_png(sys.argv[2], os.path.join(HERE, "tensorboard_curve.png"))

"""What ``serve`` shows on its terminal: phase lines with elapsed time, and the demo banner."""

from __future__ import annotations

import sys
import time
from typing import TextIO

DEMO_BANNER = (
    "!" * 78 + "\n"
    "!!  DEMO MODEL: random weights. Answers are noise. {why}\n"
    "!!  Serve real weights with --model <HF id or directory>.\n" + "!" * 78
)


class Display:
    """Phase lines with elapsed time; one self-updating line on a terminal."""

    WIDTH = 150

    def __init__(self, t0: float, stream: TextIO | None = None) -> None:
        self.t0 = t0
        self.stream = stream or sys.stdout
        self.tty = self.stream.isatty()
        self.last = ""

    def show(self, state: str, detail: str, progress: float) -> None:
        elapsed = time.monotonic() - self.t0
        bar = "#" * int(progress * 20)
        line = f"[{elapsed:6.1f}s] {state:8} [{bar:<20}] {progress:4.0%}  {detail}"
        if self.tty:
            self.stream.write("\r" + line[: self.WIDTH].ljust(self.WIDTH))
            self.stream.flush()
        elif detail != self.last:
            print(line, file=self.stream, flush=True)
        self.last = detail

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()

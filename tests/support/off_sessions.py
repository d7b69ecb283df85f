"""An onnxruntime session whose first output is off in its last row: what a package check must refuse
(the tests that show a check can fail)."""

from __future__ import annotations

from typing import Any

import numpy as np


class OffSession:
    """``session`` whose first output's last row (along its first axis) is off by 1% and 0.01, past both
    the relative and the absolute tolerance of any check."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def run(self, names: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        out = list(self.session.run(names, feeds))
        out[0] = out[0].copy()
        out[0][-1] = out[0][-1] * 1.01 + 1e-2
        return out

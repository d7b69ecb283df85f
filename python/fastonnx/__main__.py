"""``python -m fastonnx``: the ``fastonnx`` command (fastonnx/pretrained/cli.py)."""

from fastonnx.pretrained.cli import main

raise SystemExit(main())

"""What an export tells about itself: the markdown report, verification against eager PyTorch (down to
the first diverging op), the tolerances and verdicts it uses, and the builder-state dumps of errors."""

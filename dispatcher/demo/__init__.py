"""``dispatcher demo``: the whole pipeline on a laptop, with live progress and a verdict."""

from dispatcher.demo.run import DemoResult, run_demo

__all__ = ["DemoResult", "run_demo"]

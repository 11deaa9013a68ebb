"""Only the build step that puts the top-level data and serve configs into the wheel.

Everything else is in pyproject.toml. `data/` and `serve_config*.yaml` stay at the top of the
repository (commands, tests and docs name them there); a wheel carries copies under
`wattwise/_resources/`, found by core.paths.shipped with importlib.resources. An editable
install reads the checkout and copies nothing.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = ("serve_config.yaml", "serve_config.cpu.yaml", "serve_config.gpu.yaml",
           "serve_config.splitwise.yaml", "data")  # = core.paths.SHIPPED


class BuildWithResources(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "wattwise" / "_resources"
        for name in SHIPPED:
            src = HERE / name
            if src.is_dir():
                shutil.copytree(src, target / name, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif src.is_file():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, target / name)


setup(cmdclass={"build_py": BuildWithResources})

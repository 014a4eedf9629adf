"""The one build step pyproject.toml cannot declare: ship prompts/**/*.md inside the wheel.

The prompt templates live at the top of the checkout (prompts/, beside personaemp/), where
a checkout reads them; an installed package reads them from personaemp/prompts/, so the
build copies them there. The sdist carries prompts/ (MANIFEST.in) for this step.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py


class BuildPyWithPrompts(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads prompts/ from the checkout
            return
        source = Path(__file__).parent / "prompts"
        target = Path(self.build_lib, "personaemp", "prompts")
        for template in sorted(source.rglob("*.md")):  # with prompts/compact/, the embedded model's
            copy = target / template.relative_to(source)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(template, copy)


setup(cmdclass={"build_py": BuildPyWithPrompts})

"""reflact's packages for setuptools; every other build setting is in pyproject.toml.

Every package under reflact/ is found, not listed, so a new sub-package is in the wheel without
anyone remembering to add it (tests/test_install.py compares the wheel with the source tree).
conf/, prompts/ and examples/demo/ stay at the top of the repository, where users and the README
point; the wheel carries them as the data of the sub-packages below (no __init__.py, never
imported: reflact/core/shipped.py finds them in the wheel's layout or in a checkout's).
"""

from setuptools import find_namespace_packages, setup

DATA_PACKAGES = {"reflact._conf": "conf", "reflact._prompts": "prompts", "reflact._demo": "examples/demo",
                 "reflact._pairs": "bench/data"}

# namespace discovery: a sub-package without an __init__.py is still a package of the wheel
CODE_PACKAGES = find_namespace_packages(include=["reflact", "reflact.*"], exclude=["*.__pycache__"])

setup(packages=[*CODE_PACKAGES, *DATA_PACKAGES], package_dir=DATA_PACKAGES)

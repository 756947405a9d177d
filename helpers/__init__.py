"""The workbook's helper package: the math, the launcher, the worker code, plots and checks.

Each module serves named sections of the two chapters (see its docstring). Import what you need,
e.g. ``from helpers.launcher import launch``; importing ``helpers`` itself is cheap.
"""
import os as _os

__version__ = "0.1.0"

# WORKBOOK_CHECK_FIGURES=1 (the suite sets it): in an IPython kernel, check every figure a cell
# displays and fail the cell on an unreadable one (helpers/readability.py). Costs nothing otherwise.
if _os.environ.get("WORKBOOK_CHECK_FIGURES") == "1":
    from helpers import readability as _readability

    _readability.install_if_asked()

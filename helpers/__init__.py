"""The workbook's helper package: the math, the launcher, the worker code, plots and checks.

Each module serves named sections of the two chapters (see its docstring). Import what you need,
e.g. ``from helpers.launcher import launch``; importing ``helpers`` itself is cheap.
"""
__version__ = "0.1.0"

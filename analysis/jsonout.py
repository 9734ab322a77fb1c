"""Plain JSON from analysis results: numpy and pandas scalars become Python numbers, NaN None."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd


def plain(obj, ndigits: int | None = None):
    """``obj`` with numpy/pandas scalars as Python values, NaN and pd.NA as None, tuples as
    lists, paths as strings; floats rounded to ``ndigits`` when given."""
    if isinstance(obj, dict):
        return {str(k): plain(v, ndigits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [plain(v, ndigits) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        if math.isnan(value) or math.isinf(value):
            return None
        return value if ndigits is None else round(value, ndigits)
    if obj is None or obj is pd.NA or obj is pd.NaT:
        return None
    return obj if isinstance(obj, str) else str(obj)


def dumps(obj, ndigits: int | None = None) -> str:
    """Strict JSON (no NaN) of ``plain(obj)``, indented."""
    return json.dumps(plain(obj, ndigits), indent=2, allow_nan=False)

"""Statistics, plots, reports and latency budgets over scenario results."""
